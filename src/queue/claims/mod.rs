//! The claim protocol (docs/design.md §2, §3, §5): pending list, claim by id, claim-next here;
//! heartbeat and complete (both shapes) in `holder`.
//! Statements: `src/queue/sql/` (`queue::sql`). Rules: `queue::eligibility`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{FromRow, Postgres, Row, Transaction};
use uuid::Uuid;

mod group;
mod holder;
#[cfg(all(test, feature = "testing"))]
mod plan;

use super::eligibility::{self, AgentProfile, OrderProfile, at_capacity, room};
use super::sql;
use super::wake::WakeFilter;
use super::{
    ConflictCode, OrderRow, OrderStatus, Page, Queue, QueueError, Targeting, TargetingColumns,
    WorkOrder, WorkType, cursor,
};
pub(crate) use group::GroupClaims;

/// Who claims, and with what lease (seconds; `None` = no lease, docs/design.md §2).
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest {
    pub agent_id: Uuid,
    pub lease_seconds: Option<i32>,
}

/// `200` body of a heartbeat: the new lease end (absent for a claim without a lease) and the hard
/// end of the claim (`claimed_at + claim_timeout_seconds`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Heartbeat {
    #[schema(required = true)]
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub claim_expires_at: DateTime<Utc>,
}

/// The claiming agent's row (`sql/lock_claimer.sql`, `sql/read_claimer.sql`,
/// `sql/claim_next.sql`). Columns are prefixed `a_` so they can share a result row with an
/// order's.
#[derive(sqlx::FromRow)]
struct AgentLockRow {
    #[sqlx(rename = "a_id")]
    id: Uuid,
    #[sqlx(rename = "a_name")]
    name: String,
    #[sqlx(rename = "a_labels")]
    labels: Vec<String>,
    #[sqlx(rename = "a_annotations")]
    annotations: Json<BTreeMap<String, String>>,
    #[sqlx(rename = "a_work_types")]
    work_types: Vec<String>,
    #[sqlx(rename = "a_tenant")]
    tenant: Option<String>,
    #[sqlx(rename = "a_max_concurrency")]
    max_concurrency: Option<i32>,
    #[sqlx(rename = "a_retired_at")]
    retired_at: Option<DateTime<Utc>>,
}

/// The claiming agent as its claim sees it.
pub(in crate::queue) struct Claimer {
    pub(in crate::queue) profile: AgentProfile,
    max_concurrency: Option<i32>,
}

impl From<AgentLockRow> for Claimer {
    fn from(r: AgentLockRow) -> Self {
        Claimer {
            profile: AgentProfile {
                id: r.id,
                name: r.name,
                labels: r.labels,
                annotations: r.annotations.0,
                work_types: WorkType::parse_all(&r.work_types),
                tenant: r.tenant,
                retired: r.retired_at.is_some(),
            },
            max_concurrency: r.max_concurrency,
        }
    }
}

impl Claimer {
    /// Which claimable-order notices this claim-next would act on (see `queue::wake`): the
    /// agent, and the work types the claim asked for.
    pub(in crate::queue) fn wake_filter(&self, requested: &[WorkType]) -> WakeFilter {
        WakeFilter {
            agent: self.profile.clone(),
            types: requested.to_vec(),
        }
    }
}

/// Locks the agent row for the rest of the transaction (serializing this agent's capped claims,
/// so `max_concurrency` holds for claims begun after it was set: `sql/lock_claimer.sql`) and
/// records the contact.
async fn lock_claimer(
    tx: &mut Transaction<'_, Postgres>,
    req: &ClaimRequest,
) -> Result<Claimer, QueueError> {
    let row: Option<AgentLockRow> = sqlx::query_as(sql::LOCK_CLAIMER)
        .bind(req.agent_id)
        .bind(req.lease_seconds)
        .fetch_optional(&mut **tx)
        .await?;
    let claimer: Claimer = row
        .ok_or_else(|| QueueError::NotFound {
            what: "agent",
            id: req.agent_id.to_string(),
        })?
        .into();
    if claimer.profile.retired {
        return Err(retired(req.agent_id));
    }
    Ok(claimer)
}

