-- promote_due_retries: due RETRY_PENDING orders become PENDING, which wakes long-polling
-- claimers through NOTIFY (claims accept due retries before this runs; it is for the wake-up).
-- $1 batch size (bigint)
UPDATE work_orders SET status = 'PENDING', updated_at = now()
WHERE id IN (SELECT id FROM work_orders
             WHERE status = 'RETRY_PENDING' AND next_retry_after <= now()
             ORDER BY next_retry_after LIMIT $1 FOR UPDATE SKIP LOCKED)
