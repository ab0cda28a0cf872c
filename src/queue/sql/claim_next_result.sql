-- claim_next_result (a fragment, not a statement): what claim_next.sql and claim_next_fair.sql
-- return, a row per claimed order with the agent's columns (a_*), or one row with the agent's
-- columns and the order's all NULL when nothing was claimed.
SELECT a.id AS a_id, a.name AS a_name, a.labels AS a_labels, a.annotations AS a_annotations,
       a.work_types AS a_work_types,
       a.tenant AS a_tenant, a.max_concurrency AS a_max_concurrency,
       a.retired_at AS a_retired_at, o.*
FROM a LEFT JOIN (
  -- @include claimed_order.sql
) o ON true
