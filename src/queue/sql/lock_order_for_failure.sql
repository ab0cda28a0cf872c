-- lock_order_for_failure: locks an order for a failed complete and reads what the retry decision
-- (queue::rules::decide_failure, docs/design.md §2) needs. Runs after record_contact.sql (lock order
-- agent → order → claim).
-- $1 order id (uuid)
SELECT retry_count, max_retries, backoff_seconds FROM work_orders WHERE id = $1 FOR UPDATE
