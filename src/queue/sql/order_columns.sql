-- order_columns (a fragment, not a statement): an active order `w` and its live claim `c` as
-- queue::OrderRow reads them (by name), all but yaml_content, which the statement selects first:
-- `w.yaml_content` or `NULL::text AS yaml_content`. Included (`-- @include order_columns.sql`,
-- build.rs) by every statement that returns orders: get_order.sql, get_order_summary.sql,
-- insert_order.sql, list_work_orders.sql, pending_for_agent.sql and claimed_order.sql.
w.id, w.work_type, w.status, w.max_retries, w.backoff_seconds, w.claim_timeout_seconds,
w.max_reclaims, w.priority, w.concurrency_key, w.concurrency_max,
w.concurrency_on_conflict, w.retry_on_disruption, w.tenant, w.target_agent_ids,
w.target_agent_names, w.target_labels, w.target_annotations, w.retry_count, w.reclaim_count,
w.last_error, w.last_error_at, w.next_retry_after, c.agent_id AS claimed_by, c.claimed_at,
c.claim_id, c.lease_seconds, c.lease_expires_at, w.rerun_of, w.created_at, w.updated_at
