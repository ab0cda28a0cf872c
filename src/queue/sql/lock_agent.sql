-- lock_agent: locks an agent row for a token rotation and says whether it is retired.
-- $1 agent id (uuid)
-- Returns retired_at, or no row for an unknown agent.
SELECT retired_at FROM agents WHERE id = $1 FOR UPDATE
