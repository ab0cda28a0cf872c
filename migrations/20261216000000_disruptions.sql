-- Disrupted attempts (docs/design.md §12): an attempt ended by an eviction, a drain, a preemption
-- or a lost node is not a failure of the work, and an order says whether it runs again after one.
--
-- The order's policy: 'never' (the default, so every order created before keeps failing as it
-- did) or 'safe' (run again at once, counted as a reclaim, only when the agent knows the
-- disrupted run stopped). The log keeps it so that a re-run copies it.
ALTER TABLE work_orders ADD COLUMN retry_on_disruption text NOT NULL DEFAULT 'never'
  CHECK (retry_on_disruption IN ('never', 'safe'));
ALTER TABLE work_order_log ADD COLUMN retry_on_disruption text NOT NULL DEFAULT 'never'
  CHECK (retry_on_disruption IN ('never', 'safe'));

-- A disrupted attempt after which the order ran again is an attempt row 'disrupted'.
ALTER TABLE work_order_attempts DROP CONSTRAINT work_order_attempts_ended_check;
ALTER TABLE work_order_attempts ADD CONSTRAINT work_order_attempts_ended_check
  CHECK (ended IN ('retry_scheduled', 'reclaimed', 'released', 'disrupted'));

-- The claim that finished the order was a disrupted attempt (the order failed: policy 'never',
-- the run may still go on, or the reclaims were used up). Read like 'agent' wherever a late
-- heartbeat or a repeated complete is answered: the holder itself reported it.
ALTER TABLE work_order_log DROP CONSTRAINT work_order_log_ended_by_check;
ALTER TABLE work_order_log ADD CONSTRAINT work_order_log_ended_by_check
  CHECK (ended_by IN ('agent', 'reaper', 'cancel', 'disruption'));
