-- update_agent: replaces a live agent's attributes (the Executor reconciler keeps them in step
-- with the resource); its token is untouched.
-- $1 id (uuid), $2 name (text), $3 labels (text[]), $4 annotations (jsonb),
-- $5 the annotations as key=value pairs (text[]), $6 work types (text[], empty = all),
-- $7 tenant (text, NULL = instance-wide), $8 max_concurrency (int, NULL = unlimited),
-- $9 lease seconds (int, NULL = none recorded)
-- Changes nothing for a retired or unknown agent.
UPDATE agents SET name = $2, labels = $3, annotations = $4, annotation_pairs = $5,
       work_types = $6, tenant = $7, max_concurrency = $8, lease_seconds = $9
WHERE id = $1 AND retired_at IS NULL
