-- read_claimer: the agent's side of eligibility, without locking or touching it.
-- $1 agent id (uuid)
-- Returns a_* columns as lock_claimer.sql, or no row.
SELECT id AS a_id, name AS a_name, labels AS a_labels, annotations AS a_annotations,
       work_types AS a_work_types,
       tenant AS a_tenant, max_concurrency AS a_max_concurrency, retired_at AS a_retired_at
FROM agents WHERE id = $1
