-- retire_agent: marks an agent retired (docs/design.md §5 DELETE /agents/{id}); retiring a retired
-- agent keeps its first retirement time.
-- $1 agent id (uuid)
-- A plain UPDATE: it does not wait for the agent's claims and completes in flight (they lock the
-- row FOR KEY SHARE); once it commits, claims see the agent retired. Waiting for those in flight
-- is the next transaction's (await_agent_statements.sql, queue::registry).
-- Returns the id, or no row for an unknown agent.
UPDATE agents SET retired_at = COALESCE(retired_at, now()) WHERE id = $1 RETURNING id
