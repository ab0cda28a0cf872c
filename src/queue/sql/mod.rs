//! Every SQL statement of the queue, one file each, named after its operation; its parameters
//! are listed at its head. Nothing is assembled at run time: the constants here are the
//! statements' whole text, as `build.rs` wrote it to `$OUT_DIR/sql/` from these files.
//!
//! A rule or a shape that several statements share (eligibility, claim liveness, taking a
//! claim, the columns of an order, moving an order to the log) is written once, in a fragment file, and a statement that needs it has the
//! line `-- @include <fragment>.sql` in its place; `build.rs` puts the fragment's text there.
//! Tests in `queue::eligibility` and `queue::claims` check that each statement that must apply a
//! rule does.

/// The text of statement file `$file` with its fragments in place (see the module docs).
macro_rules! statement {
    ($file:literal) => {
        include_str!(concat!(env!("OUT_DIR"), "/sql/", $file))
    };
}

/// Files that are fragments, not statements: `eligible.sql` and `live_claim.sql` (the rules'
/// SQL sides, `queue::eligibility`), `take_claim.sql` and `claimed_order.sql` (the claim every
/// claiming statement takes, `queue::claims`), `order_columns.sql` (an order as
/// `queue::OrderRow` reads it) and `log_insert.sql` (an order moved to the log).
#[cfg(test)]
const FRAGMENTS: &[&str] = &[
    "eligible",
    "live_claim",
    "take_claim",
    "claimed_order",
    "order_columns",
    "log_insert",
];

