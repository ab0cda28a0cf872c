//! Why an order waits, as the API answers it (docs/design.md §10, §12): the reasons, the body of
//! `explain`, and what the holder of a claim says holds its order up. The rule that decides an
//! unclaimed order's reason is `queue::waiting`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// Why an order waits (docs/design.md §10). For an unclaimed order the rule that picks one, and
/// when each applies, is `queue::waiting`; a claimed order waits only as its agent says
/// (`node_unreachable`, §12, sent with its heartbeats: [`ClaimWaiting`]).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum WaitReason {
    NoMatchingAgent,
    NoAgentConnected,
    AgentsBusy,
    BackingOff,
    ConcurrencyLimited,
    Queued,
    /// Claimed, and a pod of it may still run on a node that does not report: its verdict waits
    /// for the kubelet (docs/design.md §12).
    NodeUnreachable,
}

impl WaitReason {
    /// Every reason of an unclaimed order, for metrics registered at zero.
    pub const ALL: [WaitReason; 6] = [
        WaitReason::NoMatchingAgent,
        WaitReason::NoAgentConnected,
        WaitReason::AgentsBusy,
        WaitReason::BackingOff,
        WaitReason::ConcurrencyLimited,
        WaitReason::Queued,
    ];

    /// The wire name (`no_matching_agent`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::NoMatchingAgent => "no_matching_agent",
            WaitReason::NoAgentConnected => "no_agent_connected",
            WaitReason::AgentsBusy => "agents_busy",
            WaitReason::BackingOff => "backing_off",
            WaitReason::ConcurrencyLimited => "concurrency_limited",
            WaitReason::Queued => "queued",
            WaitReason::NodeUnreachable => "node_unreachable",
        }
    }
}

impl std::fmt::Display for WaitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a work order waits (docs/design.md §10): the body of `GET /api/v1/work-orders/{id}/explain`
/// and the `waiting` field of `GET /api/v1/work-orders/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Explanation {
    pub reason: WaitReason,
    /// The reason as a sentence for people.
    pub message: String,
    /// Names of live agents that may take the order once it is due, at most 10, by name.
    pub matching_agents: Vec<String>,
    /// How many live agents match in all (`matching_agents` shows at most 10).
    pub matching_agent_count: usize,
    /// For `queued`: 1 for the next order its agents will hand out, 2 for the one after, …;
    /// absent past 10,000 orders ahead (`position_past` then says so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<i64>,
    /// For `queued` with more orders ahead than are counted: that bound (10,000). Counting stops
    /// there, so a position costs the same behind 10,000 orders as behind a million.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position_past: Option<i64>,
    /// For `backing_off`: when the retry becomes due (absent for a retry without a time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backing_off_until: Option<DateTime<Utc>>,
    /// For `concurrency_limited`: the key whose slots are all held, and by which orders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<KeyWait>,
    /// For `node_unreachable`: the node that does not report, and since when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeWait>,
    /// Seconds since the order last became unclaimed (created, released by the reaper or a
    /// retirement, its retry scheduled or come due), by the database's clock; for
    /// `node_unreachable`, since the node stopped reporting by the server's clock (0 when the
    /// agent could not say when).
    pub waiting_seconds: i64,
}

/// The node a claimed order's pod may still run on (docs/design.md §12 `node_unreachable`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NodeWait {
    pub name: String,
    /// When it stopped reporting, as its `Ready` condition says (absent when not known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<DateTime<Utc>>,
}

/// What holds a claimed order up, as its agent says with each heartbeat (docs/design.md §12);
/// absent from a heartbeat when nothing does. Stored with the claim, it is what `GET
/// /work-orders/{id}` and `explain` answer for the order while the claim lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimWaiting {
    /// Only `node_unreachable`: a pod of the order may still run on a node that does not report.
    pub reason: WaitReason,
    /// For people: the pod, the node, since when (at most 4096 characters).
    pub message: String,
    /// The node, for `node_unreachable`.
    pub node: NodeWait,
}

/// The concurrency key an order waits for (docs/design.md §10 `concurrency_limited`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct KeyWait {
    pub key: String,
    /// The order's `concurrency.max`.
    pub max: i32,
    /// Claims holding the key's slots now.
    pub held: i64,
    /// The orders holding them, oldest claim first, at most 10.
    pub holders: Vec<Uuid>,
}
