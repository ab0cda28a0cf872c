-- lock_retired_agent: maintenance's version of await_agent_statements.sql (queue::registry): locks
-- a retired agent's row FOR UPDATE, SKIP LOCKED, so a sweep never waits (on another replica's
-- sweep, or on the agent's last statements): a row it cannot have now is left to the next pass.
-- $1 agent id (uuid)
-- Returns the id, or no row when the row is locked (or gone).
SELECT id FROM agents WHERE id = $1 AND retired_at IS NOT NULL FOR UPDATE SKIP LOCKED