/// A claiming statement (`sql/claim_next.sql`, `claim_next_capped.sql`, `claim_by_id.sql`)
/// with the parameters of the `take_claim.sql` it includes bound: `$1` the agent, `$2` one new
/// claim id per order it may claim (`claims`, at least 1), `$3` the lease in seconds. The
/// caller binds the statement's own `$4`.
fn take_claim<'q>(
    statement: &'q str,
    req: &ClaimRequest,
    claims: usize,
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    let ids: Vec<Uuid> = (0..claims.max(1)).map(|_| Uuid::new_v4()).collect();
    sqlx::query(statement)
        .bind(req.agent_id)
        .bind(ids)
        .bind(req.lease_seconds)
}

/// How many times a claim-next runs its statement while each run finds only orders whose
/// concurrency key another claim filled after the run's snapshot (`contended` in
/// `sql/claim_next_result.sql`), or is ended by a deadlock ([`deadlocked`]). Each try sees the
/// keys filled before it, so a second rarely contends again; the bound keeps a storm of claims
/// on one key from looping.
const CONTENDED_TRIES: u32 = 4;

/// Whether a contended claim-next runs its statement again after try `tries` (while
/// [`CONTENDED_TRIES`] last), having paused first: none, then 4 and 8 ms. The second try goes at
/// once: usually the key filled after the first's snapshot, and a fresh snapshot walks past it
/// (with one hot key, pausing there too took `bench/keys.rs` 10b's claim p99 from 5.1 to 10.5
/// ms). Later tries pause, because then the key's row is likely held by a claim or a claim's end
/// in flight (`pullman_take_slot` does not wait for it), which commits within milliseconds.
async fn try_again(tries: u32) -> bool {
    if tries >= CONTENDED_TRIES {
        return false;
    }
    if tries > 1 {
        tokio::time::sleep(std::time::Duration::from_millis(1 << tries)).await;
    }
    true
}

/// PostgreSQL ended the statement to break a deadlock (`40P01`). Two multi-claims that make the
/// slot rows of the same two new concurrency keys in opposite orders can meet so (the
/// migration's `pullman_take_slot`); the claim is tried again, as when contended.
fn deadlocked(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == "40P01")
}

/// What one run of a claim-next statement (`sql/claim_next_result.sql`) answered.
struct ClaimRun {
    claimer: Claimer,
    orders: Vec<WorkOrder>,
    /// The walk lost an order to a concurrency key filled after its snapshot.
    contended: bool,
    /// Tenant turns that looked idle, to park once the claim has committed
    /// ([`Queue::park_turns`]).
    idle_turns: Vec<Uuid>,
}

/// The rows of a claim-next statement (`sql/claim_next_result.sql`) as a [`ClaimRun`]; `404`
/// for an unknown agent, `409` for a retired one.
fn claim_result(req: &ClaimRequest, rows: &[PgRow]) -> Result<ClaimRun, QueueError> {
    let first = rows.first().ok_or_else(|| QueueError::NotFound {
        what: "agent",
        id: req.agent_id.to_string(),
    })?;
    let claimer: Claimer = AgentLockRow::from_row(first)?.into();
    if claimer.profile.retired {
        return Err(retired(req.agent_id));
    }
    let mut orders = Vec::with_capacity(rows.len());
    for row in rows {
        if row.try_get::<Option<Uuid>, _>("id")?.is_some() {
            orders.push(OrderRow::from_row(row)?.into());
        }
    }
    Ok(ClaimRun {
        claimer,
        orders,
        contended: first.try_get("contended")?,
        idle_turns: first.try_get("idle_turns")?,
    })
}

/// Work types as bound to SQL (`text[]`).
fn type_names(types: &[WorkType]) -> Vec<&'static str> {
    types.iter().map(|t| t.as_str()).collect()
}

fn retired(agent_id: Uuid) -> QueueError {
    QueueError::conflict(
        ConflictCode::AgentRetired,
        format!("agent {agent_id} is retired"),
    )
}

async fn held_claims(exec: impl sqlx::PgExecutor<'_>, agent_id: Uuid) -> Result<i64, QueueError> {
    let (n,): (i64,) = sqlx::query_as(sql::COUNT_HELD_CLAIMS)
        .bind(agent_id)
        .fetch_one(exec)
        .await?;
    Ok(n)
}

