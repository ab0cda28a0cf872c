-- release_agent_claims: returns a retired agent's claims to PENDING (not counted as reclaims);
-- each released claim is kept as a `released` attempt (a late call from its agent is told
-- `reclaimed`, refusal_active.sql).
-- Runs after await_agent_statements.sql (a retirement's second step) or lock_retired_agent.sql
-- (maintenance) in their transaction; lock order agent → orders → claims.
-- $1 agent id (uuid)
WITH held AS (
  SELECT w.id FROM work_orders w JOIN work_order_claims c ON c.work_order_id = w.id
  WHERE c.agent_id = $1 ORDER BY w.id FOR UPDATE OF w
),
released AS (
  DELETE FROM work_order_claims c USING held WHERE c.work_order_id = held.id
  RETURNING c.work_order_id, c.claim_id, c.agent_id, c.claimed_at
),
attempt AS (
  INSERT INTO work_order_attempts (claim_id, work_order_id, agent_id, started_at, ended, message)
  SELECT claim_id, work_order_id, agent_id, claimed_at, 'released', 'its agent was retired'
  FROM released
)
UPDATE work_orders w SET status = 'PENDING', updated_at = now()
FROM released WHERE w.id = released.work_order_id
