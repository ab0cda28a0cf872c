//! The claim protocol (DESIGN.md §2, §3, §5): pending list, claim by id, claim-next here;
//! heartbeat and complete in `holder`; one-statement forms of the hot paths in `fastpath`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgArguments;
use sqlx::query::QueryAs;
use sqlx::types::Json;
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

mod fastpath;
mod holder;

use super::rules::{self, AgentProfile, OrderProfile};
use super::wake::WakeFilter;
use super::{
    ConflictCode, OrderRow, Page, Queue, QueueError, Targeting, WorkOrder, WorkType, cursor,
    order_columns,
};

/// Who claims, and with what lease (seconds; `None` = no lease, DESIGN.md §2).
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest {
    pub agent_id: Uuid,
    pub lease_seconds: Option<i32>,
}

/// `200` body of a heartbeat: the new lease end (absent for a claim without a lease) and the hard
/// end of the claim (`claimed_at + claim_timeout_seconds`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Heartbeat {
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub claim_expires_at: DateTime<Utc>,
}

/// SQL expressions naming the claiming agent's side of eligibility (DESIGN.md §3): bound
/// parameters, or sub-queries on a locked agent row.
struct AgentSql<'a> {
    id: &'a str,
    name: &'a str,
    labels: &'a str,
    annotation_pairs: &'a str,
    /// A condition on `w.work_type` (capabilities and the request's narrowing).
    work_types: &'a str,
    tenant: &'a str,
}

/// The agent bound as $1 id, $2 name, $3 labels, $4 annotation pairs, $5 effective work types
/// (empty = all), $6 tenant.
const BOUND_AGENT: AgentSql<'static> = AgentSql {
    id: "$1::uuid",
    name: "$2::text",
    labels: "$3::text[]",
    annotation_pairs: "$4::text[]",
    work_types: "(cardinality($5::text[]) = 0 OR w.work_type = ANY($5::text[]))",
    tenant: "$6::text",
};

/// Eligibility of order `w` for an agent (DESIGN.md §3). The first conjunct repeats the partial
/// index predicate so the planner can use `work_orders_claimable`.
fn eligible(a: &AgentSql<'_>) -> String {
    format!(
        "w.status IN ('PENDING', 'RETRY_PENDING') \
         AND (w.status = 'PENDING' OR w.next_retry_after <= now()) \
         AND (w.target_agent_ids @> ARRAY[{id}] OR {name} = ANY(w.target_agent_names) \
              OR w.target_labels && {labels} OR w.target_annotation_pairs && {pairs}) \
         AND {types} AND ({tenant} IS NULL OR w.tenant = {tenant})",
        id = a.id,
        name = a.name,
        labels = a.labels,
        pairs = a.annotation_pairs,
        types = a.work_types,
        tenant = a.tenant,
    )
}

/// When recording contact (`last_seen_at`) is due: at most once a second per agent. Every record
/// rewrites the agent's row; done on each claim and completion, the 16-row `agents` heap grew to
/// 1.3 MiB in a 10-minute soak while the agent was found by a sequential scan (planned when the
/// table was one page), and autovacuum never ran (HOT pruning kept the dead-row count under its
/// threshold, so the free space map never learned of the space). Health thresholds are minutes
/// (DESIGN.md §5), so a second is fine-grained enough.
const CONTACT_DUE: &str = "(last_seen_at IS NULL OR last_seen_at < now() - interval '1 second')";

/// The claiming agent's row, read under its row lock. Columns are prefixed `a_` so they can
/// share a result row with an order's ([`CLAIMER_COLUMNS`]).
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
    #[sqlx(rename = "a_annotation_pairs")]
    annotation_pairs: Vec<String>,
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
    profile: AgentProfile,
    annotation_pairs: Vec<String>,
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
            annotation_pairs: r.annotation_pairs,
            max_concurrency: r.max_concurrency,
        }
    }
}

const CLAIMER_COLUMNS: &str = "id AS a_id, name AS a_name, labels AS a_labels, \
    annotations AS a_annotations, annotation_pairs AS a_annotation_pairs, \
    work_types AS a_work_types, tenant AS a_tenant, max_concurrency AS a_max_concurrency, \
    retired_at AS a_retired_at";

