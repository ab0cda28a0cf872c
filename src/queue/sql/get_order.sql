-- get_order: one active order with its live claim and yaml_content (docs/design.md §5
-- GET /work-orders/{id}).
-- $1 order id (uuid)
SELECT w.id, w.work_type, w.yaml_content, w.status, w.max_retries, w.backoff_seconds,
       w.claim_timeout_seconds, w.max_reclaims, w.tenant, w.target_agent_ids,
       w.target_agent_names, w.target_labels, w.target_annotations, w.retry_count,
       w.reclaim_count, w.last_error, w.last_error_at, w.next_retry_after,
       c.agent_id AS claimed_by, c.claimed_at, c.claim_id, c.lease_seconds, c.lease_expires_at,
       w.rerun_of, w.created_at, w.updated_at
FROM work_orders w LEFT JOIN work_order_claims c ON c.work_order_id = w.id
WHERE w.id = $1
