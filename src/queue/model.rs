//! Wire and storage shapes of work orders, agents and log entries (docs/design.md §1, §5), and (in
//! `waits`) of why an order waits (§10, §12; the rule that decides it is `queue::waiting`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::keys::shapes::{Concurrency, NewConcurrency};

mod waits;
pub use waits::{ClaimWaiting, Explanation, KeyWait, NodeWait, WaitReason};

/// The kind of work an order carries (docs/design.md §4). Anything else is rejected at creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WorkType {
    /// A Shipwright `Build`; the executor creates a `BuildRun` and watches it.
    Build,
    /// One or more Kubernetes objects applied with server-side apply; Jobs among them are watched.
    Custom,
}

impl WorkType {
    /// The wire and database spelling: `build` or `custom`.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkType::Build => "build",
            WorkType::Custom => "custom",
        }
    }

    /// Parses the wire spelling; `None` for anything else (callers answer `Unknown work type: <v>`).
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "build" => Some(WorkType::Build),
            "custom" => Some(WorkType::Custom),
            _ => None,
        }
    }

    /// Parses stored spellings (an agent's capabilities), skipping any this version does not know.
    pub fn parse_all(values: &[String]) -> Vec<Self> {
        values.iter().filter_map(|t| WorkType::parse(t)).collect()
    }
}

impl std::fmt::Display for WorkType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `work_type` as a create request names it (docs/design.md §4, §5): one this version knows, or
/// the text it does not, kept so that validation can answer `400 Unknown work type: <value>`
/// naming it rather than a JSON type error. On the wire it is the string itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestedWorkType {
    Known(WorkType),
    Unknown(String),
}

impl From<WorkType> for RequestedWorkType {
    fn from(t: WorkType) -> Self {
        RequestedWorkType::Known(t)
    }
}

impl From<&str> for RequestedWorkType {
    fn from(value: &str) -> Self {
        match WorkType::parse(value) {
            Some(t) => RequestedWorkType::Known(t),
            None => RequestedWorkType::Unknown(value.to_string()),
        }
    }
}

impl Serialize for RequestedWorkType {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(match self {
            RequestedWorkType::Known(t) => t.as_str(),
            RequestedWorkType::Unknown(value) => value,
        })
    }
}

impl<'de> Deserialize<'de> for RequestedWorkType {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = String::deserialize(deserializer)?;
        Ok(match WorkType::parse(&value) {
            Some(t) => RequestedWorkType::Known(t),
            None => RequestedWorkType::Unknown(value),
        })
    }
}

/// Active states of a work order (docs/design.md §2). Finished orders live in the log instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OrderStatus {
    Pending,
    Claimed,
    RetryPending,
}

impl OrderStatus {
    /// The wire and database spelling, e.g. `RETRY_PENDING`.
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Pending => "PENDING",
            OrderStatus::Claimed => "CLAIMED",
            OrderStatus::RetryPending => "RETRY_PENDING",
        }
    }

    /// Parses the wire spelling; `None` for anything else.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "PENDING" => Some(OrderStatus::Pending),
            "CLAIMED" => Some(OrderStatus::Claimed),
            "RETRY_PENDING" => Some(OrderStatus::RetryPending),
            _ => None,
        }
    }
}

/// How a finished work order ended (docs/design.md §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Succeeded,
    Failed,
    Cancelled,
}

impl Outcome {
    /// The wire and database spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Cancelled => "cancelled",
        }
    }

    /// Parses the database spelling; unknown values read as `failed`, which the CHECK constraint
    /// makes unreachable.
    pub fn parse(value: &str) -> Self {
        match value {
            "succeeded" => Outcome::Succeeded,
            "cancelled" => Outcome::Cancelled,
            _ => Outcome::Failed,
        }
    }
}

/// Which agents may see an order (docs/design.md §3): a match on **any** criterion is enough. At
/// creation at least one criterion must be non-empty (`400 invalid_field` otherwise); an absent
/// criterion is empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Targeting {
    /// Agent ids, any of which may claim.
    #[serde(default)]
    pub agent_ids: Vec<Uuid>,
    /// Agent names (an Executor's agent is `<namespace>/<name>`).
    #[serde(default)]
    pub agent_names: Vec<String>,
    /// Labels (plain strings, exact match); an agent with any of them matches.
    #[serde(default)]
    pub labels: Vec<String>,
    /// Annotations; an agent with any one of these keys set to the same value matches.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

