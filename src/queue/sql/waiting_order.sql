-- waiting_order: an unclaimed order's side of docs/design.md §10 (why it waits), or no row when the
-- order is claimed or not active.
-- $1 order id (uuid)
-- Returns the order's side of eligibility, whether its retry is due (as claim_candidate.sql reads
-- it: not without a next_retry_after), whether its concurrency key is full (as key_full.sql reads
-- it), the key, and the seconds since it last became unclaimed (updated_at:
-- every statement that makes an order PENDING or RETRY_PENDING sets it).
SELECT id, work_type, tenant, target_agent_ids, target_agent_names, target_labels,
       target_annotations, status, retry_count, next_retry_after,
       COALESCE(next_retry_after <= now(), false) AS due,
       -- @include key_full.sql
         AS limited,
       concurrency_slot, concurrency_key, concurrency_max,
       floor(EXTRACT(EPOCH FROM (now() - updated_at)))::bigint AS waiting_seconds
FROM work_orders w
WHERE id = $1 AND status IN ('PENDING', 'RETRY_PENDING')
