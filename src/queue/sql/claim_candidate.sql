-- claim_candidate: locks one order for a claim by id and reads what its eligibility needs.
-- $1 order id (uuid)
-- Returns the order's side of eligibility, whether a retry is due (as eligible.sql has it:
-- not without a next_retry_after) and whether its concurrency key is full (key_full.sql), or no
-- row.
SELECT work_type, tenant, target_agent_ids, target_agent_names, target_labels,
       target_annotations, status, next_retry_after,
       COALESCE(next_retry_after <= now(), false) AS due,
       concurrency_key, concurrency_max,
       -- @include key_full.sql
         AS limited
FROM work_orders w WHERE id = $1
FOR UPDATE OF w
