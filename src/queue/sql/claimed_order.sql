-- claimed_order (a fragment, not a statement): the order just claimed by take_claim.sql, with
-- yaml_content and its claim, as queue::OrderRow reads it. Included (`-- @include claimed_order.sql`,
-- build.rs) by claim_next.sql, claim_next_capped.sql and claim_by_id.sql.
SELECT w.id, w.work_type, w.yaml_content, w.status, w.max_retries, w.backoff_seconds,
       w.claim_timeout_seconds, w.max_reclaims, w.tenant, w.target_agent_ids,
       w.target_agent_names, w.target_labels, w.target_annotations, w.retry_count,
       w.reclaim_count, w.last_error, w.last_error_at, w.next_retry_after,
       c.agent_id AS claimed_by, c.claimed_at, c.claim_id, c.lease_seconds, c.lease_expires_at,
       w.rerun_of, w.created_at, w.updated_at
FROM upd w JOIN claim c ON c.work_order_id = w.id
