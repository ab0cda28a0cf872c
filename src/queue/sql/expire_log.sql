-- expire_log: deletes one batch of log entries past their retention (docs/design.md §7), oldest
-- first, with their attempts and their output (docs/design.md §9). A batch is at most $2 entries
-- and stops at the entry whose output would take it past $3 bytes (always at least one entry):
-- each entry may hold up to the output cap (16 MiB by default), and 1,000 of them in one
-- transaction would be gigabytes of deletes and WAL at once.
-- $1 cutoff (timestamptz: entries completed before it go; fixed by the caller for all its
--    batches, so that entries finishing meanwhile cannot keep the batches coming)
-- $2 batch size (bigint entries)
-- $3 batch budget (bigint bytes of stored output)
WITH candidates AS (
  SELECT l.id, l.completed_at FROM work_order_log l
  WHERE l.completed_at < $1
  ORDER BY l.completed_at LIMIT $2 FOR UPDATE SKIP LOCKED
),
sized AS (
  SELECT c.id,
         sum(coalesce(t.stored_bytes, 0)) OVER (ORDER BY c.completed_at, c.id)
           - coalesce(t.stored_bytes, 0) AS before
  FROM candidates c LEFT JOIN work_order_output_totals t ON t.work_order_id = c.id
),
expired AS (SELECT id FROM sized WHERE before < $3),
attempts AS (DELETE FROM work_order_attempts WHERE work_order_id IN (SELECT id FROM expired)),
output AS (DELETE FROM work_order_output WHERE work_order_id IN (SELECT id FROM expired)),
output_totals AS (
  DELETE FROM work_order_output_totals WHERE work_order_id IN (SELECT id FROM expired)
)
DELETE FROM work_order_log WHERE id IN (SELECT id FROM expired)
