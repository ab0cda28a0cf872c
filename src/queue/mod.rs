//! The work-order queue on PostgreSQL (docs/design.md §1–§5): every state change of a work order is one
//! transaction whose `WHERE` states what must still be true, so a late or duplicate writer changes
//! nothing.
//!
//! Lock order, kept by every transaction to rule out deadlocks: agent row → work order row → claim
//! row → tenant turn row (`tenant_turns`, taken last and with `SKIP LOCKED`, never awaited). The
//! reaper takes rows with `SKIP LOCKED` and never waits. Claim-next and successful completes hold
//! the agent row FOR KEY SHARE, so one agent's statements run side by side, and write its contact
//! `SKIP LOCKED` at their end; what must wait for them takes it FOR UPDATE (the second step of a
//! retirement: `sql/claiming_agent.sql`, `Queue::retire_agent`; maintenance's release of what a
//! retirement cut short left held takes it `SKIP LOCKED`). Maintenance locks the whole
//! `tenant_turns` table for a moment (`Queue::drop_idle_turns`), with a 100 ms lock timeout, so
//! it gives up rather than hold claims off.
//!
//! Where things live:
//! - **Statements**: every SQL statement is one file in `src/queue/sql/`, named after its
//!   operation (`claim_next.sql`, `complete_success.sql`, `find_expired_claims.sql`, …), its
//!   parameters listed at its head; `sql/mod.rs` indexes them by concern. Claim-next is
//!   `claim_next.sql`, and `claim_next_capped.sql` for an agent with `max_concurrency`; while
//!   tenants compete, `claim_next_fair.sql` and `claim_next_capped_fair.sql` (`turns`). No
//!   statement is assembled at run time.
//! - **Rules**: eligibility (docs/design.md §3) and claim liveness (§2) in [`eligibility`], Rust and
//!   SQL side by side, with the tests that keep the copies in step; retries, the watch budget
//!   and agent health (§2, §4, §5) in [`rules`]; claim-next's long-poll in `long_poll`, and the
//!   wait list that wakes it in `wake`.
//! - **Operations**: claiming in `claims` (pending list, claim by id, claim-next), holding a
//!   claim in `claims::holder` (heartbeat; complete, success in one statement and failure as a
//!   transaction), refusals and replays in `refusal`, orders and the log in `orders`,
//!   agents and the storage of their tokens in `registry` (checking tokens is `crate::auth`'s),
//!   maintenance (reaper, retry promotion, retention) in `maintenance`, tenant turns (fair
//!   share, docs/design.md §3) in `turns`, why an order waits
//!   (docs/design.md §10) in `waiting` (the rule, pure) and `explain` (its reads).

mod availability;
pub mod backlog;
mod claims;
mod cursor;
pub mod eligibility;
#[cfg(all(test, feature = "testing"))]
mod eligibility_agreement;
mod explain;
pub mod gauges;
mod group_commit;
mod history;
pub mod keys;
pub mod limits;
mod long_poll;
mod maintenance;
pub mod model;
mod notify;
mod orders;
pub mod output;
mod refusal;
mod registry;
pub mod rules;
mod sql;
pub mod text;
mod turns;
pub mod validate;
pub mod waiting;
#[cfg(all(test, feature = "testing"))]
mod waiting_agreement;
mod wake;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use sqlx::types::Json;
use uuid::Uuid;

pub use availability::{spawn_availability_probe, standby_refused};
pub use claims::{ClaimRequest, Heartbeat};
pub use cursor::CursorError;
pub use keys::{Concurrency, NewConcurrency, OnConflict};
pub use maintenance::{AgentHealthCounts, MaintenanceReport, run_maintenance};
pub use model::*;
pub use notify::{Notifications, check_delivery, spawn_listener};
pub use orders::{
    Created, IDEMPOTENCY_KEY_RETENTION, IdPrefix, IdempotencyKey, LogFilter, OrderFilter,
};
pub use registry::StoredAgentToken;

/// `source` of an order created through the REST API.
pub const SOURCE_API: &str = "api";
/// `source` of an order created from a `WorkOrder` resource. Only these orders send
/// `pullman_work_order_changed` (migration `20261201000001`), because only the controller listens.
pub const SOURCE_KUBERNETES: &str = "kubernetes";

