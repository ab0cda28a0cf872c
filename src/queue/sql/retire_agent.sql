-- retire_agent: marks an agent retired (docs/design.md §5 DELETE /agents/{id}); retiring a retired
-- agent keeps its first retirement time.
-- $1 agent id (uuid)
-- The row is locked FOR UPDATE first: claims and completes lock it FOR KEY SHARE (not in
-- conflict with a plain UPDATE), so the retirement waits for those in flight and those after it
-- wait for the retirement, then see it (claiming_agent.sql).
-- Returns the id, or no row for an unknown agent.
UPDATE agents SET retired_at = COALESCE(retired_at, now())
WHERE id = (SELECT id FROM agents WHERE id = $1 FOR UPDATE)
RETURNING id
