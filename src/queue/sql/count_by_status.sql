-- count_by_status: active orders per status (pullman_work_orders gauge).
SELECT status, count(*) FROM work_orders GROUP BY status ORDER BY status
