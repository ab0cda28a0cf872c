-- output_trim: keeps an order's output within its cap (docs/design.md §9): deletes its oldest chunks
-- until the newest ones left hold at most the cap, and counts what went as dropped (readers see
-- a marker there). Runs in the writer's transaction, under the totals row lock.
-- $1 order id (uuid)
-- $2 cap (bigint bytes)
-- Returns the bytes dropped now.
WITH ordered AS (
  SELECT id, sum(bytes) OVER (ORDER BY id DESC) AS newest_through
  FROM work_order_output WHERE work_order_id = $1
),
gone AS (
  DELETE FROM work_order_output o USING ordered
  WHERE o.id = ordered.id AND ordered.newest_through > $2
  RETURNING o.bytes
),
dropped AS (SELECT coalesce(sum(bytes), 0)::bigint AS n FROM gone)
UPDATE work_order_output_totals t
SET stored_bytes = t.stored_bytes - dropped.n, dropped_bytes = t.dropped_bytes + dropped.n
FROM dropped WHERE t.work_order_id = $1
RETURNING dropped.n
