-- log_insert (a fragment, not a statement): moves the order to the log (docs/design.md §2: a
-- finished order leaves work_orders in the transaction that finishes it). Reads two CTEs of the
-- statement that includes it: `w`, the order row it deleted, and `ending`, one row saying how
-- it ended (id, the order's; outcome, message, last_error, last_error_at, claimed_by, claim_id,
-- claimed_at, ended_by): one row per order, so a statement may move several. Returns the log
-- entry without yaml_content, as queue::LogRow reads it. Included
-- (`-- @include log_insert.sql`, build.rs) by complete_success.sql, complete_success_many.sql
-- and finish_order.sql.
INSERT INTO work_order_log (id, work_type, yaml_content, max_retries, backoff_seconds,
                            claim_timeout_seconds, max_reclaims, tenant, targeting, outcome,
                            message, retry_count, reclaim_count, last_error, last_error_at,
                            claimed_by, claim_id, claimed_at, source, ended_by, rerun_of,
                            priority, concurrency_key, concurrency_max,
                            concurrency_on_conflict, retry_on_disruption, created_at,
                            completed_at)
SELECT w.id, w.work_type, w.yaml_content, w.max_retries, w.backoff_seconds,
       w.claim_timeout_seconds, w.max_reclaims, w.tenant,
       jsonb_build_object('agent_ids', to_jsonb(w.target_agent_ids),
                          'agent_names', to_jsonb(w.target_agent_names),
                          'labels', to_jsonb(w.target_labels),
                          'annotations', w.target_annotations),
       e.outcome, e.message, w.retry_count, w.reclaim_count, e.last_error, e.last_error_at,
       e.claimed_by, e.claim_id, e.claimed_at, w.source, e.ended_by, w.rerun_of,
       w.priority, w.concurrency_key, w.concurrency_max, w.concurrency_on_conflict,
       w.retry_on_disruption, w.created_at, now()
FROM w JOIN ending e ON e.id = w.id
RETURNING NULL::text AS yaml_content,
          -- @include log_columns.sql
