-- list_work_orders: active orders, oldest first, one page, without yaml_content (docs/design.md §5
-- GET /work-orders). Every filter is optional (NULL = any).
-- $1 status (text)
-- $2 work type (text)
-- $3 cursor: created_at of the previous page's last row (timestamptz, NULL = first page)
-- $4 cursor: id of the previous page's last row (uuid)
-- $5 page size (bigint)
-- $6 a label the order targets (text)
-- $7 the agent holding its claim now (uuid)
-- $8 created at or after (timestamptz)
-- $9, $10 id range of an id prefix, low and high (uuid)
SELECT NULL::text AS yaml_content,
       -- @include order_columns.sql
FROM work_orders w LEFT JOIN work_order_claims c ON c.work_order_id = w.id
WHERE ($1::text IS NULL OR w.status = $1)
  AND ($2::text IS NULL OR w.work_type = $2)
  AND ($3::timestamptz IS NULL OR (w.created_at, w.id) > ($3, $4))
  AND ($6::text IS NULL OR $6 = ANY (w.target_labels))
  AND ($7::uuid IS NULL OR c.agent_id = $7)
  AND ($8::timestamptz IS NULL OR w.created_at >= $8)
  AND ($9::uuid IS NULL OR w.id BETWEEN $9 AND $10)
ORDER BY w.created_at, w.id
LIMIT $5
