-- cancel_claim: ends whatever claim an order being cancelled has (its holder learns it at its
-- next heartbeat or complete), after lock_order.sql locked the order.
-- $1 order id (uuid)
-- Returns the claim's agent, id and claimed_at, or no row when it was not claimed.
DELETE FROM work_order_claims WHERE work_order_id = $1
RETURNING agent_id, claim_id, claimed_at
