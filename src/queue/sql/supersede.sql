-- supersede: a new order with concurrency on_conflict = supersede cancels the orders of its key
-- (same tenant, same key) that still wait, in the transaction that created it (docs/design.md §3
-- "Concurrency keys"); claimed ones go on. An order a claim in flight holds locked is passed
-- over (`SKIP LOCKED`) rather than awaited: that claim is about to run it, and waiting on it while
-- this transaction holds its new order could deadlock with the claim's slot.
-- $1 the new order's id (uuid)
-- Returns the log entries of the cancelled orders, without yaml_content.
WITH newer AS (SELECT id, concurrency_slot FROM work_orders WHERE id = $1),
w AS (
  DELETE FROM work_orders o
  WHERE o.id IN (SELECT x.id FROM work_orders x JOIN newer ON x.concurrency_slot = newer.concurrency_slot
                 WHERE x.id <> newer.id AND x.status IN ('PENDING', 'RETRY_PENDING')
                 FOR UPDATE OF x SKIP LOCKED)
  RETURNING o.*
),
-- A waiting order holds no claim; should one be left, it goes with its order, as in
-- finish_order.sql (no foreign key cascades it), so no slot stays taken for a gone order.
claim AS (DELETE FROM work_order_claims WHERE work_order_id IN (SELECT id FROM w)),
ending AS (
  SELECT w.id, 'cancelled'::text AS outcome, 'superseded by work order ' || $1::text AS message,
         w.last_error, w.last_error_at, w.last_claimed_by AS claimed_by,
         w.last_claim_id AS claim_id, NULL::timestamptz AS claimed_at, 'cancel'::text AS ended_by
  FROM w
)
-- @include log_insert.sql
