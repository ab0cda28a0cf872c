//! The shapes both sides of the HTTP API use (docs/design.md §5): the request and answer bodies of the
//! pull protocol and the error body, defined once for the server (`api`, which also describes
//! them in the OpenAPI document) and its clients (`client`, `pull`, `admin`). The shapes of work
//! orders, log entries, agents and output are the queue's own records and are re-exported here,
//! so a client needs nothing but this module.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

pub use crate::queue::Heartbeat;
pub use crate::queue::backlog::Backlog;
pub use crate::queue::model::{
    Agent, AgentHealth, AgentWithToken, Attempt, AttemptResult, ClaimWaiting, Explanation,
    LogEntry, NewAgent, NewWorkOrder, NodeWait, OrderStatus, Outcome, Page, RequestedWorkType,
    RetryOnDisruption, Targeting, WaitReason, WorkOrder, WorkType,
};
pub use crate::queue::output::{
    DroppedReason, OutputAccepted, OutputChunk, OutputEntry, OutputLine, OutputPage, OutputQuery,
};
/// Ends a result message the server cut at its limit (docs/design.md §5).
pub use crate::queue::text::CUT_MARKER;

/// Body of `POST /work-orders/{id}/claim`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimBody {
    pub agent_id: Uuid,
    /// Lease in seconds (5–86400); absent = no lease, the claim timeout alone governs.
    #[serde(default)]
    pub lease_seconds: Option<i64>,
}

/// Body of `POST /agents/{agent_id}/claim` (may be empty).
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimNextBody {
    /// Narrow this claim to these work types (within the agent's capabilities).
    #[serde(default)]
    #[schema(value_type = Option<Vec<WorkType>>)]
    pub work_types: Option<Vec<String>>,
    /// Seconds to wait for an order to appear, at least 0 (larger values than 30 are capped
    /// at 30).
    #[serde(default)]
    #[schema(minimum = 0)]
    pub max_wait_seconds: Option<i64>,
    /// Lease in seconds (5–86400); absent = no lease.
    #[serde(default)]
    pub lease_seconds: Option<i64>,
    /// Multi-claim: claim up to this many orders (1–100) in one request, in hand-out order, within
    /// the agent's free `max_concurrency`. When given, a `200` answers `ClaimedOrders` (a list,
    /// even of one); when absent, one order is claimed and answered as the order itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_orders: Option<i64>,
}

/// Answer of a multi-claim (`POST /agents/{id}/claim` with `max_orders`): the orders claimed,
/// in hand-out order, each with its own `claim_id`; never empty (nothing claimed is `204`).
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct ClaimedOrders {
    pub orders: Vec<WorkOrder>,
}

/// Body of `POST /work-orders/{id}/heartbeat`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatBody {
    pub agent_id: Uuid,
    /// The claim's fencing token; when given, only that claim is extended.
    #[serde(default)]
    pub claim_id: Option<Uuid>,
    /// What holds the order up now (docs/design.md §12); absent or null when nothing does, which
    /// clears what an earlier heartbeat said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<ClaimWaiting>,
}

/// Body of `POST /work-orders/{id}/complete`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteBody {
    pub agent_id: Uuid,
    /// The claim's fencing token; when given, only that claim may complete.
    #[serde(default)]
    pub claim_id: Option<Uuid>,
    pub success: bool,
    /// Result or error text. U+0000 is removed; text over 64 KiB is stored cut at a character
    /// boundary, ending with a marker (docs/design.md §5).
    #[serde(default)]
    pub message: Option<String>,
    /// Default true; false sends a failure straight to the log. With `disrupted: true`: whether
    /// the disrupted run is known to have stopped, so that a new one may start, and then the
    /// default is false (docs/design.md §12).
    #[serde(default)]
    pub retryable: Option<bool>,
    /// Default false; true: the attempt was ended by a disruption (eviction, drain, preemption,
    /// a lost node), not by the work. Only with `success: false` (else `400` naming `disrupted`;
    /// docs/design.md §12).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disrupted: Option<bool>,
}

/// Body of `POST /agents/{agent_id}/complete`: several results of the agent's claims reported in
/// one request, so an agent whose orders finish together pays one round trip for them rather than
/// one each (issue #34). Each item is what `POST /work-orders/{id}/complete` takes, with the order
/// named in it and the agent in the path; each is answered as that request would be.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteManyBody {
    /// 1–100 results (`queue::limits::MAX_COMPLETES`), each order at most once; `400` naming
    /// the field otherwise, and then nothing is completed.
    #[schema(min_items = 1, max_items = 100)]
    pub completes: Vec<CompleteItem>,
}

/// One result of a [`CompleteManyBody`]: [`CompleteBody`] with the order's id instead of the
/// agent's. The fields are written out again rather than shared through `#[serde(flatten)]`,
/// which serde cannot combine with `deny_unknown_fields` (an unknown field must stay a `422`).
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteItem {
    pub work_order_id: Uuid,
    /// The claim's fencing token; when given, only that claim may complete.
    #[serde(default)]
    pub claim_id: Option<Uuid>,
    pub success: bool,
    /// As [`CompleteBody::message`].
    #[serde(default)]
    pub message: Option<String>,
    /// As [`CompleteBody::retryable`].
    #[serde(default)]
    pub retryable: Option<bool>,
    /// As [`CompleteBody::disrupted`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disrupted: Option<bool>,
}

/// `200` answer of `POST /agents/{agent_id}/complete`: one result per item, in the request's
/// order.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct CompletedMany {
    pub results: Vec<CompleteResult>,
}

/// What one item of a batch complete led to: `status` is the status its own `POST
/// /work-orders/{id}/complete` would have answered, with that answer's body in the one field
/// that goes with it: `200` `log_entry` (without `yaml_content`, as in every list), `202`
/// `retry_scheduled`, any other `error` (`409` `cancelled`, `reclaimed`, `not_claim_holder`;
/// `404`; `503 database_unavailable`, to be sent again).
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct CompleteResult {
    pub work_order_id: Uuid,
    /// An HTTP status code: 200, 202, 404, 409, 500 or 503.
    pub status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_entry: Option<Box<LogEntry>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_scheduled: Option<RetryScheduled>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorDetail>,
}

/// `202` body of complete when a retry was scheduled.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct RetryScheduled {
    /// Always `retry_scheduled`.
    pub status: String,
    pub next_retry_after: DateTime<Utc>,
}

impl RetryScheduled {
    /// The answer to a complete that scheduled a retry due at `next_retry_after`.
    pub fn at(next_retry_after: DateTime<Utc>) -> Self {
        RetryScheduled {
            status: "retry_scheduled".into(),
            next_retry_after,
        }
    }
}

/// `{"error": {...}}`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// What went wrong: a stable snake_case `code` and a message naming the field.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    pub code: String,
    pub message: String,
}

/// Who a bearer token belongs to (`GET /api/v1/whoami`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WhoAmI {
    /// `admin` or `agent`.
    pub kind: String,
    /// The agent the token is bound to (agent tokens only).
    #[schema(required = true)]
    pub agent_id: Option<Uuid>,
    #[schema(required = true)]
    pub agent_name: Option<String>,
}

/// Most lines one page of `GET /work-orders/{id}/output` returns (its `limit`, docs/design.md §9).
pub const MAX_OUTPUT_PAGE_LINES: i64 = crate::queue::limits::MAX_OUTPUT_PAGE_LINES;