impl Queue {
    /// What `agent_id` may claim now, oldest first, without `yaml_content` (docs/design.md §5
    /// `GET /agents/{id}/work-orders/pending`; `sql/pending_for_agent.sql`). Side-effect free.
    /// Empty for a retired agent or one at its `max_concurrency`, because claim would accept
    /// nothing then.
    pub async fn pending_for_agent(
        &self,
        agent_id: Uuid,
        work_types: &[WorkType],
        limit: i64,
        cursor_text: Option<&str>,
    ) -> Result<Page<WorkOrder>, QueueError> {
        let after = cursor_text.map(cursor::decode).transpose()?;
        let claimer = self.read_claimer(agent_id).await?;
        if at_capacity(
            claimer.max_concurrency,
            held_claims(&self.pool, agent_id).await?,
        ) {
            return Ok(Page {
                items: vec![],
                next_cursor: None,
            });
        }
        let mut tx = cursor::page_transaction(&self.pool).await?;
        let rows: Vec<OrderRow> = sqlx::query_as(sql::PENDING_FOR_AGENT)
            .bind(agent_id)
            .bind(type_names(work_types))
            .bind(after.map(|a| a.0))
            .bind(after.map(|a| a.1))
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        let items: Vec<WorkOrder> = rows.into_iter().map(Into::into).collect();
        Ok(cursor::page(items, limit, |o| (o.created_at, o.id)))
    }

    /// The agent's side of eligibility (`sql/read_claimer.sql`); `404` for an unknown agent.
    pub(in crate::queue) async fn read_claimer(
        &self,
        agent_id: Uuid,
    ) -> Result<Claimer, QueueError> {
        let row: Option<AgentLockRow> = sqlx::query_as(sql::READ_CLAIMER)
            .bind(agent_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row
            .ok_or_else(|| QueueError::NotFound {
                what: "agent",
                id: agent_id.to_string(),
            })?
            .into())
    }

    /// Claims the first order eligible for the agent in hand-out order (docs/design.md §3:
    /// the tenant served least recently, then priority, then age; `queue::turns`), at most once
    /// under any concurrency (`FOR UPDATE SKIP LOCKED`). `work_types` narrows the agent's capabilities for
    /// this call. `None` when nothing is eligible or the agent is at `max_concurrency`.
    pub async fn claim_next(
        &self,
        req: &ClaimRequest,
        work_types: &[WorkType],
    ) -> Result<Option<WorkOrder>, QueueError> {
        Ok(self.claim_next_many(req, work_types, 1).await?.pop())
    }

    /// Multi-claim: [`Self::claim_next`] for up to `max_orders` orders (at least 1) in one
    /// statement and one commit, in hand-out order (the tenant whose turn it is first, then the
    /// next tenant's turn); an agent with `max_concurrency` gets no more than
    /// its free room. Empty when nothing is eligible or the agent has no room. The caller
    /// bounds `max_orders` (`queue::limits::MAX_ORDERS_PER_CLAIM`).
    pub async fn claim_next_many(
        &self,
        req: &ClaimRequest,
        work_types: &[WorkType],
        max_orders: usize,
    ) -> Result<Vec<WorkOrder>, QueueError> {
        Ok(self.claim_next_as(req, work_types, max_orders).await?.0)
    }

    /// [`Self::claim_next_many`], also returning the claimer (the wait list learns from it which
    /// orders it may take). One statement (`sql/claim_next.sql`, or `claim_next_fair.sql` while
    /// tenants compete) for an agent without `max_concurrency`; a transaction for one with it
    /// ([`Self::claim_next_capped`]).
    pub(super) async fn claim_next_as(
        &self,
        req: &ClaimRequest,
        work_types: &[WorkType],
        max_orders: usize,
    ) -> Result<(Vec<WorkOrder>, Claimer), QueueError> {
        let statement = self.fair_or(sql::CLAIM_NEXT_FAIR, sql::CLAIM_NEXT).await?;
        if let Some(group) = &self.group_claims
            && max_orders == 1
        {
            let fair = statement == sql::CLAIM_NEXT_FAIR;
            match group
                .claim(
                    req.agent_id,
                    req.lease_seconds,
                    type_names(work_types),
                    fair,
                )
                .await
            {
                group::Reply::Claimed(orders, claimer) => return Ok((orders, claimer)),
                group::Reply::Failed(error) => return Err(error),
                group::Reply::Alone => {}
            }
        }
        let mut tries = 0;
        loop {
            tries += 1;
            let rows: Result<Vec<PgRow>, _> = take_claim(statement, req, max_orders)
                .bind(type_names(work_types))
                .fetch_all(&self.pool)
                .await;
            if matches!(&rows, Err(e) if deadlocked(e)) && try_again(tries).await {
                continue;
            }
            let run = claim_result(req, &rows?)?;
            self.park_turns(&run.idle_turns).await;
            if run.orders.is_empty() && run.contended && try_again(tries).await {
                continue;
            }
            if !run.orders.is_empty() || run.claimer.max_concurrency.is_none() {
                return Ok((run.orders, run.claimer));
            }
            return self.claim_next_capped(req, work_types, max_orders).await;
        }
    }

