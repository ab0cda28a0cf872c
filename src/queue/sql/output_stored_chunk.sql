-- output_stored_chunk: the line count of a chunk stored before (a resent seq is answered as the
-- first time, docs/design.md §9).
-- $1 order id (uuid)
-- $2 claim id (uuid)
-- $3 seq (bigint)
SELECT line_count FROM work_order_output WHERE work_order_id = $1 AND claim_id = $2 AND seq = $3
