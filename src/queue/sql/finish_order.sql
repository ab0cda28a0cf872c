-- finish_order: moves an active order to the log (docs/design.md §2: a finished order leaves
-- work_orders in the transaction that finishes it); any live claim row goes with it (cascade).
-- The caller holds the order's row lock. Used by a failed complete, cancel and the reaper; a
-- successful complete is complete_success.sql.
-- $1 order id (uuid)
-- $2 outcome (text: succeeded, failed, cancelled)
-- $3 message (text, NULL = none)
-- $4 last_error (text, NULL = keep the order's; when set, last_error_at becomes now())
-- $5, $6, $7 the claim live at the end: agent id, claim id (uuid, NULL = the order's last
--     claim), claimed_at (timestamptz, NULL = none)
-- $8 ended_by (text: agent, reaper, cancel), so a late heartbeat can be told why
-- Returns the log entry without yaml_content.
WITH w AS (DELETE FROM work_orders WHERE id = $1 RETURNING *)
INSERT INTO work_order_log (id, work_type, yaml_content, max_retries, backoff_seconds,
                            claim_timeout_seconds, max_reclaims, tenant, targeting, outcome,
                            message, retry_count, reclaim_count, last_error, last_error_at,
                            claimed_by, claim_id, claimed_at, source, ended_by, rerun_of,
                            created_at, completed_at)
SELECT w.id, w.work_type, w.yaml_content, w.max_retries, w.backoff_seconds,
       w.claim_timeout_seconds, w.max_reclaims, w.tenant,
       jsonb_build_object('agent_ids', to_jsonb(w.target_agent_ids),
                          'agent_names', to_jsonb(w.target_agent_names),
                          'labels', to_jsonb(w.target_labels),
                          'annotations', w.target_annotations),
       $2, $3, w.retry_count, w.reclaim_count, COALESCE($4, w.last_error),
       CASE WHEN $4::text IS NULL THEN w.last_error_at ELSE now() END,
       COALESCE($5, w.last_claimed_by), COALESCE($6, w.last_claim_id), $7, w.source, $8,
       w.rerun_of, w.created_at, now()
FROM w
RETURNING id, work_type, NULL::text AS yaml_content, outcome, message, max_retries,
          backoff_seconds, claim_timeout_seconds, max_reclaims, tenant, targeting, retry_count,
          reclaim_count, last_error, last_error_at, claimed_by, claim_id, claimed_at, rerun_of,
          created_at, completed_at