impl Claimer {
    /// Which claimable-order notices this claim-next would act on (see `queue::wake`).
    pub(in crate::queue) fn wake_filter(&self, requested: &[WorkType]) -> WakeFilter {
        let mut agent = self.profile.clone();
        let types = match self.effective_types(requested) {
            Some(types) => types,
            // Nothing this call may take: a filter that admits no notice.
            None => {
                agent.retired = true;
                vec![]
            }
        };
        WakeFilter { agent, types }
    }

    /// Binds [`BOUND_AGENT`]'s $1–$6 with this agent and the effective `types`.
    fn bind<'q, O>(
        &'q self,
        query: QueryAs<'q, Postgres, O, PgArguments>,
        types: &'q Vec<&'static str>,
    ) -> QueryAs<'q, Postgres, O, PgArguments> {
        query
            .bind(self.profile.id)
            .bind(&self.profile.name)
            .bind(&self.profile.labels)
            .bind(&self.annotation_pairs)
            .bind(types)
            .bind(&self.profile.tenant)
    }

    /// Work types this claim may take: the agent's capabilities narrowed by the request.
    /// `None` when nothing is left; `Some(empty)` = all types.
    fn effective_types(&self, requested: &[WorkType]) -> Option<Vec<WorkType>> {
        let caps = &self.profile.work_types;
        let types: Vec<WorkType> = match (caps.is_empty(), requested.is_empty()) {
            (true, _) => requested.to_vec(),
            (false, true) => caps.clone(),
            (false, false) => requested
                .iter()
                .copied()
                .filter(|t| caps.contains(t))
                .collect(),
        };
        if types.is_empty() && !(caps.is_empty() && requested.is_empty()) {
            return None;
        }
        Some(types)
    }
}

/// Locks the agent row for the rest of the transaction (serializing this agent's claims, so
/// `max_concurrency` holds) and records the contact.
async fn lock_claimer(
    tx: &mut Transaction<'_, Postgres>,
    req: &ClaimRequest,
) -> Result<Claimer, QueueError> {
    let sql = format!(
        "UPDATE agents SET last_seen_at = now(), lease_seconds = COALESCE($2, lease_seconds) \
         WHERE id = $1 RETURNING {CLAIMER_COLUMNS}"
    );
    let row: Option<AgentLockRow> = sqlx::query_as(&sql)
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
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM work_order_claims WHERE agent_id = $1")
        .bind(agent_id)
        .fetch_one(exec)
        .await?;
    Ok(n)
}

fn at_capacity(max_concurrency: Option<i32>, held: i64) -> bool {
    max_concurrency.is_some_and(|max| held >= i64::from(max))
}

/// CTEs `claim` (inserts the claim row) and `upd` (marks the order `CLAIMED`) for the order
/// named by relation `target` (column `id`); the arguments are SQL expressions for the new claim
/// id, the agent id and the lease seconds (NULL = no lease).
fn claim_ctes(claim_id: &str, agent_id: &str, lease: &str) -> String {
    format!(
        "claim AS (INSERT INTO work_order_claims (work_order_id, claim_id, agent_id, claimed_at, \
             deadline, lease_seconds, lease_expires_at) \
           SELECT w.id, {claim_id}, {agent_id}, now(), \
             now() + make_interval(secs => w.claim_timeout_seconds), \
             {lease}::int, CASE WHEN {lease}::int IS NULL THEN NULL ELSE \
               LEAST(now() + make_interval(secs => {lease}::int), \
                     now() + make_interval(secs => w.claim_timeout_seconds)) END \
           FROM target JOIN work_orders w ON w.id = target.id RETURNING *), \
         upd AS (UPDATE work_orders w SET status = 'CLAIMED', last_claimed_by = claim.agent_id, \
             last_claim_id = claim.claim_id, next_retry_after = NULL, updated_at = now() \
           FROM claim WHERE w.id = claim.work_order_id RETURNING w.*)"
    )
}

/// The claimed order with `yaml_content`, from the CTEs of [`claim_ctes`].
fn claimed_order_select() -> String {
    format!(
        "SELECT {} FROM upd w JOIN claim c ON c.work_order_id = w.id",
        order_columns(true)
    )
}