/// Embedded migrations (`migrations/`).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Why a 409 was answered to a heartbeat or complete (docs/design.md §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConflictCode {
    /// The order was cancelled while this agent held it.
    Cancelled,
    /// This agent's claim was released by the reaper (or its lease ran out) or by retirement.
    Reclaimed,
    /// This agent does not hold the current claim.
    NotClaimHolder,
    /// Claim by id: the order is claimed by someone.
    AlreadyClaimed,
    /// Claim by id: the order is backing off until `next_retry_after`.
    BackingOff,
    /// Claim by id: the agent already holds `max_concurrency` claims.
    MaxConcurrency,
    /// Claim by id: the order's concurrency key holds `max` claims (docs/design.md §3).
    ConcurrencyLimited,
    /// Cancel of an order that already finished.
    AlreadyFinished,
    /// Agent name taken by a live agent.
    NameTaken,
    /// Operation on a retired agent.
    AgentRetired,
    /// Complete: this agent already completed this claim with a different outcome.
    AlreadyCompleted,
    /// Create: the `Idempotency-Key` was used before with a different request body.
    IdempotencyKeyReused,
    /// Re-run of an order that has not finished.
    NotFinished,
    /// Explain of an order that is claimed, so it does not wait (docs/design.md §10).
    NotWaiting,
}

impl ConflictCode {
    /// The `code` of the JSON error body.
    pub fn as_str(self) -> &'static str {
        match self {
            ConflictCode::Cancelled => "cancelled",
            ConflictCode::Reclaimed => "reclaimed",
            ConflictCode::NotClaimHolder => "not_claim_holder",
            ConflictCode::AlreadyClaimed => "already_claimed",
            ConflictCode::BackingOff => "backing_off",
            ConflictCode::MaxConcurrency => "max_concurrency",
            ConflictCode::ConcurrencyLimited => "concurrency_limited",
            ConflictCode::AlreadyFinished => "already_finished",
            ConflictCode::NameTaken => "name_taken",
            ConflictCode::AgentRetired => "agent_retired",
            ConflictCode::AlreadyCompleted => "already_completed",
            ConflictCode::IdempotencyKeyReused => "idempotency_key_reused",
            ConflictCode::NotFinished => "not_finished",
            ConflictCode::NotWaiting => "not_waiting",
        }
    }
}

/// Everything the queue can refuse; the API maps each variant to one status code.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// `400`: a field failed validation.
    #[error("{message}")]
    Invalid { field: String, message: String },
    /// `400`: docs/design.md §4's `Unknown work type: <value>`.
    #[error("Unknown work type: {value}")]
    UnknownWorkType { field: String, value: String },
    /// `413`: a field is over its size limit (bytes).
    #[error("{field} is larger than {limit} bytes")]
    TooLarge { field: String, limit: usize },
    /// `404`: nothing with this id (or not visible to the asking agent).
    #[error("{what} {id} not found")]
    NotFound { what: &'static str, id: String },
    /// `404`: the work order already finished and is in the log.
    #[error("work order {id} already finished ({outcome}); see /api/v1/work-order-log/{id}")]
    Finished { id: Uuid, outcome: &'static str },
    /// `409`: the state does not allow it; nothing was changed.
    #[error("{message}")]
    Conflict { code: ConflictCode, message: String },
    /// `400`: a pagination cursor that this server did not issue.
    #[error(transparent)]
    Cursor(#[from] CursorError),
    /// `503`: the database cannot be reached or is shutting down; retrying later may succeed.
    /// Nothing was changed that the caller must know of (a transaction cut off is rolled back).
    #[error("database unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    /// `500`: any other database failure.
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
}

impl From<sqlx::Error> for QueueError {
    fn from(error: sqlx::Error) -> Self {
        if database_unavailable(&error) {
            QueueError::Unavailable(error)
        } else {
            QueueError::Database(error)
        }
    }
}

/// True for errors that mean "the database is not there right now" rather than "this request
/// is wrong": no connection (refused, reset, pool exhausted or closed), or the server shutting
/// down or refusing connections (SQLSTATE class 08, 57P01–57P03, 53300 too_many_connections),
/// or not accepting writes now (25006 read_only_sql_transaction: a primary made read-only, as
/// while a failover is under way; issue #41). A standby is refused when connecting
/// (`serve::pool_options`), as an I/O error. A peer that does not speak PostgreSQL's start-up
/// is an outage too: while a failover moves a Service, its address can lead for a moment to
/// something else (no rules yet, so a default route and whatever answers there; seen in CI as
/// an HTTP `400` to the SSLRequest). That error comes before any statement ran.
pub fn database_unavailable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Protocol(message) => {
            message.starts_with("unexpected response from SSLRequest")
                || message.starts_with("establish: unexpected message")
        }
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08")
                || matches!(&*code, "57P01" | "57P02" | "57P03" | "53300" | "25006")
        }),
        _ => false,
    }
}

impl QueueError {
    pub(crate) fn conflict(code: ConflictCode, message: impl Into<String>) -> Self {
        QueueError::Conflict {
            code,
            message: message.into(),
        }
    }
}