impl Targeting {
    /// True when no criterion is given (rejected at creation, docs/design.md §3).
    pub fn is_empty(&self) -> bool {
        self.agent_ids.is_empty()
            && self.agent_names.is_empty()
            && self.labels.is_empty()
            && self.annotations.is_empty()
    }
}

/// Body of `POST /api/v1/work-orders` (docs/design.md §5). Numbers arrive as wide integers so that an
/// out-of-range value is reported against its bound rather than as a JSON type error.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewWorkOrder {
    /// `build` or `custom` (anything else: `400 Unknown work type: <value>`).
    #[schema(value_type = WorkType)]
    pub work_type: RequestedWorkType,
    /// One or more YAML documents, at most 1 MiB (`413` above), each with `apiVersion`, `kind`
    /// and `metadata`, nested at most 128 levels; a `build` holds exactly one Shipwright `Build`.
    #[schema(
        example = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: hello\ndata:\n  greeting: hi\n"
    )]
    pub yaml_content: String,
    /// Retries after a failed attempt, 0–100 (default 3).
    #[serde(default)]
    pub max_retries: Option<i64>,
    /// Base of the exponential backoff in seconds, 1–86400 (default 60).
    #[serde(default)]
    pub backoff_seconds: Option<i64>,
    /// Seconds a claim may last from `claimed_at`, 60–604800 (default 3600); at least 120 for
    /// orders that must be watched (Jobs, builds).
    #[serde(default)]
    pub claim_timeout_seconds: Option<i64>,
    /// Reclaims by the reaper before the order fails, 0–100 (default 5).
    #[serde(default)]
    pub max_reclaims: Option<i64>,
    /// Of the orders an agent may take, the higher priority is handed out first, then the
    /// older; -1000–1000 (default 0) (docs/design.md §3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    /// At most `max` orders of `key` (per tenant) hold a claim at once; `on_conflict: supersede`
    /// cancels the key's waiting orders when this one is created (docs/design.md §3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<NewConcurrency>,
    /// Only agents of this tenant (or instance-wide agents) may claim. 1–4096 characters.
    #[serde(default)]
    pub tenant: Option<String>,
    /// Which agents may claim; at least one criterion.
    pub targeting: Targeting,
    /// Whether an attempt ended by a disruption is run again (docs/design.md §12): `never`
    /// (default) or `safe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<RetryOnDisruption>)]
    pub retry_on_disruption: Option<String>,
}

/// What an attempt ended by a disruption (eviction, drain, preemption, a lost node) does to its
/// order (docs/design.md §12).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RetryOnDisruption {
    /// The order fails; the attempt is recorded as `disrupted`.
    #[default]
    Never,
    /// The order runs again at once (not counted as a retry, counted as a reclaim), but only
    /// when the agent reports that the disrupted run is known to have stopped, so runs never
    /// overlap.
    Safe,
}

impl RetryOnDisruption {
    /// The stored and wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RetryOnDisruption::Never => "never",
            RetryOnDisruption::Safe => "safe",
        }
    }

    /// The policy spelled `s`, if it is one.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "never" => Some(RetryOnDisruption::Never),
            "safe" => Some(RetryOnDisruption::Safe),
            _ => None,
        }
    }
}

