-- waiting_orders: of the given orders, the unclaimed ones grouped by their side of eligibility,
-- for the WorkOrder `Schedulable` condition (docs/design.md §10; controller::schedulable). One statement
-- per refresh for every WorkOrder a controller watches: by primary key, so its cost follows the
-- orders asked about, not the whole queue. Groups as waiting_by_profile.sql; `due` as
-- claim_candidate.sql reads it. Each group carries its orders' ids, retry counts and retry times.
-- $1 order ids (uuid[])
SELECT work_type, tenant, target_agent_ids, target_agent_names, target_labels,
       target_annotations, status, COALESCE(next_retry_after <= now(), false) AS due,
       -- @include key_full.sql
         AS limited,
       array_agg(id ORDER BY id) AS ids,
       array_agg(retry_count ORDER BY id) AS retry_counts,
       array_agg(next_retry_after ORDER BY id) AS retry_times
FROM work_orders w
WHERE id = ANY($1) AND status IN ('PENDING', 'RETRY_PENDING')
GROUP BY work_type, tenant, target_agent_ids, target_agent_names, target_labels,
         target_annotations, status, due, limited
