-- log_columns (a fragment, not a statement): a log entry as queue::LogRow reads it (by name), all
-- but yaml_content, which the statement selects first: `yaml_content` or
-- `NULL::text AS yaml_content`. Included (`-- @include log_columns.sql`, build.rs) by every
-- statement that returns log entries: get_log_entry.sql, get_log_entry_summary.sql, list_log.sql,
-- completed_by_holder.sql and log_insert.sql.
id, work_type, outcome, message, max_retries, backoff_seconds, claim_timeout_seconds,
max_reclaims, priority, concurrency_key, concurrency_max, concurrency_on_conflict,
retry_on_disruption, tenant, targeting, retry_count, reclaim_count, last_error, last_error_at,
claimed_by, claim_id, claimed_at, rerun_of, created_at, completed_at
