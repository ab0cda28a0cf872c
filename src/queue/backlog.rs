//! Queue depth for autoscalers (docs/design.md §10): what an agent, or an agent profile not yet
//! registered, could take now. One statement (`sql/backlog.sql`) applies the eligibility rule of
//! `queue::eligibility` (it includes `sql/eligible.sql`) over the agent's side given as parameters.
//! And the depth per tenant, for the per-tenant gauges of `/metrics` ([`TenantCount`]).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::eligibility::{AgentProfile, annotation_pairs};
use super::{Queue, QueueError, sql};

/// `GET /api/v1/agents/{id}/backlog` and `GET /api/v1/backlog` (docs/design.md §10): unclaimed
/// orders the agent may take now (eligible and due), whether or not it has room, the longest
/// wait among them, and the orders it runs now. Small and flat so that KEDA's `metrics-api`
/// scaler reads one field: `total` (`valueLocation: total`) to size a Deployment of agents, so
/// replicas running orders are not scaled away when the waiting ones are all taken (as SQS's
/// `scaleOnInFlight`); `count` for waiting orders alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Backlog {
    /// Orders waiting that the agent may take now.
    pub count: i64,
    /// Seconds since the longest-waiting of them last became unclaimed; 0 when there are none.
    pub oldest_seconds: i64,
    /// Orders the agent holds a claim on now (all its replicas); 0 for a profile not registered.
    pub claimed: i64,
    /// `count + claimed`: the orders a scaler sizes the agent's replicas for.
    pub total: i64,
}

/// Active orders of one tenant, or of every tenant past the busiest ones (`sql/tenant_counts.sql`,
/// read for the gauges by `Queue::compute_gauges`): the `top` tenants with the most (waiting +
/// claimed; ties by name, no tenant first) one row each, busiest first, then at most one row
/// summing all the other tenants (issue #40: metrics per tenant with bounded label cardinality).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow, serde::Serialize, serde::Deserialize)]
pub struct TenantCount {
    /// The tenant; `None` for the orders without one, or, when `top` is false, for the others.
    pub tenant: Option<String>,
    /// One of the busiest tenants (its own row), or the sum of all the others.
    pub top: bool,
    /// Orders `PENDING` or `RETRY_PENDING`.
    pub waiting: i64,
    /// Orders `CLAIMED`.
    pub claimed: i64,
}

impl Queue {
    /// The backlog of a registered agent (docs/design.md §10). `NotFound` for an unknown agent; a
    /// retired agent's backlog is empty.
    pub async fn agent_backlog(&self, agent_id: Uuid) -> Result<Backlog, QueueError> {
        let claimer = self.read_claimer(agent_id).await?;
        self.backlog(&claimer.profile, Some(claimer.profile.name.as_str()))
            .await
    }

    /// The backlog an agent with this `profile` would have if it were registered now
    /// (docs/design.md §10), so a scaler can start the first one. The profile's id and name are not
    /// used: an order that targets an agent by id or name targets a registered one.
    pub async fn profile_backlog(&self, profile: &AgentProfile) -> Result<Backlog, QueueError> {
        let anonymous = AgentProfile {
            id: Uuid::new_v4(),
            ..profile.clone()
        };
        self.backlog(&anonymous, None).await
    }

    async fn backlog(&self, a: &AgentProfile, name: Option<&str>) -> Result<Backlog, QueueError> {
        // The statement reads retirement as the agents row has it; only its being set matters.
        let retired_at: Option<DateTime<Utc>> = a.retired.then(Utc::now);
        let types: Vec<&str> = a.work_types.iter().map(|t| t.as_str()).collect();
        let (count, oldest_seconds, claimed): (i64, i64, i64) = sqlx::query_as(sql::BACKLOG)
            .bind(a.id)
            .bind(name)
            .bind(&a.labels)
            .bind(annotation_pairs(&a.annotations))
            .bind(types)
            .bind(&a.tenant)
            .bind(retired_at)
            .fetch_one(&self.pool)
            .await?;
        Ok(Backlog {
            count,
            oldest_seconds: oldest_seconds.max(0),
            claimed,
            total: count + claimed,
        })
    }
}
