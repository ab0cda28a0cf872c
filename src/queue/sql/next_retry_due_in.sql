-- next_retry_due_in: seconds until the earliest backing-off order is due (negative when one is
-- due already), NULL when nothing backs off.
SELECT EXTRACT(EPOCH FROM (min(next_retry_after) - now()))::float8
FROM work_orders WHERE status = 'RETRY_PENDING'
