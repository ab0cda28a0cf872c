-- retire_agent: marks an agent retired (docs/design.md §5 DELETE /agents/{id}); retiring a retired
-- agent keeps its first retirement time.
-- $1 agent id (uuid)
-- Returns the id, or no row for an unknown agent.
UPDATE agents SET retired_at = COALESCE(retired_at, now()) WHERE id = $1 RETURNING id