/// An active work order as the API returns it (docs/design.md §5). `yaml_content` is present only where
/// the route returns one order in full (get, claim); lists leave it out.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WorkOrder {
    pub id: Uuid,
    pub work_type: WorkType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yaml_content: Option<String>,
    pub status: OrderStatus,
    pub max_retries: i32,
    pub backoff_seconds: i32,
    pub claim_timeout_seconds: i32,
    pub max_reclaims: i32,
    /// Higher first among one tenant's orders (docs/design.md §3). Absent from servers before
    /// it (read as 0).
    #[serde(default)]
    #[schema(required = true)]
    pub priority: i32,
    /// Its concurrency key, if any (docs/design.md §3). Absent from servers before it.
    #[serde(default)]
    #[schema(required = true)]
    pub concurrency: Option<Concurrency>,
    #[schema(required = true)]
    pub tenant: Option<String>,
    pub targeting: Targeting,
    /// What a disrupted attempt does to the order (docs/design.md §12). Absent from servers
    /// before it (read as `never`).
    #[serde(default)]
    #[schema(required = true)]
    pub retry_on_disruption: RetryOnDisruption,
    pub retry_count: i32,
    pub reclaim_count: i32,
    #[schema(required = true)]
    pub last_error: Option<String>,
    #[schema(required = true)]
    pub last_error_at: Option<DateTime<Utc>>,
    #[schema(required = true)]
    pub next_retry_after: Option<DateTime<Utc>>,
    /// Agent holding the current claim.
    #[schema(required = true)]
    pub claimed_by: Option<Uuid>,
    #[schema(required = true)]
    pub claimed_at: Option<DateTime<Utc>>,
    /// Fencing token of the current claim.
    #[schema(required = true)]
    pub claim_id: Option<Uuid>,
    /// Lease length in seconds, when the claim was made with one.
    #[schema(required = true)]
    pub lease_seconds: Option<i32>,
    #[schema(required = true)]
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// The finished order this one re-runs (`POST /work-orders/{id}/rerun`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun_of: Option<Uuid>,
    /// Every claim of the order so far, oldest first; present where one order is returned in
    /// full by `GET /work-orders/{id}` (not in lists or claim answers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<Vec<Attempt>>,
    /// Why the order waits (docs/design.md §10), as `GET /work-orders/{id}/explain` answers it;
    /// present in `GET /work-orders/{id}` for an unclaimed order (not in lists or claims).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<Explanation>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A finished work order: a row of `work_order_log` (docs/design.md §2).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LogEntry {
    pub id: Uuid,
    pub work_type: WorkType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yaml_content: Option<String>,
    pub outcome: Outcome,
    /// `outcome == succeeded`.
    pub success: bool,
    #[schema(required = true)]
    pub message: Option<String>,
    pub max_retries: i32,
    pub backoff_seconds: i32,
    pub claim_timeout_seconds: i32,
    pub max_reclaims: i32,
    /// Higher first among one tenant's orders (docs/design.md §3). Absent from servers before
    /// it (read as 0).
    #[serde(default)]
    #[schema(required = true)]
    pub priority: i32,
    /// Its concurrency key, if any (docs/design.md §3). Absent from servers before it.
    #[serde(default)]
    #[schema(required = true)]
    pub concurrency: Option<Concurrency>,
    #[schema(required = true)]
    pub tenant: Option<String>,
    pub targeting: Targeting,
    /// What a disrupted attempt did to the order (docs/design.md §12). Absent from servers
    /// before it (read as `never`).
    #[serde(default)]
    #[schema(required = true)]
    pub retry_on_disruption: RetryOnDisruption,
    pub retry_count: i32,
    pub reclaim_count: i32,
    #[schema(required = true)]
    pub last_error: Option<String>,
    #[schema(required = true)]
    pub last_error_at: Option<DateTime<Utc>>,
    /// Agent of the last claim, if any.
    #[schema(required = true)]
    pub claimed_by: Option<Uuid>,
    #[schema(required = true)]
    pub claim_id: Option<Uuid>,
    #[schema(required = true)]
    pub claimed_at: Option<DateTime<Utc>>,
    /// The finished order this one re-ran, if it was a re-run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun_of: Option<Uuid>,
    /// Every claim of the order, oldest first; present in `GET /work-order-log/{id}` (not in
    /// lists or complete answers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<Vec<Attempt>>,
    pub created_at: DateTime<Utc>,
    pub completed_at: DateTime<Utc>,
}

/// How one attempt (one claim) of a work order ended, or `running` while its claim is live
/// (docs/design.md §5 `GET /work-orders/{id}/attempts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AttemptResult {
    /// The claim is live.
    Running,
    /// The agent reported success; the order went to the log as `succeeded`.
    Succeeded,
    /// The agent reported a failure that ended the order (retries used up, or not retryable).
    Failed,
    /// The agent reported a failure and a retry was scheduled.
    RetryScheduled,
    /// The reaper released the claim: its lease or claim timeout ran out. The order went back to
    /// `PENDING`, or to the log as `failed` once `max_reclaims` was used up.
    Reclaimed,
    /// The agent was retired while it held the claim; the order went back to `PENDING`.
    Released,
    /// The order was cancelled while this claim was live.
    Cancelled,
    /// A disruption (eviction, drain, preemption, a lost node) ended it, as the agent reported
    /// (docs/design.md §12): the order ran again (`retryOnDisruption: safe`), or went to the log
    /// as `failed`.
    Disrupted,
}

