-- lock_agent: locks an agent row for a token rotation and says whether it is retired.
-- $1 agent id (uuid)
-- Returns retired_at, or no row for an unknown agent.
-- FOR NO KEY UPDATE: it waits for a retirement or another rotation in flight (both write the
-- row), not for the agent's claims and completes (FOR KEY SHARE), which a waiting FOR UPDATE
-- could be passed over by for as long as the agent keeps working.
SELECT retired_at FROM agents WHERE id = $1 FOR NO KEY UPDATE