    /// `fair` while tenants compete for turns (`TurnMode::fair`), else `plain`: each claim-next
    /// statement has a form of each kind.
    async fn fair_or(
        &self,
        fair: &'static str,
        plain: &'static str,
    ) -> Result<&'static str, QueueError> {
        Ok(if self.turns.fair(&self.pool).await? {
            fair
        } else {
            plain
        })
    }

    /// Claim-next for an agent with `max_concurrency`, as a transaction: locks the agent row,
    /// then counts its claims in a later statement (so with a fresh snapshot, which the cap
    /// needs under concurrency), then claims up to its free room
    /// (`sql/claim_next_capped.sql`).
    async fn claim_next_capped(
        &self,
        req: &ClaimRequest,
        work_types: &[WorkType],
        max_orders: usize,
    ) -> Result<(Vec<WorkOrder>, Claimer), QueueError> {
        // Decided before the transaction: a look at the turns may need a connection of its
        // own, which must not be awaited while this one holds the agent's row lock.
        let statement = self
            .fair_or(sql::CLAIM_NEXT_CAPPED_FAIR, sql::CLAIM_NEXT_CAPPED)
            .await?;
        let mut tries = 0;
        loop {
            tries += 1;
            let mut tx = self.pool.begin().await?;
            let claimer = lock_claimer(&mut tx, req).await?;
            let room = room(
                claimer.max_concurrency,
                held_claims(&mut *tx, req.agent_id).await?,
            );
            if room == 0 {
                tx.commit().await?;
                return Ok((Vec::new(), claimer));
            }
            let rows = take_claim(statement, req, max_orders.min(room))
                .bind(type_names(work_types))
                .fetch_all(&mut *tx)
                .await;
            if matches!(&rows, Err(e) if deadlocked(e)) && try_again(tries).await {
                continue;
            }
            let run = claim_result(req, &rows?)?;
            tx.commit().await?;
            self.park_turns(&run.idle_turns).await;
            if run.orders.is_empty() && run.contended && try_again(tries).await {
                continue;
            }
            return Ok((run.orders, claimer));
        }
    }

    /// Claims one order by id (docs/design.md §5 `POST /work-orders/{id}/claim`). `404` when unknown
    /// or not visible to the agent; `409` when visible but not claimable now (claimed, backing
    /// off, agent at `max_concurrency`, concurrency key full). Eligibility is decided by the Rust side of
    /// `queue::eligibility` on the locked order (`sql/claim_candidate.sql`), so the answer can
    /// say which part failed.
    pub async fn claim(&self, order_id: Uuid, req: &ClaimRequest) -> Result<WorkOrder, QueueError> {
        let mut tx = self.pool.begin().await?;
        let order = claim_in(&mut tx, order_id, req).await?;
        tx.commit().await?;
        Ok(order)
    }
}

