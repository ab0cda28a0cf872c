-- list_log: finished orders, newest first, one page, without yaml_content (docs/design.md §5
-- GET /work-order-log). Every filter is optional (NULL = any).
-- $1 work type (text)
-- $2 succeeded (bool: true = succeeded, false = failed or cancelled)
-- $3 agent of the last claim (uuid)
-- $4 cursor: completed_at of the previous page's last row (timestamptz, NULL = first page)
-- $5 cursor: id of the previous page's last row (uuid)
-- $6 page size (bigint)
-- $7 outcome (text)
-- $8 a label the order targeted (text)
-- $9 finished at or after (timestamptz)
-- $10, $11 id range of an id prefix, low and high (uuid)
SELECT NULL::text AS yaml_content,
       -- @include log_columns.sql
FROM work_order_log
WHERE ($1::text IS NULL OR work_type = $1)
  AND ($2::bool IS NULL OR (outcome = 'succeeded') = $2)
  AND ($3::uuid IS NULL OR claimed_by = $3)
  AND ($4::timestamptz IS NULL OR (completed_at, id) < ($4, $5))
  AND ($7::text IS NULL OR outcome = $7)
  AND ($8::text IS NULL OR targeting -> 'labels' ? $8)
  AND ($9::timestamptz IS NULL OR completed_at >= $9)
  AND ($10::uuid IS NULL OR id BETWEEN $10 AND $11)
ORDER BY completed_at DESC, id DESC
LIMIT $6
