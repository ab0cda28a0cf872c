-- output_state: what a reader of an order's output needs besides its lines (docs/design.md §9), in one
-- snapshot: whether the order is active or finished (neither: unknown), the bytes the cap
-- dropped, and the first chunk still stored and when it arrived (the database's clock).
-- $1 order id (uuid)
SELECT EXISTS (SELECT 1 FROM work_orders WHERE id = $1) AS active,
       EXISTS (SELECT 1 FROM work_order_log WHERE id = $1) AS finished,
       coalesce((SELECT dropped_bytes FROM work_order_output_totals WHERE work_order_id = $1), 0)
         AS dropped_bytes,
       first.id AS first_chunk, first.received_at AS first_received_at
FROM (SELECT 1) one
LEFT JOIN LATERAL (SELECT id, received_at FROM work_order_output WHERE work_order_id = $1
                   ORDER BY id LIMIT 1) first ON true