/// Claim by id ([`Queue::claim`]) inside `tx`, which the caller commits (or, in the tests that
/// ask what a claim would do, rolls back).
pub(in crate::queue) async fn claim_in(
    tx: &mut Transaction<'_, Postgres>,
    order_id: Uuid,
    req: &ClaimRequest,
) -> Result<WorkOrder, QueueError> {
    let claimer = lock_claimer(tx, req).await?;
    #[derive(sqlx::FromRow)]
    struct Candidate {
        work_type: String,
        tenant: Option<String>,
        #[sqlx(flatten)]
        targeting: TargetingColumns,
        status: String,
        next_retry_after: Option<DateTime<Utc>>,
        due: bool,
        concurrency_key: Option<String>,
        concurrency_max: Option<i32>,
        limited: bool,
    }
    let candidate: Option<Candidate> = sqlx::query_as(sql::CLAIM_CANDIDATE)
        .bind(order_id)
        .fetch_optional(&mut **tx)
        .await?;
    let not_found = || QueueError::NotFound {
        what: "work order",
        id: order_id.to_string(),
    };
    let c = candidate.ok_or_else(not_found)?;
    let targeting = Targeting::from(c.targeting);
    let work_type = WorkType::parse(&c.work_type).unwrap_or(WorkType::Custom);
    let visible = eligibility::agent_may_see(
        &claimer.profile,
        &OrderProfile {
            work_type,
            tenant: c.tenant.as_deref(),
            targeting: &targeting,
        },
    );
    if !visible {
        return Err(not_found());
    }
    let status = OrderStatus::parse(&c.status).unwrap_or(OrderStatus::Claimed);
    if !eligibility::claimable_now(status, c.due) {
        return Err(if status == OrderStatus::RetryPending {
            QueueError::conflict(
                ConflictCode::BackingOff,
                match c.next_retry_after {
                    Some(t) => format!(
                        "work order {order_id} is backing off until {}",
                        t.to_rfc3339()
                    ),
                    None => {
                        format!("work order {order_id} is waiting for a retry with no time set")
                    }
                },
            )
        } else {
            QueueError::conflict(
                ConflictCode::AlreadyClaimed,
                format!("work order {order_id} is already claimed"),
            )
        });
    }
    let key_full = || {
        QueueError::conflict(
            ConflictCode::ConcurrencyLimited,
            format!(
                "work order {order_id} waits for a slot of its concurrency key {:?}: {} claim(s) \
                 hold it",
                c.concurrency_key.as_deref().unwrap_or_default(),
                c.concurrency_max.unwrap_or(1)
            ),
        )
    };
    // Before the agent's own cap: the key is why the order waits whoever asks
    // (docs/design.md §10 puts `concurrency_limited` before `agents_busy`).
    if c.limited {
        return Err(key_full());
    }
    if at_capacity(
        claimer.max_concurrency,
        held_claims(&mut **tx, req.agent_id).await?,
    ) {
        return Err(QueueError::conflict(
            ConflictCode::MaxConcurrency,
            format!(
                "agent {} already holds max_concurrency ({}) claims",
                req.agent_id,
                claimer.max_concurrency.unwrap_or_default()
            ),
        ));
    }
    // The key can fill between the read above and the insert (another claim of the key, not of
    // this order): then the insert takes no slot and no row comes back.
    let row = take_claim(sql::CLAIM_BY_ID, req, 1)
        .bind(order_id)
        .fetch_optional(&mut **tx)
        .await?
        .ok_or_else(key_full)?;
    Ok(OrderRow::from_row(&row)?.into())
}

#[cfg(test)]
mod tests {
    use super::sql::{self, squash};

    /// The claim every claiming statement takes, and the order it returns (`sql/take_claim.sql`,
    /// `sql/claimed_order.sql`).
    const TAKE_CLAIM_SQL: &str = include_str!("../sql/take_claim.sql");
    /// Expanded by build.rs: it includes `sql/order_columns.sql`.
    const CLAIMED_ORDER_SQL: &str =
        include_str!(concat!(env!("OUT_DIR"), "/sql/claimed_order.sql"));

    #[test]
    fn every_claiming_statement_takes_the_claim_alike() {
        for (name, statement) in [
            ("claim_next", sql::CLAIM_NEXT),
            ("claim_next_capped", sql::CLAIM_NEXT_CAPPED),
            ("claim_next_fair", sql::CLAIM_NEXT_FAIR),
            ("claim_next_capped_fair", sql::CLAIM_NEXT_CAPPED_FAIR),
            ("claim_by_id", sql::CLAIM_BY_ID),
        ] {
            let statement = squash(statement);
            assert!(
                statement.contains(&squash(TAKE_CLAIM_SQL)),
                "sql/{name}.sql does not include sql/take_claim.sql"
            );
            assert!(
                statement.contains(&squash(CLAIMED_ORDER_SQL)),
                "sql/{name}.sql does not include sql/claimed_order.sql"
            );
        }
    }
}