/// Handle on the queue: a connection pool plus the rules. Cheap to clone.
#[derive(Clone)]
pub struct Queue {
    pool: PgPool,
    /// See [`Queue::token_revocations`].
    token_revocations: std::sync::Arc<std::sync::atomic::AtomicU64>,
    availability: std::sync::Arc<availability::Availability>,
    /// Rung when this process schedules a retry, so that maintenance can wake when it falls due
    /// (see [`run_maintenance`]).
    retry_scheduled: std::sync::Arc<tokio::sync::Notify>,
    /// Successful completes share statements and commits when set ([`Queue::with_group_commit`]).
    group_commit: Option<group_commit::GroupCommit>,
    /// One-order claims share statements and commits when set ([`Queue::with_group_claims`]).
    group_claims: Option<claims::GroupClaims>,
    /// Whether tenants compete, so that claims walk their turns (`queue::turns`).
    turns: std::sync::Arc<turns::TurnMode>,
    /// The live agents as the Schedulable condition last read them ([`Queue::waits`]).
    recent_agents: std::sync::Arc<explain::RecentAgents>,
}

impl Queue {
    /// Wraps a pool whose database has the migrations applied.
    pub fn new(pool: PgPool) -> Self {
        Queue {
            pool,
            token_revocations: Default::default(),
            availability: Default::default(),
            retry_scheduled: Default::default(),
            group_commit: None,
            group_claims: None,
            turns: Default::default(),
            recent_agents: Default::default(),
        }
    }

    /// The same queue with group commit of successful completes (`queue::group_commit`):
    /// completes arriving together share one statement and one commit, up to `max_batch`
    /// (`queue::limits::COMPLETE_BATCH`). Starts the runners on the current tokio runtime;
    /// `serve` turns it on (`--complete-batch`). A `max_batch` of 1 turns it off: each complete
    /// runs its own statement on its own connection, as many at once as the pool allows, rather
    /// than one at a time per runner (a complete waiting on a row lock then holds up no other).
    pub fn with_group_commit(mut self, max_batch: usize) -> Self {
        self.group_commit =
            (max_batch > 1).then(|| group_commit::GroupCommit::start(self.pool.clone(), max_batch));
        self
    }

    /// The same queue with group claims (`queue::claims::group`): one-order claims of several
    /// agents arriving together share one statement and one commit, up to `max_batch` agents
    /// (`queue::limits::CLAIM_BATCH_MAX`), each handed only what it may take; a claim the group
    /// cannot serve runs alone, as without. Starts the runners on the current tokio runtime;
    /// `serve` turns it on (`--claim-batch`); a `max_batch` of 1 turns it off.
    pub fn with_group_claims(mut self, max_batch: usize) -> Self {
        self.group_claims =
            (max_batch > 1).then(|| claims::GroupClaims::start(self.pool.clone(), max_batch));
        self
    }

    /// The underlying pool (for readiness checks and listeners).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies pending migrations.
    pub async fn migrate(&self) -> Result<(), sqlx::migrate::MigrateError> {
        MIGRATOR.run(&self.pool).await
    }

    /// Readiness (docs/design.md §5 `/readyz`): the database answers and every embedded migration is
    /// applied. Returns a reason when not ready.
    pub async fn readiness(&self) -> Result<(), String> {
        if self.database_known_down() {
            return Err(match self.last_probe_error() {
                Some(error) => format!("database not reachable (known down; probing): {error}"),
                None => "database not reachable (known down; probing)".into(),
            });
        }
        let applied: Vec<(i64,)> = sqlx::query_as(sql::APPLIED_MIGRATIONS)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| format!("database not reachable or not migrated: {e}"))?;
        for m in MIGRATOR.iter() {
            if !applied.iter().any(|(v,)| *v == m.version) {
                return Err(format!("migration {} not applied", m.version));
            }
        }
        Ok(())
    }
}

/// An active order's targeting as its `target_*` columns hold it (the log keeps it as one
/// `targeting` document instead).
#[derive(sqlx::FromRow)]
pub(crate) struct TargetingColumns {
    target_agent_ids: Vec<Uuid>,
    target_agent_names: Vec<String>,
    target_labels: Vec<String>,
    target_annotations: Json<BTreeMap<String, String>>,
}

impl From<TargetingColumns> for Targeting {
    fn from(c: TargetingColumns) -> Self {
        Targeting {
            agent_ids: c.target_agent_ids,
            agent_names: c.target_agent_names,
            labels: c.target_labels,
            annotations: c.target_annotations.0,
        }
    }
}

