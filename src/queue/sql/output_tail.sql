-- output_tail: the newest chunks of an order that hold its last N lines (gap markers count as
-- lines), oldest first (docs/design.md §9 `tail`).
-- $1 order id (uuid)
-- $2 attempt (integer, NULL = every attempt)
-- $3 N (bigint)
SELECT id, claim_id, seq, attempt, gap_bytes, gap_reason, streams, texts, ats, received_at FROM (
  SELECT *, sum(line_count + (gap_bytes > 0)::integer) OVER (ORDER BY id DESC) AS newest_through,
         line_count + (gap_bytes > 0)::integer AS own
  FROM work_order_output
  WHERE work_order_id = $1 AND ($2::integer IS NULL OR attempt = $2)
) t
WHERE newest_through - own < $3
ORDER BY id
