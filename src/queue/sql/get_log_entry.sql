-- get_log_entry: one finished order with its yaml_content (docs/design.md §5
-- GET /work-order-log/{id}).
-- $1 order id (uuid)
SELECT yaml_content,
       -- @include log_columns.sql
FROM work_order_log WHERE id = $1