impl AttemptResult {
    /// The wire spelling, e.g. `retry_scheduled`.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptResult::Running => "running",
            AttemptResult::Succeeded => "succeeded",
            AttemptResult::Failed => "failed",
            AttemptResult::RetryScheduled => "retry_scheduled",
            AttemptResult::Reclaimed => "reclaimed",
            AttemptResult::Released => "released",
            AttemptResult::Cancelled => "cancelled",
            AttemptResult::Disrupted => "disrupted",
        }
    }
}

/// One claim of a work order (docs/design.md §5 `GET /work-orders/{id}/attempts`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Attempt {
    /// The agent that held the claim.
    pub agent_id: Uuid,
    /// The claim's fencing token.
    pub claim_id: Uuid,
    /// When the claim was made.
    pub started_at: DateTime<Utc>,
    /// When the claim ended; absent while it is live.
    #[schema(required = true)]
    pub ended_at: Option<DateTime<Utc>>,
    /// How it ended.
    pub result: AttemptResult,
    /// The agent's message (a failure's error, a success's result) or why the claim was released.
    #[schema(required = true)]
    pub message: Option<String>,
}

/// Derived health of an agent (docs/design.md §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AgentHealth {
    NeverSeen,
    Active,
    Stale,
    Retired,
}

/// Body of `POST /api/v1/agents` (docs/design.md §5).
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewAgent {
    /// Unique among live agents; 1–253 characters.
    pub name: String,
    #[serde(default)]
    pub labels: Vec<String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Work types this agent takes; empty means all.
    #[serde(default)]
    #[schema(value_type = Vec<WorkType>)]
    pub work_types: Vec<RequestedWorkType>,
    /// Tenant this agent serves; absent means instance-wide. 1–4096 characters.
    #[serde(default)]
    pub tenant: Option<String>,
    /// Most claims held at once, 1–100000; absent means unlimited.
    #[serde(default)]
    pub max_concurrency: Option<i64>,
    /// Expected lease in seconds, 5–86400; drives the stale threshold before the agent's first
    /// leased claim.
    #[serde(default)]
    pub lease_seconds: Option<i64>,
}

/// An agent as the API returns it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Agent {
    pub id: Uuid,
    pub name: String,
    pub labels: Vec<String>,
    pub annotations: BTreeMap<String, String>,
    pub work_types: Vec<WorkType>,
    #[schema(required = true)]
    pub tenant: Option<String>,
    #[schema(required = true)]
    pub max_concurrency: Option<i32>,
    #[schema(required = true)]
    pub lease_seconds: Option<i32>,
    pub health: AgentHealth,
    /// Claims this agent holds now.
    pub active_claims: i64,
    pub created_at: DateTime<Utc>,
    #[schema(required = true)]
    pub last_seen_at: Option<DateTime<Utc>>,
    #[schema(required = true)]
    pub retired_at: Option<DateTime<Utc>>,
}

/// `201` body of agent registration and token rotation: the token is shown this once.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AgentWithToken {
    pub agent: Agent,
    pub token: String,
}

/// What a completing agent reports (docs/design.md §5 `complete`).
#[derive(Debug, Clone)]
pub struct Completion {
    pub success: bool,
    pub message: Option<String>,
    /// Default true; false sends a failure straight to the log. For a disrupted attempt: the
    /// disrupted run is known to have stopped, so a new one may start (§12).
    pub retryable: bool,
    /// The attempt was ended by a disruption, not by the work (docs/design.md §12); only with
    /// `success: false`.
    pub disrupted: bool,
}

/// Result of `complete`: either the order finished (`200` with the log entry) or a retry was
/// scheduled (`202`).
#[derive(Debug, Clone)]
pub enum CompletionResult {
    Finished(Box<LogEntry>),
    RetryScheduled { next_retry_after: DateTime<Utc> },
}

/// One page of a keyset-paginated list. The OpenAPI document describes it per item type
/// (`api::pages`), since utoipa 5 would copy the item schema into a generic one.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Pass as `cursor` to get the next page; null on the last page.
    pub next_cursor: Option<String>,
}

/// Where a work order id was found.
#[derive(Debug, Clone)]
pub enum Lookup {
    Active(Box<WorkOrder>),
    Finished(Box<LogEntry>),
    Unknown,
}
