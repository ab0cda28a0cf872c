-- completed_by_holder: the log entry of an order finished by the agent's own complete of claim
-- $3, without yaml_content (docs/design.md §5 "Retry safety": a repeated complete gets it again).
-- 'disruption' is the holder's own complete too: of a disrupted attempt (docs/design.md §12).
-- $1 order id (uuid)
-- $2 agent id (uuid)
-- $3 claim id (uuid)
SELECT id, work_type, NULL::text AS yaml_content, outcome, message, max_retries,
       backoff_seconds, claim_timeout_seconds, max_reclaims, priority, concurrency_key,
       concurrency_max, concurrency_on_conflict, retry_on_disruption, tenant, targeting,
       retry_count, reclaim_count, last_error, last_error_at, claimed_by, claim_id, claimed_at,
       rerun_of, created_at, completed_at
FROM work_order_log
WHERE id = $1 AND ended_by IN ('agent', 'disruption') AND claimed_by = $2 AND claim_id = $3
