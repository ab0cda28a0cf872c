-- key_holders: how many claims hold a concurrency key's slots, and which orders they hold
-- (docs/design.md §10 `concurrency_limited` names them), oldest claim first.
-- $1 the key's slot (uuid, work_orders.concurrency_slot)
-- $2 most holders returned (bigint)
SELECT COALESCE((SELECT s.held FROM concurrency_slots s WHERE s.slot = $1), 0)::bigint AS held,
       ARRAY(SELECT c.work_order_id FROM work_order_claims c
             WHERE c.concurrency_slot = $1
             ORDER BY c.claimed_at, c.work_order_id
             LIMIT $2) AS holders
