-- tenant_counts: active orders per tenant for the per-tenant gauges of /metrics (issue #40,
-- docs/design.md §3): the $1 tenants with the most active orders (ties by name, the orders
-- without a tenant first), one row each with top = true, and at most one more row, top =
-- false and tenant NULL, summing every other tenant. Reads every active order once, through
-- the work_orders_tenant index's table (one replica per period, off the scrape path:
-- queue::gauges).
-- $1 how many tenants get their own row (bigint)
-- Returns tenant (text, NULL = no tenant or, with top = false, the others), top (bool),
-- waiting (bigint: PENDING or RETRY_PENDING), claimed (bigint).
WITH per AS (
  SELECT tenant,
         count(*) FILTER (WHERE status IN ('PENDING', 'RETRY_PENDING')) AS waiting,
         count(*) FILTER (WHERE status = 'CLAIMED') AS claimed
  FROM work_orders
  GROUP BY tenant
),
ranked AS (
  SELECT per.*, row_number() OVER (ORDER BY waiting + claimed DESC, tenant NULLS FIRST) AS rank
  FROM per
)
SELECT CASE WHEN rank <= $1 THEN tenant END AS tenant, rank <= $1 AS top,
       sum(waiting)::bigint AS waiting, sum(claimed)::bigint AS claimed
FROM ranked
GROUP BY 1, 2
ORDER BY 2 DESC, 3 DESC, 1 NULLS FIRST
