-- oldest_claimable_age: age in seconds of the oldest claimable order (pullman_queue_lag_seconds):
-- a PENDING order counts from created_at, a due RETRY_PENDING one from next_retry_after
-- (docs/design.md §3 rule 5). NULL when nothing is claimable. Each half walks an index of claimable
-- rows (work_orders_claimable, work_orders_retry_due) and stops at its first row.
SELECT EXTRACT(EPOCH FROM (now() - min(since)))::float8
FROM ((SELECT created_at AS since FROM work_orders WHERE status = 'PENDING'
       ORDER BY created_at, id LIMIT 1)
      UNION ALL
      (SELECT next_retry_after FROM work_orders
       WHERE status = 'RETRY_PENDING' AND next_retry_after <= now()
       ORDER BY next_retry_after LIMIT 1)) AS oldest
