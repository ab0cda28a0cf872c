-- get_order_summary: get_order.sql without yaml_content (for callers that only need the state).
-- $1 order id (uuid)
SELECT NULL::text AS yaml_content,
       -- @include order_columns.sql
FROM work_orders w LEFT JOIN work_order_claims c ON c.work_order_id = w.id
WHERE w.id = $1
