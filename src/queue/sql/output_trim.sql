-- output_trim: keeps an order's output within its cap (docs/design.md §9): deletes its oldest chunks
-- until the newest ones left hold at most the cap, and counts what went as dropped (readers see
-- a marker there). Runs in the writer's transaction, under the totals row lock, after the totals
-- counted the new chunk. The chunks to delete are the shortest oldest prefix whose bytes reach the
-- excess (stored - cap), found by walking work_order_output_order from the oldest chunk and
-- stopping there: an append costs the few chunks it pushes out, not a scan of every chunk the
-- order has stored.
-- $1 order id (uuid)
-- $2 cap (bigint bytes)
-- Returns the bytes dropped now.
WITH RECURSIVE excess AS (
  SELECT stored_bytes - $2 AS n FROM work_order_output_totals WHERE work_order_id = $1
),
oldest AS (
  (SELECT o.id, o.bytes::bigint AS through
   FROM work_order_output o, excess
   WHERE o.work_order_id = $1 AND excess.n > 0
   ORDER BY o.id LIMIT 1)
  UNION ALL
  SELECT next.id, oldest.through + next.bytes
  FROM oldest, excess,
       LATERAL (SELECT o.id, o.bytes FROM work_order_output o
                WHERE o.work_order_id = $1 AND o.id > oldest.id
                ORDER BY o.id LIMIT 1) next
  WHERE oldest.through < excess.n
),
gone AS (
  DELETE FROM work_order_output o USING oldest
  WHERE o.id = oldest.id
  RETURNING o.bytes
),
dropped AS (SELECT coalesce(sum(bytes), 0)::bigint AS n FROM gone)
UPDATE work_order_output_totals t
SET stored_bytes = t.stored_bytes - dropped.n, dropped_bytes = t.dropped_bytes + dropped.n
FROM dropped WHERE t.work_order_id = $1
RETURNING dropped.n
