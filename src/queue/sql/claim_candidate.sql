-- claim_candidate: locks one order for a claim by id and reads what its eligibility needs.
-- $1 order id (uuid)
-- Returns the order's side of eligibility and whether a retry is due (as eligible.sql has it:
-- not without a next_retry_after), or no row.
SELECT work_type, tenant, target_agent_ids, target_agent_names, target_labels,
       target_annotations, status, next_retry_after,
       COALESCE(next_retry_after <= now(), false) AS due
FROM work_orders WHERE id = $1
FOR UPDATE
