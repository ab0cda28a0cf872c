-- count_by_status: active orders per status (the pullman_work_orders gauge, queue::gauges).
SELECT status, count(*) FROM work_orders GROUP BY status ORDER BY status
