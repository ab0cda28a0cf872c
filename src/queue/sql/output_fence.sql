-- output_fence: admits one output chunk (docs/design.md §9): the agent must hold the live claim named
-- (as heartbeat.sql fences). Locks that claim row FOR KEY SHARE, so a complete that ends it waits
-- until this chunk is committed (a follower that sees the order finished then finds every chunk),
-- and then the order's output totals row, the per-order lock every output writer takes first:
-- chunk ids (the read cursor) are taken after it, so within one order they grow in commit order.
-- $1 order id (uuid)
-- $2 agent id (uuid)
-- $3 claim id (uuid)
-- Returns the order's stored bytes, or no row when the claim is not live (the caller explains
-- the 409, or answers a chunk stored before again).
WITH live AS (
  SELECT c.work_order_id FROM work_order_claims c
  WHERE c.work_order_id = $1 AND c.agent_id = $2 AND c.claim_id = $3
    AND
    -- @include live_claim.sql
  FOR KEY SHARE
)
INSERT INTO work_order_output_totals (work_order_id)
SELECT work_order_id FROM live
ON CONFLICT (work_order_id) DO UPDATE SET stored_bytes = work_order_output_totals.stored_bytes
RETURNING stored_bytes
