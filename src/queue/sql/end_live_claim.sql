-- end_live_claim: ends the agent's live claim on an order (a failed complete), after
-- lock_order_for_failure.sql locked the order.
-- $1 order id (uuid)
-- $2 agent id (uuid)
-- $3 claim id (uuid, NULL = the agent's live claim, whichever it is)
-- Returns the ended claim's id and claimed_at, or no row when the agent holds no live claim.
DELETE FROM work_order_claims c
WHERE c.work_order_id = $1 AND c.agent_id = $2 AND ($3::uuid IS NULL OR c.claim_id = $3)
  AND
  -- @include live_claim.sql
RETURNING c.claim_id, c.claimed_at
