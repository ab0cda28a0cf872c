-- waiting_by_profile: unclaimed orders grouped by their side of eligibility, for the
-- pullman_work_orders_waiting{reason} gauges (docs/design.md §10; queue::explain). Orders that share a
-- work type, tenant, targeting, status and due-ness share a reason, so the reasons are decided per
-- group (usually a handful), not per order. `due` as claim_candidate.sql reads it; the age as
-- waiting_order.sql counts it (since updated_at). At most $1 groups, the largest first: orders
-- can make as many groups as there are orders (per-order targeting), and each group is compared
-- with every live agent; waiting_total counts the orders of every group, so the caller knows how
-- many the cut left unclassified.
-- $1 the most groups returned (bigint)
-- Returns the WaitingColumns (explain.rs), orders (bigint), oldest_seconds (float8),
-- waiting_total (bigint: every unclaimed order, in every group).
SELECT work_type, tenant, target_agent_ids, target_agent_names, target_labels,
       target_annotations, status, COALESCE(next_retry_after <= now(), false) AS due,
       -- @include key_full.sql
         AS limited,
       count(*) AS orders,
       EXTRACT(EPOCH FROM (now() - min(updated_at)))::float8 AS oldest_seconds,
       (sum(count(*)) OVER ())::bigint AS waiting_total
FROM work_orders w
WHERE status IN ('PENDING', 'RETRY_PENDING')
GROUP BY work_type, tenant, target_agent_ids, target_agent_names, target_labels,
         target_annotations, status, due, limited
ORDER BY orders DESC
LIMIT $1