/// Claims the order named by `target` (a query yielding column `id`); see [`claim_ctes`]. The
/// claim id, agent id and lease seconds are bound as `$n`, `$n+1`, `$n+2` with `n = first`,
/// after the target's own parameters.
fn claim_statement(target: &str, first: usize) -> String {
    format!(
        "WITH target AS ({target}), {} {}",
        claim_ctes(
            &format!("${first}"),
            &format!("${}", first + 1),
            &format!("${}", first + 2)
        ),
        claimed_order_select()
    )
}

impl Queue {
    /// What `agent_id` may claim now, oldest first, without `yaml_content` (DESIGN.md §5
    /// `GET /agents/{id}/work-orders/pending`). Side-effect free. Empty for a retired agent or one
    /// at its `max_concurrency`, because claim would accept nothing then.
    pub async fn pending_for_agent(
        &self,
        agent_id: Uuid,
        work_types: &[WorkType],
        limit: i64,
        cursor_text: Option<&str>,
    ) -> Result<Page<WorkOrder>, QueueError> {
        let after = cursor_text.map(cursor::decode).transpose()?;
        let sql = format!("SELECT {CLAIMER_COLUMNS} FROM agents WHERE id = $1");
        let row: Option<AgentLockRow> = sqlx::query_as(&sql)
            .bind(agent_id)
            .fetch_optional(&self.pool)
            .await?;
        let claimer: Claimer = row
            .ok_or_else(|| QueueError::NotFound {
                what: "agent",
                id: agent_id.to_string(),
            })?
            .into();
        let empty = Page {
            items: vec![],
            next_cursor: None,
        };
        if claimer.profile.retired
            || at_capacity(
                claimer.max_concurrency,
                held_claims(&self.pool, agent_id).await?,
            )
        {
            return Ok(empty);
        }
        let Some(types) = claimer.effective_types(work_types) else {
            return Ok(empty);
        };
        let types = type_names(&types);
        let sql = format!(
            "SELECT {} FROM work_orders w LEFT JOIN work_order_claims c ON c.work_order_id = w.id \
             WHERE {} AND ($7::timestamptz IS NULL OR (w.created_at, w.id) > ($7, $8)) \
             ORDER BY w.created_at, w.id LIMIT $9",
            order_columns(false),
            eligible(&BOUND_AGENT)
        );
        let rows: Vec<OrderRow> = claimer
            .bind(sqlx::query_as(&sql), &types)
            .bind(after.map(|a| a.0))
            .bind(after.map(|a| a.1))
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        let items: Vec<WorkOrder> = rows.into_iter().map(Into::into).collect();
        let next_cursor = (items.len() as i64 == limit)
            .then(|| items.last().map(|o| cursor::encode(o.created_at, o.id)))
            .flatten();
        Ok(Page { items, next_cursor })
    }

    /// Claims the oldest order eligible for the agent (DESIGN.md §3), at most once under any
    /// concurrency (`FOR UPDATE SKIP LOCKED`). `work_types` narrows the agent's capabilities for
    /// this call. `None` when nothing is eligible or the agent is at `max_concurrency`.
    pub async fn claim_next(
        &self,
        req: &ClaimRequest,
        work_types: &[WorkType],
    ) -> Result<Option<WorkOrder>, QueueError> {
        Ok(self.claim_next_as(req, work_types).await?.0)
    }

    /// [`Self::claim_next`], also returning the claimer (the wait list learns from it which
    /// orders it may take).
    pub(super) async fn claim_next_as(
        &self,
        req: &ClaimRequest,
        work_types: &[WorkType],
    ) -> Result<(Option<WorkOrder>, Claimer), QueueError> {
        let (claimer, order) = self.claim_next_one_trip(req, work_types).await?;
        if claimer.profile.retired {
            return Err(retired(req.agent_id));
        }
        if order.is_some() || claimer.max_concurrency.is_none() {
            return Ok((order, claimer));
        }
        self.claim_next_locked(req, work_types).await
    }

