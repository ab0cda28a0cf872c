//! Every SQL statement of the queue, one file each, named after its operation; its parameters
//! are listed at its head. Nothing is assembled at run time: the constants here are the
//! statements' whole text, as `build.rs` wrote it to `$OUT_DIR/sql/` from these files.
//!
//! A rule or a shape that several statements share (eligibility, claim liveness, taking a
//! claim, the columns of an order or of a log entry, moving an order to the log) is written once, in a fragment file, and a statement that needs it has the
//! line `-- @include <fragment>.sql` in its place; `build.rs` puts the fragment's text there.
//! Tests in `queue::eligibility` and `queue::claims` check that each statement that must apply a
//! rule does.
//!
//! Why not sqlx's compile-time checked `query_file_as!` (issue #26 weighed it): its path must be
//! a string literal in the source tree, so it cannot read the statements `build.rs` expanded and
//! every fragment would be copied back into each statement; each build would need a database
//! or `.sqlx/` offline data regenerated with sqlx-cli after every change to a statement or a
//! migration; and its nullability inference marks columns of `LEFT JOIN`s and CTEs wrongly,
//! which takes a `"name?"`/`"name!"` override on about a third of our columns. What it would
//! check is checked at test time instead: the queue's tests run the statements against a real
//! PostgreSQL, and `tests` below hold each file to its name and its listed parameters.

/// Declares each statement once: `NAME = "file";` makes the constant `NAME`, the text of
/// `file.sql` with its fragments in place (see the module docs), and lists it in `STATEMENTS`
/// for the tests, so a new statement is its file and one line here.
macro_rules! statements {
    ($($name:ident = $file:literal;)*) => {
        $(
            #[doc = concat!("`", $file, ".sql`.")]
            pub(in crate::queue) const $name: &str =
                include_str!(concat!(env!("OUT_DIR"), "/sql/", $file, ".sql"));
        )*

        /// Every statement, by file name (fragments are not statements).
        #[cfg(test)]
        const STATEMENTS: &[(&str, &str)] = &[$(($file, $name)),*];
    };
}

