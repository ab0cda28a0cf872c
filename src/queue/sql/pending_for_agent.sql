-- pending_for_agent: what an agent may claim now, oldest first, one page, without yaml_content
-- (docs/design.md §5 GET /agents/{id}/work-orders/pending). Side-effect free. The caller answers an
-- empty page for an agent at max_concurrency without running it.
-- $1 agent id (uuid)
-- $2 requested work types (text[], empty = any)
-- $3 cursor: created_at of the previous page's last row (timestamptz, NULL = first page)
-- $4 cursor: id of the previous page's last row (uuid)
-- $5 page size (bigint)
WITH a AS (
  SELECT id, name, labels, annotation_pairs, work_types, tenant, retired_at,
         $2::text[] AS requested_types
  FROM agents WHERE id = $1
)
SELECT NULL::text AS yaml_content,
       -- @include order_columns.sql
FROM work_orders w LEFT JOIN work_order_claims c ON c.work_order_id = w.id
WHERE
  -- @include eligible.sql
  AND NOT
  -- @include key_full.sql
  AND ($3::timestamptz IS NULL OR (w.created_at, w.id) > ($3, $4))
ORDER BY w.created_at, w.id
LIMIT $5
