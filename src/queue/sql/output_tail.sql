-- output_tail: the newest chunks of an order that hold its last N lines (gap markers count as
-- lines), oldest first (docs/design.md §9 `tail`). Walks work_order_output_order from the newest
-- chunk and stops once N lines are reached, so a tail costs the chunks it returns, not a scan of
-- every chunk the order has stored.
-- $1 order id (uuid)
-- $2 attempt (integer, NULL = every attempt)
-- $3 N (bigint)
WITH RECURSIVE newest AS (
  (SELECT o.id, (o.line_count + (o.gap_bytes > 0)::integer)::bigint AS through
   FROM work_order_output o
   WHERE o.work_order_id = $1 AND ($2::integer IS NULL OR o.attempt = $2)
   ORDER BY o.id DESC LIMIT 1)
  UNION ALL
  SELECT prev.id, newest.through + prev.line_count + (prev.gap_bytes > 0)::integer
  FROM newest,
       LATERAL (SELECT o.id, o.line_count, o.gap_bytes FROM work_order_output o
                WHERE o.work_order_id = $1 AND o.id < newest.id
                  AND ($2::integer IS NULL OR o.attempt = $2)
                ORDER BY o.id DESC LIMIT 1) prev
  WHERE newest.through < $3
)
SELECT o.id, o.claim_id, o.seq, o.attempt, o.gap_bytes, o.gap_reason, o.streams, o.texts, o.ats,
       o.received_at
FROM work_order_output o JOIN newest USING (id)
ORDER BY o.id
