-- order_finished: whether an order of this id is in the log.
-- $1 order id (uuid)
SELECT EXISTS (SELECT 1 FROM work_order_log WHERE id = $1)
