//! Why an order waits (docs/design.md §10): reads the order and the live agents in one read-only
//! snapshot, asks `queue::waiting` for the reason, and for a `queued` order counts the orders
//! that go first (`sql/queue_position.sql`). The metrics' counts by reason
//! ([`waiting_by_reason`], for `queue::gauges`) ask the same function once per group of orders
//! that share their side of eligibility (`sql/waiting_by_profile.sql`).

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use super::eligibility::OrderProfile;
use super::model::ClaimWaiting;
use super::registry::AgentProfileRow;
use super::rules::agent_health;
use super::waiting::{self, AgentState, MATCHING_AGENTS_SHOWN, OrderFacts, ReasonCount, Wait};
use super::{
    ConflictCode, Explanation, KeyWait, OrderStatus, Queue, QueueError, Targeting,
    TargetingColumns, WaitReason, WorkType, keys, limits, sql,
};

impl Queue {
    /// Why work order `id` waits (docs/design.md §10 `GET /work-orders/{id}/explain`): for a
    /// claimed one, what its agent says holds it up (§12). Errors: `NotFound` for an unknown id,
    /// `Finished` for one in the log, `Conflict` (`not_waiting`) for a claimed one its agent says
    /// nothing of.
    pub async fn explain(&self, id: Uuid) -> Result<Explanation, QueueError> {
        if let Some(explanation) = self.waiting(id).await? {
            return Ok(explanation);
        }
        let order = self.lookup(id, false).await?.into_active(id)?;
        Err(QueueError::conflict(
            ConflictCode::NotWaiting,
            match (order.claimed_by, order.claimed_at) {
                (Some(agent), Some(at)) => format!(
                    "work order {id} is not waiting: agent {agent} claimed it at {}",
                    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ),
                _ => format!("work order {id} is not waiting: it is claimed"),
            },
        ))
    }

    /// Why work order `id` waits, with its place in line (`explain`): for a claimed order, what
    /// its agent says holds it up (§12); `None` when it is neither waiting nor held up, or not
    /// active.
    pub async fn waiting(&self, id: Uuid) -> Result<Option<Explanation>, QueueError> {
        self.waiting_with(id, true).await
    }

    /// [`Self::waiting`] without counting the orders ahead (`position` absent), for
    /// `GET /work-orders/{id}`: the reason is a few reads by primary key, the place in line a walk
    /// of up to 10,000 orders, and `work-orders wait` reads the order every second
    /// (docs/design.md §10; `explain` counts it).
    pub async fn waiting_reason(&self, id: Uuid) -> Result<Option<Explanation>, QueueError> {
        self.waiting_with(id, false).await
    }

    async fn waiting_with(
        &self,
        id: Uuid,
        count_position: bool,
    ) -> Result<Option<Explanation>, QueueError> {
        let mut tx = snapshot(self).await?;
        let row: Option<WaitingOrderRow> = sqlx::query_as(sql::WAITING_ORDER)
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = row else {
            // Claimed (or not active): only its agent may say it waits (§12).
            return claim_waiting(&mut *tx, id)
                .await
                .map(|w| w.map(held_explanation));
        };
        let agents = live_agents(&mut *tx).await?;
        let Some(verdict) = row.columns.verdict(&agents) else {
            return Ok(None);
        };
        let key = match (&row.concurrency_slot, &row.concurrency_key) {
            (Some(slot), Some(key)) if verdict.reason == WaitReason::ConcurrencyLimited => {
                let (held, holders) =
                    keys::holders(&mut *tx, *slot, MATCHING_AGENTS_SHOWN as i64).await?;
                Some(KeyWait {
                    key: key.clone(),
                    max: row.concurrency_max.unwrap_or(1),
                    held,
                    holders,
                })
            }
            _ => None,
        };
        let position = if verdict.takers.is_empty() || !count_position {
            None
        } else {
            let (ahead,): (i64,) = sqlx::query_as(sql::QUEUE_POSITION)
                .bind(id)
                .bind(&verdict.takers)
                // One more than the bound, so "more than the bound ahead" is told apart from
                // exactly the bound ahead.
                .bind(limits::MAX_POSITION_COUNTED + 1)
                .fetch_one(&mut *tx)
                .await?;
            Some(ahead + 1)
        };
        tx.commit().await?;
        let facts = OrderFacts {
            id: row.id,
            retry_count: row.retry_count,
            next_retry_after: row.next_retry_after,
            waiting_seconds: row.waiting_seconds,
            key,
        };
        Ok(Some(waiting::explanation(&facts, &verdict, position)))
    }

    /// What the holder of claimed order `id` says holds it up (docs/design.md §12), for the
    /// WorkOrder `Schedulable` condition: `None` when the order has no live claim or nothing holds
    /// it up. One read by primary key.
    pub async fn claim_wait(&self, id: Uuid) -> Result<Option<Wait>, QueueError> {
        Ok(claim_waiting(&self.pool, id).await?.map(|w| Wait {
            reason: w.reason,
            message: w.message,
            matching: Vec::new(),
        }))
    }

