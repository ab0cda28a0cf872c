-- retired_with_claims: retired agents that still hold claims, retired at least 10 s ago
-- (queue::registry). A retirement is two transactions (retire_agent.sql, then
-- await_agent_statements.sql and release_agent_claims.sql); when the second never ran (the server
-- died between them, or it failed), maintenance releases those claims as the retirement would
-- have. The 10 s leave a retirement in progress to finish its own second step.
-- $1 most agents (bigint)
SELECT DISTINCT c.agent_id FROM work_order_claims c JOIN agents a ON a.id = c.agent_id
WHERE a.retired_at < now() - interval '10 seconds'
LIMIT $1
