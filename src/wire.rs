//! The shapes both sides of the HTTP API use (docs/design.md §5): the request and answer bodies of the
//! pull protocol and the error body, defined once for the server (`api`, which also describes
//! them in the OpenAPI document) and its clients (`client`, `pull`, `admin`). The shapes of work
//! orders, log entries and agents are the queue's own records and are re-exported here, so a
//! client needs nothing but this module.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

pub use crate::queue::Heartbeat;
pub use crate::queue::backlog::Backlog;
pub use crate::queue::model::{
    Agent, AgentHealth, AgentWithToken, Attempt, AttemptResult, LogEntry, NewAgent, NewWorkOrder,
    OrderStatus, Outcome, Page, RequestedWorkType, Targeting, WorkOrder, WorkType,
};
pub use crate::queue::output::{OutputEntry, OutputPage};
/// Ends a result message the server cut at its limit (docs/design.md §5).
pub use crate::queue::text::CUT_MARKER;
pub use crate::queue::waiting::{Explanation, WaitReason};

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
}

/// Body of `POST /work-orders/{id}/heartbeat`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatBody {
    pub agent_id: Uuid,
    /// The claim's fencing token; when given, only that claim is extended.
    #[serde(default)]
    pub claim_id: Option<Uuid>,
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
    /// Default true; false sends a failure straight to the log.
    #[serde(default)]
    pub retryable: Option<bool>,
}

/// `202` body of complete when a retry was scheduled.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct RetryScheduled {
    /// Always `retry_scheduled`.
    pub status: String,
    pub next_retry_after: DateTime<Utc>,
}

/// `{"error": {...}}`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// What went wrong: a stable snake_case `code` and a message naming the field.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
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
pub const MAX_OUTPUT_PAGE_LINES: i64 = 10_000;

/// Body of `POST /work-orders/{id}/output` (docs/design.md §9): one ordered chunk of the output of the
/// claim `claim_id`, sent by the agent holding it. At most 1 MiB as sent (`413` above).
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputChunk {
    pub agent_id: Uuid,
    /// The claim's fencing token: a chunk of any other claim is `409` as for complete.
    pub claim_id: Uuid,
    /// The chunk's number within its claim: 0, 1, 2, … A chunk whose `seq` is already stored is
    /// answered as the first time and stored once, so an agent may resend after a timeout.
    #[schema(minimum = 0)]
    pub seq: i64,
    /// Bytes of output the agent could not deliver before this chunk (its buffer overflowed while
    /// the server was away); stored as a gap marker ahead of `lines`. Absent or 0 = none lost.
    #[serde(default)]
    #[schema(minimum = 0)]
    pub dropped_bytes: Option<i64>,
    /// The lines, oldest first; may be empty when the chunk only reports a gap.
    pub lines: Vec<OutputLine>,
}

/// One line of output (docs/design.md §9), without its line ending.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputLine {
    /// `stdout` or `stderr` for a worker; `<pod>/<container>` for the executor (at most 253
    /// characters).
    #[schema(min_length = 1, max_length = 253)]
    pub stream: String,
    /// The text; U+0000 is replaced by the server, never refused.
    pub text: String,
    /// When the agent read the line.
    pub at: DateTime<Utc>,
}

/// Answer to `POST /work-orders/{id}/output`: the same for a first and a repeated `seq`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, ToSchema)]
pub struct OutputAccepted {
    pub seq: i64,
    /// Lines of the chunk as stored.
    pub lines: i64,
}