/// Files that are fragments, not statements: `eligible.sql` and `live_claim.sql` (the rules'
/// SQL sides, `queue::eligibility`), `take_claim.sql` and `claimed_order.sql` (the claim every
/// claiming statement takes, `queue::claims`), the parts the claim-next statements share
/// (`claiming_agent.sql`, `capped_agent.sql`, `claim_next_result.sql`, and the hand-out walks
/// `handout_walk.sql` and `turn_walk.sql` with `serve_turns.sql`: `queue::turns`),
/// `order_columns.sql` (an order as `queue::OrderRow` reads it), `log_columns.sql` (a log entry
/// as `queue::LogRow` reads it), `log_insert.sql` (an order moved to the log) and `key_full.sql`
/// (a concurrency key whose slots are all held).
#[cfg(test)]
const FRAGMENTS: &[&str] = &[
    "eligible",
    "claiming_agent",
    "capped_agent",
    "claim_next_result",
    "handout_walk",
    "turn_walk",
    "serve_turns",
    "live_claim",
    "take_claim",
    "claim_rows",
    "group_agents",
    "group_claim_rows",
    "claimed_order",
    "order_columns",
    "log_columns",
    "log_insert",
    "key_full",
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

statements! {
    // Claiming (docs/design.md §3, §5; `queue::claims`).
    PENDING_FOR_AGENT = "pending_for_agent";
    READ_CLAIMER = "read_claimer";
    CLAIM_NEXT = "claim_next";
    CLAIM_NEXT_GROUP = "claim_next_group";
    CLAIM_NEXT_GROUP_FAIR = "claim_next_group_fair";
    LOCK_CLAIMER = "lock_claimer";
    COUNT_HELD_CLAIMS = "count_held_claims";
    CLAIM_NEXT_CAPPED = "claim_next_capped";
    CLAIM_NEXT_FAIR = "claim_next_fair";
    CLAIM_NEXT_CAPPED_FAIR = "claim_next_capped_fair";
    CLAIM_CANDIDATE = "claim_candidate";
    CLAIM_BY_ID = "claim_by_id";

    // Holding a claim: heartbeat and complete (docs/design.md §2, §5; `queue::claims::holder`).
    RECORD_CONTACT = "record_contact";
    HEARTBEAT = "heartbeat";
    COMPLETE_SUCCESS = "complete_success";
    COMPLETE_SUCCESS_MANY = "complete_success_many";
    LOCK_ORDER_FOR_FAILURE = "lock_order_for_failure";
    END_LIVE_CLAIM = "end_live_claim";
    SCHEDULE_RETRY = "schedule_retry";
    REQUEUE_DISRUPTED = "requeue_disrupted";

    // Refusals and replays of heartbeat and complete (`queue::refusal`).
    REFUSAL_ACTIVE = "refusal_active";
    REFUSAL_FINISHED = "refusal_finished";
    RETRY_SCHEDULED_BY_HOLDER = "retry_scheduled_by_holder";
    COMPLETED_BY_HOLDER = "completed_by_holder";

    // Orders: create, read, list, cancel, finish (`queue::orders`).
    INSERT_ORDER = "insert_order";
    SUPERSEDE = "supersede";
    DROP_IDLE_SLOTS = "drop_idle_slots";
    KEY_HOLDERS = "key_holders";
    ORDER_FINISHED = "order_finished";
    INSERT_IDEMPOTENCY_KEY = "insert_idempotency_key";
    RECORD_IDEMPOTENT_RESPONSE = "record_idempotent_response";
    IDEMPOTENCY_KEY = "idempotency_key";
    GET_ORDER = "get_order";
    GET_ORDER_SUMMARY = "get_order_summary";
    LIST_WORK_ORDERS = "list_work_orders";
    LOCK_ORDER = "lock_order";
    CANCEL_CLAIM = "cancel_claim";
    FINISH_ORDER = "finish_order";
    GET_LOG_ENTRY = "get_log_entry";
    GET_LOG_ENTRY_SUMMARY = "get_log_entry_summary";
    LIST_LOG = "list_log";
    ATTEMPTS = "attempts";

    // Agents (`queue::registry`).
    INSERT_AGENT = "insert_agent";
    UPDATE_AGENT = "update_agent";
    INSERT_AGENT_TOKEN = "insert_agent_token";
    REVOKE_AGENT_TOKENS = "revoke_agent_tokens";
    LIVE_AGENT_TOKEN = "live_agent_token";
    LOCK_AGENT = "lock_agent";
    RETIRE_AGENT = "retire_agent";
    AWAIT_AGENT_STATEMENTS = "await_agent_statements";
    RETIRED_WITH_CLAIMS = "retired_with_claims";
    LOCK_RETIRED_AGENT = "lock_retired_agent";
    RELEASE_AGENT_CLAIMS = "release_agent_claims";
    GET_AGENT = "get_agent";
    AGENT_NAMED = "agent_named";
    LIST_AGENTS = "list_agents";

    // Maintenance (docs/design.md §2, §7; `queue::maintenance`).
    FIND_EXPIRED_CLAIMS = "find_expired_claims";
    RELEASE_EXPIRED_CLAIMS = "release_expired_claims";
    REQUEUE_RECLAIMED = "requeue_reclaimed";
    PROMOTE_DUE_RETRIES = "promote_due_retries";
    NEXT_RETRY_DUE_IN = "next_retry_due_in";
    LOG_CUTOFF = "log_cutoff";
    EXPIRE_LOG = "expire_log";
    EXPIRE_IDEMPOTENCY_KEYS = "expire_idempotency_keys";
    OLDEST_CLAIMABLE_AGE = "oldest_claimable_age";
    AGENT_CONTACTS = "agent_contacts";

    // Tenant turns (docs/design.md §3; `queue::turns`).
    COMPETING_TENANTS = "competing_tenants";
    IDLE_TURNS = "idle_turns";
    LOCK_TENANT_TURNS = "lock_tenant_turns";
    DROP_IDLE_TURNS = "drop_idle_turns";
    PARK_TURNS = "park_turns";
    UNPARK_STRANDED_TURNS = "unpark_stranded_turns";

    // Why an order waits (docs/design.md §10, §12), and backlogs (`queue::explain`, `queue::backlog`).
    WAITING_ORDER = "waiting_order";
    CLAIM_WAITING = "claim_waiting";
    WAITING_AGENTS = "waiting_agents";
    QUEUE_POSITION = "queue_position";
    BACKLOG = "backlog";
    TENANT_COUNTS = "tenant_counts";
    WAITING_BY_PROFILE = "waiting_by_profile";
    WAITING_ORDERS = "waiting_orders";

    // The database gauges of /metrics, off the scrape path (docs/design.md §10; `queue::gauges`).
    COUNT_BY_STATUS = "count_by_status";
    TAKE_GAUGE_TURN = "take_gauge_turn";
    RELEASE_GAUGE_TURN = "release_gauge_turn";
    STORE_GAUGES = "store_gauges";
    READ_GAUGES = "read_gauges";

    // Output of running orders (docs/design.md §9; `queue::output`).
    OUTPUT_FENCE = "output_fence";
    OUTPUT_INSERT = "output_insert";
    OUTPUT_STORED_CHUNK = "output_stored_chunk";
    OUTPUT_TRIM = "output_trim";
    OUTPUT_STATE = "output_state";
    OUTPUT_PAGE = "output_page";
    OUTPUT_TAIL = "output_tail";
    OUTPUT_READER_HOLDS = "output_reader_holds";
    OUTPUT_FOLLOW = "output_follow";
    OUTPUT_UNFOLLOW = "output_unfollow";
    EXPIRE_FOLLOWERS = "expire_followers";

    // Health and readiness (`queue`).
    APPLIED_MIGRATIONS = "applied_migrations";
}

#[cfg(test)]
mod tests {
    use super::*;

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
