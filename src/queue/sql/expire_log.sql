-- expire_log: deletes one batch of log entries past their retention (docs/design.md §7), oldest
-- first, with their attempts and their output (docs/design.md §9).
-- $1 retention (float8 seconds)
-- $2 batch size (bigint)
WITH expired AS (
  SELECT id FROM work_order_log
  WHERE completed_at < now() - make_interval(secs => $1)
  ORDER BY completed_at LIMIT $2 FOR UPDATE SKIP LOCKED
),
attempts AS (DELETE FROM work_order_attempts WHERE work_order_id IN (SELECT id FROM expired)),
output AS (DELETE FROM work_order_output WHERE work_order_id IN (SELECT id FROM expired)),
output_totals AS (
  DELETE FROM work_order_output_totals WHERE work_order_id IN (SELECT id FROM expired)
)
DELETE FROM work_order_log WHERE id IN (SELECT id FROM expired)
