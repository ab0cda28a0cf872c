-- waiting_by_profile: unclaimed orders grouped by their side of eligibility, for the
-- pullman_work_orders_waiting{reason} gauges (docs/design.md §10; queue::explain). Orders that share a
-- work type, tenant, targeting, status and due-ness share a reason, so the reasons are decided per
-- group (usually a handful), not per order. `due` as claim_candidate.sql reads it; the age as
-- waiting_order.sql counts it (since updated_at).
SELECT work_type, tenant, target_agent_ids, target_agent_names, target_labels,
       target_annotations, status, COALESCE(next_retry_after <= now(), false) AS due,
       -- @include key_full.sql
         AS limited,
       count(*) AS orders,
       EXTRACT(EPOCH FROM (now() - min(updated_at)))::float8 AS oldest_seconds
FROM work_orders w
WHERE status IN ('PENDING', 'RETRY_PENDING')
GROUP BY work_type, tenant, target_agent_ids, target_agent_names, target_labels,
         target_annotations, status, due, limited