/// `sql` without its comments and with each run of whitespace made one space: the form in which
/// the tests look for a fragment in a statement, so layout and comments may differ.
#[cfg(test)]
pub(in crate::queue) fn squash(sql: &str) -> String {
    sql.lines()
        .map(|l| l.split("--").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

// Claiming (docs/design.md §3, §5; `queue::claims`).

/// `pending_for_agent.sql`.
pub(in crate::queue) const PENDING_FOR_AGENT: &str = statement!("pending_for_agent.sql");

/// `read_claimer.sql`.
pub(in crate::queue) const READ_CLAIMER: &str = statement!("read_claimer.sql");

/// `claim_next.sql`.
pub(in crate::queue) const CLAIM_NEXT: &str = statement!("claim_next.sql");

/// `lock_claimer.sql`.
pub(in crate::queue) const LOCK_CLAIMER: &str = statement!("lock_claimer.sql");

/// `count_held_claims.sql`.
pub(in crate::queue) const COUNT_HELD_CLAIMS: &str = statement!("count_held_claims.sql");

/// `claim_next_capped.sql`.
pub(in crate::queue) const CLAIM_NEXT_CAPPED: &str = statement!("claim_next_capped.sql");

/// `claim_candidate.sql`.
pub(in crate::queue) const CLAIM_CANDIDATE: &str = statement!("claim_candidate.sql");

/// `claim_by_id.sql`.
pub(in crate::queue) const CLAIM_BY_ID: &str = statement!("claim_by_id.sql");

// Holding a claim: heartbeat and complete (docs/design.md §2, §5; `queue::claims::holder`).

/// `record_contact.sql`.
pub(in crate::queue) const RECORD_CONTACT: &str = statement!("record_contact.sql");

/// `heartbeat.sql`.
pub(in crate::queue) const HEARTBEAT: &str = statement!("heartbeat.sql");

/// `complete_success.sql`.
pub(in crate::queue) const COMPLETE_SUCCESS: &str = statement!("complete_success.sql");

/// `lock_order_for_failure.sql`.
pub(in crate::queue) const LOCK_ORDER_FOR_FAILURE: &str = statement!("lock_order_for_failure.sql");

/// `end_live_claim.sql`.
pub(in crate::queue) const END_LIVE_CLAIM: &str = statement!("end_live_claim.sql");

/// `schedule_retry.sql`.
pub(in crate::queue) const SCHEDULE_RETRY: &str = statement!("schedule_retry.sql");

// Refusals and replays of heartbeat and complete (`queue::refusal`).

/// `refusal_active.sql`.
pub(in crate::queue) const REFUSAL_ACTIVE: &str = statement!("refusal_active.sql");

/// `refusal_finished.sql`.
pub(in crate::queue) const REFUSAL_FINISHED: &str = statement!("refusal_finished.sql");

/// `retry_scheduled_by_holder.sql`.
pub(in crate::queue) const RETRY_SCHEDULED_BY_HOLDER: &str =
    statement!("retry_scheduled_by_holder.sql");

/// `completed_by_holder.sql`.
pub(in crate::queue) const COMPLETED_BY_HOLDER: &str = statement!("completed_by_holder.sql");

// Orders: create, read, list, cancel, finish (`queue::orders`).

/// `insert_order.sql`.
pub(in crate::queue) const INSERT_ORDER: &str = statement!("insert_order.sql");

/// `order_finished.sql`.
pub(in crate::queue) const ORDER_FINISHED: &str = statement!("order_finished.sql");

/// `insert_idempotency_key.sql`.
pub(in crate::queue) const INSERT_IDEMPOTENCY_KEY: &str = statement!("insert_idempotency_key.sql");

/// `record_idempotent_response.sql`.
pub(in crate::queue) const RECORD_IDEMPOTENT_RESPONSE: &str =
    statement!("record_idempotent_response.sql");

/// `idempotency_key.sql`.
pub(in crate::queue) const IDEMPOTENCY_KEY: &str = statement!("idempotency_key.sql");

/// `get_order.sql`.
pub(in crate::queue) const GET_ORDER: &str = statement!("get_order.sql");

/// `get_order_summary.sql`.
pub(in crate::queue) const GET_ORDER_SUMMARY: &str = statement!("get_order_summary.sql");

/// `list_work_orders.sql`.
pub(in crate::queue) const LIST_WORK_ORDERS: &str = statement!("list_work_orders.sql");

/// `lock_order.sql`.
pub(in crate::queue) const LOCK_ORDER: &str = statement!("lock_order.sql");

/// `cancel_claim.sql`.
pub(in crate::queue) const CANCEL_CLAIM: &str = statement!("cancel_claim.sql");

/// `finish_order.sql`.
pub(in crate::queue) const FINISH_ORDER: &str = statement!("finish_order.sql");

/// `get_log_entry.sql`.
pub(in crate::queue) const GET_LOG_ENTRY: &str = statement!("get_log_entry.sql");

/// `get_log_entry_summary.sql`.
pub(in crate::queue) const GET_LOG_ENTRY_SUMMARY: &str = statement!("get_log_entry_summary.sql");

/// `list_log.sql`.
pub(in crate::queue) const LIST_LOG: &str = statement!("list_log.sql");

/// `attempts.sql`.
pub(in crate::queue) const ATTEMPTS: &str = statement!("attempts.sql");

// Agents (`queue::registry`).

/// `insert_agent.sql`.
pub(in crate::queue) const INSERT_AGENT: &str = statement!("insert_agent.sql");

/// `update_agent.sql`.
pub(in crate::queue) const UPDATE_AGENT: &str = statement!("update_agent.sql");

/// `insert_agent_token.sql`.
pub(in crate::queue) const INSERT_AGENT_TOKEN: &str = statement!("insert_agent_token.sql");

/// `revoke_agent_tokens.sql`.
pub(in crate::queue) const REVOKE_AGENT_TOKENS: &str = statement!("revoke_agent_tokens.sql");

/// `live_agent_token.sql`.
pub(in crate::queue) const LIVE_AGENT_TOKEN: &str = statement!("live_agent_token.sql");

/// `lock_agent.sql`.
pub(in crate::queue) const LOCK_AGENT: &str = statement!("lock_agent.sql");

/// `retire_agent.sql`.
pub(in crate::queue) const RETIRE_AGENT: &str = statement!("retire_agent.sql");

/// `release_agent_claims.sql`.
pub(in crate::queue) const RELEASE_AGENT_CLAIMS: &str = statement!("release_agent_claims.sql");

/// `get_agent.sql`.
pub(in crate::queue) const GET_AGENT: &str = statement!("get_agent.sql");

/// `list_agents.sql`.
pub(in crate::queue) const LIST_AGENTS: &str = statement!("list_agents.sql");

// Maintenance (docs/design.md §2, §7; `queue::maintenance`).

/// `find_expired_claims.sql`.
pub(in crate::queue) const FIND_EXPIRED_CLAIMS: &str = statement!("find_expired_claims.sql");

/// `release_expired_claims.sql`.
pub(in crate::queue) const RELEASE_EXPIRED_CLAIMS: &str = statement!("release_expired_claims.sql");

/// `requeue_reclaimed.sql`.
pub(in crate::queue) const REQUEUE_RECLAIMED: &str = statement!("requeue_reclaimed.sql");

/// `promote_due_retries.sql`.
pub(in crate::queue) const PROMOTE_DUE_RETRIES: &str = statement!("promote_due_retries.sql");

/// `next_retry_due_in.sql`.
pub(in crate::queue) const NEXT_RETRY_DUE_IN: &str = statement!("next_retry_due_in.sql");

/// `expire_log.sql`.
pub(in crate::queue) const EXPIRE_LOG: &str = statement!("expire_log.sql");

/// `expire_idempotency_keys.sql`.
pub(in crate::queue) const EXPIRE_IDEMPOTENCY_KEYS: &str =
    statement!("expire_idempotency_keys.sql");

/// `oldest_claimable_age.sql`.
pub(in crate::queue) const OLDEST_CLAIMABLE_AGE: &str = statement!("oldest_claimable_age.sql");

/// `agent_contacts.sql`.
pub(in crate::queue) const AGENT_CONTACTS: &str = statement!("agent_contacts.sql");

// Why an order waits, and backlogs (docs/design.md §10; `queue::explain`, `queue::backlog`).

/// `waiting_order.sql`.
pub(in crate::queue) const WAITING_ORDER: &str = statement!("waiting_order.sql");

/// `waiting_agents.sql`.
pub(in crate::queue) const WAITING_AGENTS: &str = statement!("waiting_agents.sql");

/// `queue_position.sql`.
pub(in crate::queue) const QUEUE_POSITION: &str = statement!("queue_position.sql");

/// `backlog.sql`.
pub(in crate::queue) const BACKLOG: &str = statement!("backlog.sql");

/// `waiting_by_profile.sql`.
pub(in crate::queue) const WAITING_BY_PROFILE: &str = statement!("waiting_by_profile.sql");

/// `waiting_orders.sql`.
pub(in crate::queue) const WAITING_ORDERS: &str = statement!("waiting_orders.sql");

// Output of running orders (docs/design.md §9; `queue::output`).

/// `output_fence.sql`.
pub(in crate::queue) const OUTPUT_FENCE: &str = statement!("output_fence.sql");

/// `output_insert.sql`.
pub(in crate::queue) const OUTPUT_INSERT: &str = statement!("output_insert.sql");

/// `output_stored_chunk.sql`.
pub(in crate::queue) const OUTPUT_STORED_CHUNK: &str = statement!("output_stored_chunk.sql");

/// `output_trim.sql`.
pub(in crate::queue) const OUTPUT_TRIM: &str = statement!("output_trim.sql");

/// `output_state.sql`.
pub(in crate::queue) const OUTPUT_STATE: &str = statement!("output_state.sql");

/// `output_page.sql`.
pub(in crate::queue) const OUTPUT_PAGE: &str = statement!("output_page.sql");

/// `output_tail.sql`.
pub(in crate::queue) const OUTPUT_TAIL: &str = statement!("output_tail.sql");

/// `output_reader_holds.sql`.
pub(in crate::queue) const OUTPUT_READER_HOLDS: &str = statement!("output_reader_holds.sql");

// Health and readiness (`queue`).

/// `count_by_status.sql`.
pub(in crate::queue) const COUNT_BY_STATUS: &str = statement!("count_by_status.sql");

/// `applied_migrations.sql`.
pub(in crate::queue) const APPLIED_MIGRATIONS: &str = statement!("applied_migrations.sql");

#[cfg(test)]
mod tests {
    use super::*;

    /// Every statement, by file name (the fragments `eligible` and `live_claim` excepted).
    const STATEMENTS: &[(&str, &str)] = &[
        ("pending_for_agent", PENDING_FOR_AGENT),
        ("read_claimer", READ_CLAIMER),
        ("claim_next", CLAIM_NEXT),
        ("lock_claimer", LOCK_CLAIMER),
        ("count_held_claims", COUNT_HELD_CLAIMS),
        ("claim_next_capped", CLAIM_NEXT_CAPPED),
        ("claim_candidate", CLAIM_CANDIDATE),
        ("claim_by_id", CLAIM_BY_ID),
        ("record_contact", RECORD_CONTACT),
        ("heartbeat", HEARTBEAT),
        ("complete_success", COMPLETE_SUCCESS),
        ("lock_order_for_failure", LOCK_ORDER_FOR_FAILURE),
        ("end_live_claim", END_LIVE_CLAIM),
        ("schedule_retry", SCHEDULE_RETRY),
        ("refusal_active", REFUSAL_ACTIVE),
        ("refusal_finished", REFUSAL_FINISHED),
        ("retry_scheduled_by_holder", RETRY_SCHEDULED_BY_HOLDER),
        ("completed_by_holder", COMPLETED_BY_HOLDER),
        ("insert_order", INSERT_ORDER),
        ("order_finished", ORDER_FINISHED),
        ("insert_idempotency_key", INSERT_IDEMPOTENCY_KEY),
        ("record_idempotent_response", RECORD_IDEMPOTENT_RESPONSE),
        ("idempotency_key", IDEMPOTENCY_KEY),
        ("get_order", GET_ORDER),
        ("get_order_summary", GET_ORDER_SUMMARY),
        ("list_work_orders", LIST_WORK_ORDERS),
        ("lock_order", LOCK_ORDER),
        ("cancel_claim", CANCEL_CLAIM),
        ("finish_order", FINISH_ORDER),
        ("get_log_entry", GET_LOG_ENTRY),
        ("get_log_entry_summary", GET_LOG_ENTRY_SUMMARY),
        ("list_log", LIST_LOG),
        ("attempts", ATTEMPTS),
        ("insert_agent", INSERT_AGENT),
        ("update_agent", UPDATE_AGENT),
        ("insert_agent_token", INSERT_AGENT_TOKEN),
        ("revoke_agent_tokens", REVOKE_AGENT_TOKENS),
        ("live_agent_token", LIVE_AGENT_TOKEN),
        ("lock_agent", LOCK_AGENT),
        ("retire_agent", RETIRE_AGENT),
        ("release_agent_claims", RELEASE_AGENT_CLAIMS),
        ("get_agent", GET_AGENT),
        ("list_agents", LIST_AGENTS),
        ("find_expired_claims", FIND_EXPIRED_CLAIMS),
        ("release_expired_claims", RELEASE_EXPIRED_CLAIMS),
        ("requeue_reclaimed", REQUEUE_RECLAIMED),
        ("promote_due_retries", PROMOTE_DUE_RETRIES),
        ("next_retry_due_in", NEXT_RETRY_DUE_IN),
        ("expire_log", EXPIRE_LOG),
        ("expire_idempotency_keys", EXPIRE_IDEMPOTENCY_KEYS),
        ("oldest_claimable_age", OLDEST_CLAIMABLE_AGE),
        ("agent_contacts", AGENT_CONTACTS),
        ("waiting_order", WAITING_ORDER),
        ("waiting_agents", WAITING_AGENTS),
        ("queue_position", QUEUE_POSITION),
        ("waiting_by_profile", WAITING_BY_PROFILE),
        ("waiting_orders", WAITING_ORDERS),
        ("backlog", BACKLOG),
        ("count_by_status", COUNT_BY_STATUS),
        ("applied_migrations", APPLIED_MIGRATIONS),
        ("output_fence", OUTPUT_FENCE),
        ("output_insert", OUTPUT_INSERT),
        ("output_stored_chunk", OUTPUT_STORED_CHUNK),
        ("output_trim", OUTPUT_TRIM),
        ("output_state", OUTPUT_STATE),
        ("output_page", OUTPUT_PAGE),
        ("output_tail", OUTPUT_TAIL),
        ("output_reader_holds", OUTPUT_READER_HOLDS),
    ];

    /// Every fragment serves some statement, and every include was expanded by `build.rs`.
    #[test]
    fn every_fragment_is_included_and_every_include_expanded() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/queue/sql");
        let sources: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
            .collect();
        for fragment in FRAGMENTS {
            let include = format!("-- @include {fragment}.sql");
            assert!(
                sources.iter().any(|s| s.contains(&include)),
                "sql/{fragment}.sql is included by no statement"
            );
        }
        for (name, sql) in STATEMENTS {
            assert!(
                !sql.contains("@include"),
                "{name}: an include left unexpanded"
            );
        }
    }

    #[test]
    fn every_sql_file_is_a_named_statement() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/queue/sql");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter_map(|f| f.strip_suffix(".sql").map(str::to_owned))
            .filter(|f| !FRAGMENTS.contains(&f.as_str()))
            .collect();
        files.sort();
        let mut named: Vec<String> = STATEMENTS.iter().map(|(n, _)| n.to_string()).collect();
        named.sort();
        assert_eq!(files, named);
    }

    /// A statement opens with `-- <its name>:` and lists each `$n` it uses in its head comment.
    #[test]
    fn every_statement_names_itself_and_lists_its_parameters() {
        for (name, sql) in STATEMENTS {
            assert!(
                sql.starts_with(&format!("-- {name}: ")),
                "{name}.sql must open with `-- {name}: …`"
            );
            let head: String = sql
                .lines()
                .take_while(|l| l.starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n");
            let body: String = sql
                .lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n");
            let used = parameters(&body);
            for n in 1..=used.iter().copied().max().unwrap_or(0) {
                assert!(used.contains(&n), "{name}.sql skips ${n}");
                assert!(
                    parameters(&head).contains(&n),
                    "{name}.sql uses ${n} but does not list it at its head"
                );
            }
        }
    }

    /// The `$n` numbers in `text`.
    fn parameters(text: &str) -> std::collections::BTreeSet<usize> {
        let bytes = text.as_bytes();
        let mut found = std::collections::BTreeSet::new();
        for (i, b) in bytes.iter().enumerate() {
            if *b == b'$' {
                let digits: String = text[i + 1..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                if let Ok(n) = digits.parse() {
                    found.insert(n);
                }
            }
        }
        found
    }
}
