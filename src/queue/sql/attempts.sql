-- attempts: every claim of an order, oldest first (docs/design.md §5 GET /work-orders/{id}/attempts):
-- ended attempts (work_order_attempts), the live claim, and the claim that finished the order
-- (the log entry's own claim columns). One statement, so one snapshot: a claim ending meanwhile
-- is not seen twice.
-- $1 order id (uuid)
SELECT agent_id, claim_id, started_at, ended_at, ended AS result, message
FROM work_order_attempts WHERE work_order_id = $1
UNION ALL
SELECT agent_id, claim_id, claimed_at, NULL, 'running', NULL
FROM work_order_claims WHERE work_order_id = $1
UNION ALL
SELECT claimed_by, claim_id, claimed_at, completed_at,
       CASE ended_by WHEN 'cancel' THEN 'cancelled' WHEN 'reaper' THEN 'reclaimed'
                     WHEN 'disruption' THEN 'disrupted' ELSE outcome END,
       message
FROM work_order_log WHERE id = $1 AND claimed_at IS NOT NULL
ORDER BY started_at, claim_id
