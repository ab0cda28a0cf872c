-- lock_order: locks an active order (cancel, docs/design.md §2).
-- $1 order id (uuid)
-- Returns its id, or no row when it is not active.
SELECT id FROM work_orders WHERE id = $1 FOR UPDATE