    /// Why each of `ids` waits, for the WorkOrder `Schedulable` condition (docs/design.md §10): one
    /// statement (`sql/waiting_orders.sql`, by primary key) and a read of the live agents begun
    /// after the call (shared with the calls waiting for it, [`RecentAgents`]), each group of orders
    /// sharing their side of eligibility decided once by `waiting::classify`. Ids that are
    /// claimed, finished or unknown are absent from the answer.
    pub async fn waits(&self, ids: &[Uuid]) -> Result<HashMap<Uuid, Wait>, QueueError> {
        let mut out = HashMap::new();
        if ids.is_empty() {
            return Ok(out);
        }
        let groups: Vec<WaitingGroupRow> = sqlx::query_as(sql::WAITING_ORDERS)
            .bind(ids)
            .fetch_all(&self.pool)
            .await?;
        let agents = if groups.is_empty() {
            std::sync::Arc::default()
        } else {
            self.recent_agents.get(self).await?
        };
        for g in groups {
            let Some(verdict) = g.columns.verdict(&agents) else {
                continue;
            };
            let orders = g.ids.iter().zip(&g.retry_counts).zip(&g.retry_times);
            for ((id, retry_count), next_retry_after) in orders {
                let facts = OrderFacts {
                    id: *id,
                    retry_count: *retry_count,
                    next_retry_after: *next_retry_after,
                    waiting_seconds: 0,
                    key: None,
                };
                out.insert(*id, waiting::wait(&facts, &verdict));
            }
        }
        Ok(out)
    }
}

/// The order's side of eligibility and its state, as both statements return them
/// (`sql/waiting_order.sql`, `sql/waiting_orders.sql`).
#[derive(sqlx::FromRow)]
struct WaitingColumns {
    work_type: String,
    tenant: Option<String>,
    #[sqlx(flatten)]
    targeting: TargetingColumns,
    status: String,
    due: bool,
    /// Its concurrency key's slots are all held (`sql/key_full.sql`).
    limited: bool,
}

impl WaitingColumns {
    /// Why such an order waits among `agents` (`waiting::classify`); `None` when it is claimed.
    fn verdict(self, agents: &[AgentState]) -> Option<waiting::Verdict<'_>> {
        let targeting = Targeting::from(self.targeting);
        let order = OrderProfile {
            work_type: WorkType::parse(&self.work_type).unwrap_or(WorkType::Custom),
            tenant: self.tenant.as_deref(),
            targeting: &targeting,
        };
        let status = OrderStatus::parse(&self.status).unwrap_or(OrderStatus::Pending);
        waiting::classify(&order, status, self.due, self.limited, agents)
    }
}

/// `sql/waiting_order.sql`.
#[derive(sqlx::FromRow)]
struct WaitingOrderRow {
    id: Uuid,
    #[sqlx(flatten)]
    columns: WaitingColumns,
    retry_count: i32,
    next_retry_after: Option<DateTime<Utc>>,
    waiting_seconds: i64,
    concurrency_slot: Option<Uuid>,
    concurrency_key: Option<String>,
    concurrency_max: Option<i32>,
}

/// `sql/waiting_by_profile.sql`.
#[derive(sqlx::FromRow)]
struct ProfileRow {
    #[sqlx(flatten)]
    columns: WaitingColumns,
    orders: i64,
    oldest_seconds: f64,
    /// The orders of every group, the ones past the statement's cut included.
    waiting_total: i64,
}

/// `sql/waiting_orders.sql`: one group of orders sharing their side of eligibility.
#[derive(sqlx::FromRow)]
struct WaitingGroupRow {
    #[sqlx(flatten)]
    columns: WaitingColumns,
    ids: Vec<Uuid>,
    retry_counts: Vec<i32>,
    retry_times: Vec<Option<DateTime<Utc>>>,
}

/// `sql/waiting_agents.sql`.
#[derive(sqlx::FromRow)]
struct WaitingAgentRow {
    #[sqlx(flatten)]
    profile: AgentProfileRow,
    max_concurrency: Option<i32>,
    lease_seconds: Option<i32>,
    last_seen_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    held: i64,
}

impl From<WaitingAgentRow> for AgentState {
    fn from(r: WaitingAgentRow) -> Self {
        AgentState {
            health: agent_health(false, r.last_seen_at, r.lease_seconds, r.now),
            profile: r.profile.into_profile(false),
            max_concurrency: r.max_concurrency,
            held: r.held,
        }
    }
}

/// Every live agent as the reasons see it (`sql/waiting_agents.sql`).
pub(in crate::queue) async fn live_agents(
    exec: impl sqlx::PgExecutor<'_>,
) -> Result<Vec<AgentState>, QueueError> {
    let rows: Vec<WaitingAgentRow> = sqlx::query_as(sql::WAITING_AGENTS).fetch_all(exec).await?;
    Ok(rows.into_iter().map(Into::into).collect())
}

