-- capped_agent (a fragment, not a statement): the `a` CTE of claim_next_capped.sql and
-- claim_next_capped_fair.sql, the agent whose row lock_claimer.sql locked earlier in the
-- transaction. $1 agent id (uuid), $4 requested work types (text[])
a AS (
  SELECT id, name, labels, annotations, annotation_pairs, work_types, tenant, max_concurrency,
         retired_at, $4::text[] AS requested_types, true AS walks, cardinality($2::uuid[]) AS most
  FROM agents WHERE id = $1
),
