-- get_log_entry_summary: get_log_entry.sql without yaml_content.
-- $1 order id (uuid)
SELECT id, work_type, NULL::text AS yaml_content, outcome, message, max_retries,
       backoff_seconds, claim_timeout_seconds, max_reclaims, priority, concurrency_key,
       concurrency_max, concurrency_on_conflict, retry_on_disruption, tenant, targeting,
       retry_count, reclaim_count, last_error, last_error_at, claimed_by, claim_id, claimed_at,
       rerun_of, created_at, completed_at
FROM work_order_log WHERE id = $1
