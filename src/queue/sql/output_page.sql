-- output_page: an order's chunks from a chunk id on, oldest first (docs/design.md §9).
-- $1 order id (uuid)
-- $2 first chunk id (bigint)
-- $3 attempt (integer, NULL = every attempt)
-- $4 most chunks (bigint)
SELECT id, claim_id, seq, attempt, gap_bytes, gap_reason, streams, texts, ats, received_at
FROM work_order_output
WHERE work_order_id = $1 AND id >= $2 AND ($3::integer IS NULL OR attempt = $3)
ORDER BY id LIMIT $4