    /// Claim-next as a transaction: locks the agent row, then counts its claims in a later
    /// statement (so with a fresh snapshot, which `max_concurrency` needs under concurrency).
    async fn claim_next_locked(
        &self,
        req: &ClaimRequest,
        work_types: &[WorkType],
    ) -> Result<(Option<WorkOrder>, Claimer), QueueError> {
        let mut tx = self.pool.begin().await?;
        let claimer = lock_claimer(&mut tx, req).await?;
        let Some(types) = claimer.effective_types(work_types) else {
            tx.commit().await?;
            return Ok((None, claimer));
        };
        let types = type_names(&types);
        if claimer.max_concurrency.is_some()
            && at_capacity(
                claimer.max_concurrency,
                held_claims(&mut *tx, req.agent_id).await?,
            )
        {
            tx.commit().await?;
            return Ok((None, claimer));
        }
        let sql = claim_statement(
            &format!(
                "SELECT w.id FROM work_orders w WHERE {} \
                 ORDER BY w.created_at, w.id LIMIT 1 FOR UPDATE SKIP LOCKED",
                eligible(&BOUND_AGENT)
            ),
            7,
        );
        let row: Option<OrderRow> = claimer
            .bind(sqlx::query_as(&sql), &types)
            .bind(Uuid::new_v4())
            .bind(req.agent_id)
            .bind(req.lease_seconds)
            .fetch_optional(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok((row.map(Into::into), claimer))
    }

    /// Claims one order by id (DESIGN.md §5 `POST /work-orders/{id}/claim`). `404` when unknown
    /// or not visible to the agent; `409` when visible but not claimable now (claimed, backing
    /// off, agent at `max_concurrency`).
    pub async fn claim(&self, order_id: Uuid, req: &ClaimRequest) -> Result<WorkOrder, QueueError> {
        let mut tx = self.pool.begin().await?;
        let claimer = lock_claimer(&mut tx, req).await?;
        #[derive(sqlx::FromRow)]
        struct Candidate {
            work_type: String,
            tenant: Option<String>,
            target_agent_ids: Vec<Uuid>,
            target_agent_names: Vec<String>,
            target_labels: Vec<String>,
            target_annotations: Json<BTreeMap<String, String>>,
            status: String,
            next_retry_after: Option<DateTime<Utc>>,
            due: bool,
        }
        let candidate: Option<Candidate> = sqlx::query_as(
            "SELECT work_type, tenant, target_agent_ids, target_agent_names, target_labels, \
             target_annotations, status, next_retry_after, \
             COALESCE(next_retry_after <= now(), true) AS due \
             FROM work_orders WHERE id = $1 FOR UPDATE",
        )
        .bind(order_id)
        .fetch_optional(&mut *tx)
        .await?;
        let not_found = || QueueError::NotFound {
            what: "work order",
            id: order_id.to_string(),
        };
        let c = candidate.ok_or_else(not_found)?;
        let targeting = Targeting {
            agent_ids: c.target_agent_ids,
            agent_names: c.target_agent_names,
            labels: c.target_labels,
            annotations: c.target_annotations.0,
        };
        let work_type = WorkType::parse(&c.work_type).unwrap_or(WorkType::Custom);
        let visible = rules::agent_may_see(
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
        match c.status.as_str() {
            "CLAIMED" => {
                return Err(QueueError::conflict(
                    ConflictCode::AlreadyClaimed,
                    format!("work order {order_id} is already claimed"),
                ));
            }
            "RETRY_PENDING" if !c.due => {
                return Err(QueueError::conflict(
                    ConflictCode::BackingOff,
                    format!(
                        "work order {order_id} is backing off until {}",
                        c.next_retry_after
                            .map(|t| t.to_rfc3339())
                            .unwrap_or_default()
                    ),
                ));
            }
            _ => {}
        }
        if at_capacity(
            claimer.max_concurrency,
            held_claims(&mut *tx, req.agent_id).await?,
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
        let sql = claim_statement("SELECT $1::uuid AS id", 2);
        let row: OrderRow = sqlx::query_as(&sql)
            .bind(order_id)
            .bind(Uuid::new_v4())
            .bind(req.agent_id)
            .bind(req.lease_seconds)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(row.into())
    }
}
