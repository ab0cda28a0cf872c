-- refusal_active: why an agent's heartbeat or complete on an active order was refused: who holds
-- its claim now, and whether a claim of this agent on it was released (reaper, retirement).
-- $1 order id (uuid)
-- $2 agent id (uuid)
-- $3 claim id (uuid, NULL = any claim of the agent)
-- Returns (holder or NULL, released) when the order is active, no row otherwise.
SELECT c.agent_id,
       EXISTS (SELECT 1 FROM work_order_attempts r
               WHERE r.work_order_id = w.id AND r.agent_id = $2
                 AND r.ended IN ('reclaimed', 'released')
                 AND ($3::uuid IS NULL OR r.claim_id = $3))
FROM work_orders w LEFT JOIN work_order_claims c ON c.work_order_id = w.id
WHERE w.id = $1
