-- get_order: one active order with its live claim and yaml_content (docs/design.md §5
-- GET /work-orders/{id}).
-- $1 order id (uuid)
SELECT w.yaml_content,
       -- @include order_columns.sql
FROM work_orders w LEFT JOIN work_order_claims c ON c.work_order_id = w.id
WHERE w.id = $1