/// Unclaimed orders by reason, with the longest wait of each in seconds, for the
/// `pullman_work_orders_waiting{reason}` gauges (docs/design.md §10), read on `conn` (the gauges'
/// snapshot, `queue::gauges`). Every reason is present, at zero when no order waits for it. Only
/// the `max_groups` largest groups of orders sharing their side of eligibility are classified;
/// the second value counts the orders of the others.
pub(in crate::queue) async fn waiting_by_reason(
    conn: &mut sqlx::PgConnection,
    max_groups: i64,
) -> Result<(BTreeMap<WaitReason, ReasonCount>, i64), QueueError> {
    let groups: Vec<ProfileRow> = sqlx::query_as(sql::WAITING_BY_PROFILE)
        .bind(max_groups)
        .fetch_all(&mut *conn)
        .await?;
    let agents = live_agents(&mut *conn).await?;
    let mut counts: BTreeMap<WaitReason, ReasonCount> = WaitReason::ALL
        .into_iter()
        .map(|r| (r, ReasonCount::default()))
        .collect();
    let total = groups.first().map_or(0, |g| g.waiting_total);
    let mut classified = 0;
    for g in groups {
        classified += g.orders;
        if let Some(verdict) = g.columns.verdict(&agents) {
            let c = counts.entry(verdict.reason).or_default();
            c.orders += g.orders;
            c.oldest_seconds = c.oldest_seconds.max(g.oldest_seconds);
        }
    }
    Ok((counts, total - classified))
}

/// The live agents as last read for [`Queue::waits`], shared by callers that asked before that
/// read began: a burst of WorkOrder reconciles, each asking why its order waits, waits for one
/// read instead of each making its own (docs/design.md §10, issue #35), and no caller gets a read
/// older than its question (an agent's contact, registration or retirement committed before it
/// asked is always seen, so no Warning Event says "no agent" about an agent that just called).
#[derive(Default)]
pub(in crate::queue) struct RecentAgents(tokio::sync::Mutex<Recent>);

#[derive(Default)]
enum Recent {
    #[default]
    Unread,
    /// A read begun at this instant.
    Read(tokio::time::Instant, std::sync::Arc<Vec<AgentState>>),
    /// A read begun at this instant failed: the callers that were waiting for it read on their
    /// own, at once rather than one after the other behind the lock.
    Failed(tokio::time::Instant),
}

impl RecentAgents {
    async fn get(&self, queue: &Queue) -> Result<std::sync::Arc<Vec<AgentState>>, QueueError> {
        let asked = tokio::time::Instant::now();
        let mut recent = self.0.lock().await;
        match &*recent {
            Recent::Read(began, agents) if *began >= asked => return Ok(agents.clone()),
            Recent::Failed(began) if *began >= asked => {
                drop(recent);
                return Ok(std::sync::Arc::new(live_agents(&queue.pool).await?));
            }
            _ => {}
        }
        let began = tokio::time::Instant::now();
        match live_agents(&queue.pool).await {
            Ok(agents) => {
                let agents = std::sync::Arc::new(agents);
                *recent = Recent::Read(began, agents.clone());
                Ok(agents)
            }
            Err(e) => {
                *recent = Recent::Failed(began);
                Err(e)
            }
        }
    }
}

/// A read-only `REPEATABLE READ` transaction on one snapshot, so what it reads agrees (the order,
/// the agents and the position here; every figure of `queue::gauges`).
pub(in crate::queue) async fn snapshot(
    queue: &Queue,
) -> Result<Transaction<'static, Postgres>, QueueError> {
    let mut tx = queue.pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    Ok(tx)
}

/// What the holder of the order's live claim says holds it up (`sql/claim_waiting.sql`).
async fn claim_waiting(
    exec: impl sqlx::PgExecutor<'_>,
    id: Uuid,
) -> Result<Option<ClaimWaiting>, QueueError> {
    let row: Option<(Json<ClaimWaiting>,)> = sqlx::query_as(sql::CLAIM_WAITING)
        .bind(id)
        .fetch_optional(exec)
        .await?;
    Ok(row.map(|(w,)| w.0))
}

/// The explanation of a claimed order held up as its agent says (docs/design.md §12): the
/// agent's message, the node, and the seconds since the node stopped reporting (`0` when that
/// is not known).
fn held_explanation(w: ClaimWaiting) -> Explanation {
    let waiting_seconds = w
        .node
        .since
        .map(|t| (Utc::now() - t).num_seconds().max(0))
        .unwrap_or(0);
    Explanation {
        reason: w.reason,
        message: w.message,
        matching_agents: Vec::new(),
        matching_agent_count: 0,
        position: None,
        position_past: None,
        backing_off_until: None,
        concurrency: None,
        node: Some(w.node),
        waiting_seconds,
    }
}

#[cfg(test)]
#[path = "explain_tests.rs"]
mod tests;
