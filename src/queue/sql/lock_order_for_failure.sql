-- lock_order_for_failure: locks an order for a failed complete and reads what the decision needs:
-- retries (queue::rules::decide_failure, docs/design.md §2) and, for a disrupted attempt, the
-- policy and reclaims (queue::rules::decide_disruption, §12). Runs after record_contact.sql
-- (lock order agent → order → claim).
-- $1 order id (uuid)
SELECT retry_count, max_retries, backoff_seconds, retry_on_disruption, reclaim_count,
       max_reclaims
FROM work_orders WHERE id = $1 FOR UPDATE