/// An active order joined with its live claim, as every statement returning orders selects it
/// (`sql/get_order.sql` and others).
#[derive(sqlx::FromRow)]
pub(crate) struct OrderRow {
    id: Uuid,
    work_type: String,
    yaml_content: Option<String>,
    status: String,
    max_retries: i32,
    backoff_seconds: i32,
    claim_timeout_seconds: i32,
    max_reclaims: i32,
    priority: i32,
    concurrency_key: Option<String>,
    concurrency_max: Option<i32>,
    concurrency_on_conflict: Option<String>,
    retry_on_disruption: String,
    tenant: Option<String>,
    #[sqlx(flatten)]
    targeting: TargetingColumns,
    retry_count: i32,
    reclaim_count: i32,
    last_error: Option<String>,
    last_error_at: Option<DateTime<Utc>>,
    next_retry_after: Option<DateTime<Utc>>,
    claimed_by: Option<Uuid>,
    claimed_at: Option<DateTime<Utc>>,
    claim_id: Option<Uuid>,
    lease_seconds: Option<i32>,
    lease_expires_at: Option<DateTime<Utc>>,
    rerun_of: Option<Uuid>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl From<OrderRow> for WorkOrder {
    fn from(r: OrderRow) -> Self {
        WorkOrder {
            id: r.id,
            work_type: WorkType::parse(&r.work_type).unwrap_or(WorkType::Custom),
            yaml_content: r.yaml_content,
            status: OrderStatus::parse(&r.status).unwrap_or(OrderStatus::Pending),
            max_retries: r.max_retries,
            backoff_seconds: r.backoff_seconds,
            claim_timeout_seconds: r.claim_timeout_seconds,
            max_reclaims: r.max_reclaims,
            priority: r.priority,
            concurrency: Concurrency::from_columns(
                r.concurrency_key,
                r.concurrency_max,
                r.concurrency_on_conflict,
            ),
            tenant: r.tenant,
            targeting: r.targeting.into(),
            // The column's CHECK allows only the two spellings.
            retry_on_disruption: RetryOnDisruption::parse(&r.retry_on_disruption)
                .unwrap_or_default(),
            retry_count: r.retry_count,
            reclaim_count: r.reclaim_count,
            last_error: r.last_error,
            last_error_at: r.last_error_at,
            next_retry_after: r.next_retry_after,
            claimed_by: r.claimed_by,
            claimed_at: r.claimed_at,
            claim_id: r.claim_id,
            lease_seconds: r.lease_seconds,
            lease_expires_at: r.lease_expires_at,
            rerun_of: r.rerun_of,
            attempts: None,
            waiting: None,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

/// A log entry, as every statement returning log entries selects it (`sql/log_columns.sql`).
#[derive(sqlx::FromRow)]
pub(crate) struct LogRow {
    id: Uuid,
    work_type: String,
    yaml_content: Option<String>,
    outcome: String,
    message: Option<String>,
    max_retries: i32,
    backoff_seconds: i32,
    claim_timeout_seconds: i32,
    max_reclaims: i32,
    priority: i32,
    concurrency_key: Option<String>,
    concurrency_max: Option<i32>,
    concurrency_on_conflict: Option<String>,
    retry_on_disruption: String,
    tenant: Option<String>,
    targeting: Json<Targeting>,
    retry_count: i32,
    reclaim_count: i32,
    last_error: Option<String>,
    last_error_at: Option<DateTime<Utc>>,
    claimed_by: Option<Uuid>,
    claim_id: Option<Uuid>,
    claimed_at: Option<DateTime<Utc>>,
    rerun_of: Option<Uuid>,
    created_at: DateTime<Utc>,
    completed_at: DateTime<Utc>,
}

impl From<LogRow> for LogEntry {
    fn from(r: LogRow) -> Self {
        let outcome = Outcome::parse(&r.outcome);
        LogEntry {
            id: r.id,
            work_type: WorkType::parse(&r.work_type).unwrap_or(WorkType::Custom),
            yaml_content: r.yaml_content,
            outcome,
            success: outcome == Outcome::Succeeded,
            message: r.message,
            max_retries: r.max_retries,
            backoff_seconds: r.backoff_seconds,
            claim_timeout_seconds: r.claim_timeout_seconds,
            max_reclaims: r.max_reclaims,
            priority: r.priority,
            concurrency: Concurrency::from_columns(
                r.concurrency_key,
                r.concurrency_max,
                r.concurrency_on_conflict,
            ),
            tenant: r.tenant,
            targeting: r.targeting.0,
            retry_on_disruption: RetryOnDisruption::parse(&r.retry_on_disruption)
                .unwrap_or_default(),
            retry_count: r.retry_count,
            reclaim_count: r.reclaim_count,
            last_error: r.last_error,
            last_error_at: r.last_error_at,
            claimed_by: r.claimed_by,
            claim_id: r.claim_id,
            claimed_at: r.claimed_at,
            rerun_of: r.rerun_of,
            attempts: None,
            created_at: r.created_at,
            completed_at: r.completed_at,
        }
    }
}
