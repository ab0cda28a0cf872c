-- get_log_entry_summary: get_log_entry.sql without yaml_content.
-- $1 order id (uuid)
SELECT NULL::text AS yaml_content,
       -- @include log_columns.sql
FROM work_order_log WHERE id = $1
