-- requeue_disrupted: an attempt ended by a disruption that the order runs again after
-- (docs/design.md §12, queue::rules::decide_disruption: policy safe, the disrupted run known to
-- have stopped, reclaims left): the order becomes RETRY_PENDING due at once (no backoff: the
-- work did not fail), retry_count unchanged, reclaim_count + 1 (it shares max_reclaims with the
-- reaper's releases); the ended claim is kept as a 'disrupted' attempt. RETRY_PENDING rather
-- than PENDING so that a repeat of this complete is answered again as schedule_retry.sql's is
-- (retry_scheduled_by_holder.sql). Runs after end_live_claim.sql in its transaction.
-- $1 order id (uuid)
-- $2 the error reported (text)
-- $3 the ended claim's id (uuid), $4 its agent (uuid), $5 its claimed_at (timestamptz)
-- Returns next_retry_after.
WITH attempt AS (
  INSERT INTO work_order_attempts (claim_id, work_order_id, agent_id, started_at, ended, message)
  VALUES ($3, $1, $4, $5, 'disrupted', $2)
)
UPDATE work_orders SET status = 'RETRY_PENDING', reclaim_count = reclaim_count + 1,
       next_retry_after = now(), last_error = $2, last_error_at = now(), updated_at = now()
WHERE id = $1
RETURNING next_retry_after
