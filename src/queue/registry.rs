//! The agent registry (docs/design.md §5): registration, listing with derived health, token rotation,
//! retirement, and the storage of agent tokens (their checking and caching is `crate::auth`'s).
//! Not to be confused with `crate::pull` (the pull loop agents run) or `crate::api::agents` (the routes).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use uuid::Uuid;

use super::validate::AgentSpec;
use super::{
    Agent, AgentWithToken, ConflictCode, Page, Queue, QueueError, WorkType, cursor, eligibility,
    rules, sql,
};
use crate::auth::token;

/// The columns of an agent that make its profile (docs/design.md §3), as every agent query that
/// is not a claim's returns them: one row shape and one mapping, flattened into the rows below
/// and `queue::explain`'s. (A claim's row carries an order's columns too, so its agent columns are
/// prefixed: `queue::claims::AgentLockRow`.)
#[derive(sqlx::FromRow)]
pub(in crate::queue) struct AgentProfileRow {
    id: Uuid,
    name: String,
    labels: Vec<String>,
    annotations: Json<BTreeMap<String, String>>,
    work_types: Vec<String>,
    tenant: Option<String>,
}

impl AgentProfileRow {
    pub(in crate::queue) fn into_profile(self, retired: bool) -> eligibility::AgentProfile {
        eligibility::AgentProfile {
            id: self.id,
            name: self.name,
            labels: self.labels,
            annotations: self.annotations.0,
            work_types: WorkType::parse_all(&self.work_types),
            tenant: self.tenant,
            retired,
        }
    }
}

/// An agent as `sql/get_agent.sql` and `sql/list_agents.sql` return it.
#[derive(sqlx::FromRow)]
struct AgentRow {
    #[sqlx(flatten)]
    profile: AgentProfileRow,
    max_concurrency: Option<i32>,
    lease_seconds: Option<i32>,
    created_at: DateTime<Utc>,
    last_seen_at: Option<DateTime<Utc>>,
    retired_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    active_claims: i64,
}

impl From<AgentRow> for Agent {
    fn from(r: AgentRow) -> Self {
        let health = rules::agent_health(
            r.retired_at.is_some(),
            r.last_seen_at,
            r.lease_seconds,
            r.now,
        );
        let p = r.profile.into_profile(r.retired_at.is_some());
        Agent {
            health,
            id: p.id,
            name: p.name,
            labels: p.labels,
            annotations: p.annotations,
            work_types: p.work_types,
            tenant: p.tenant,
            max_concurrency: r.max_concurrency,
            lease_seconds: r.lease_seconds,
            active_claims: r.active_claims,
            created_at: r.created_at,
            last_seen_at: r.last_seen_at,
            retired_at: r.retired_at,
        }
    }
}

/// Binds `$1` id and `$2`–`$9` the agent's attributes, in the order `sql/insert_agent.sql` and
/// `sql/update_agent.sql` both list them.
fn bind_agent<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    id: Uuid,
    spec: &'q AgentSpec,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let work_types: Vec<&'static str> = spec.work_types.iter().map(|t| t.as_str()).collect();
    query
        .bind(id)
        .bind(&spec.name)
        .bind(&spec.labels)
        .bind(Json(&spec.annotations))
        .bind(eligibility::annotation_pairs(&spec.annotations))
        .bind(work_types)
        .bind(&spec.tenant)
        .bind(spec.max_concurrency)
        .bind(spec.lease_seconds)
}

impl Queue {
    /// Registers an agent and mints its first token (docs/design.md §5 `POST /agents`). With `id`
    /// given (an Executor's uid) the agent gets that id. A live agent with the same name is a
    /// `409 name_taken`.
    pub async fn register_agent(
        &self,
        spec: &AgentSpec,
        id: Option<Uuid>,
    ) -> Result<AgentWithToken, QueueError> {
        let id = id.unwrap_or_else(Uuid::new_v4);
        let minted = token::mint_agent_token();
        let mut tx = self.pool.begin().await?;
        let inserted = bind_agent(sqlx::query(sql::INSERT_AGENT), id, spec)
            .execute(&mut *tx)
            .await;
        if let Err(sqlx::Error::Database(db)) = &inserted
            && db.is_unique_violation()
        {
            return Err(if db.constraint() == Some("agents_live_name") {
                QueueError::conflict(
                    ConflictCode::NameTaken,
                    format!("name: a live agent is already named {:?}", spec.name),
                )
            } else {
                QueueError::conflict(
                    ConflictCode::NameTaken,
                    format!("an agent with id {id} already exists"),
                )
            });
        }
        inserted?;
        insert_token(&mut tx, id, &minted).await?;
        tx.commit().await?;
        // A new token revokes nothing (and the verified-token cache keeps only successes), so
        // the revocation count stays as it is.
        Ok(AgentWithToken {
            agent: self.get_agent(id).await?,
            token: minted.text,
        })
    }

    /// Updates an agent's attributes in place (the Executor reconciler keeps them in step with
    /// the resource). The token is untouched. `404` for an unknown agent, `409` for a retired one.
    pub async fn update_agent(&self, id: Uuid, spec: &AgentSpec) -> Result<Agent, QueueError> {
        let updated = bind_agent(sqlx::query(sql::UPDATE_AGENT), id, spec)
            .execute(&self.pool)
            .await?;
        let agent = self.get_agent(id).await?;
        if updated.rows_affected() == 0 {
            return Err(QueueError::conflict(
                ConflictCode::AgentRetired,
                format!("agent {id} is retired"),
            ));
        }
        Ok(agent)
    }

    /// One agent with derived health; `404` when unknown.
    pub async fn get_agent(&self, id: Uuid) -> Result<Agent, QueueError> {
        let row: Option<AgentRow> = sqlx::query_as(sql::GET_AGENT)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(Into::into).ok_or_else(|| QueueError::NotFound {
            what: "agent",
            id: id.to_string(),
        })
    }

    /// The id of the agent `name` means: the live agent of that name, else the newest retired
    /// one (names are unique among live agents only); `None` when no agent ever had it.
    pub async fn agent_named(&self, name: &str) -> Result<Option<Uuid>, QueueError> {
        Ok(sqlx::query_scalar(sql::AGENT_NAMED)
            .bind(name)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// Agents in registration order (docs/design.md §5 `GET /agents`).
    pub async fn list_agents(
        &self,
        limit: i64,
        cursor_text: Option<&str>,
    ) -> Result<Page<Agent>, QueueError> {
        let after = cursor_text.map(cursor::decode).transpose()?;
        let mut tx = cursor::page_transaction(&self.pool).await?;
        let rows: Vec<AgentRow> = sqlx::query_as(sql::LIST_AGENTS)
            .bind(after.map(|a| a.0))
            .bind(after.map(|a| a.1))
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        let items: Vec<Agent> = rows.into_iter().map(Into::into).collect();
        Ok(cursor::page(items, limit, |a| (a.created_at, a.id)))
    }

    /// Revokes every live token of the agent and mints a new one (docs/design.md §5
    /// `POST /agents/{id}/token`). `404` unknown, `409 agent_retired`.
    pub async fn rotate_agent_token(&self, id: Uuid) -> Result<AgentWithToken, QueueError> {
        let minted = token::mint_agent_token();
        let mut tx = self.pool.begin().await?;
        let live: Option<(Option<DateTime<Utc>>,)> = sqlx::query_as(sql::LOCK_AGENT)
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
        match live {
            None => {
                return Err(QueueError::NotFound {
                    what: "agent",
                    id: id.to_string(),
                });
            }
            Some((Some(_),)) => {
                return Err(QueueError::conflict(
                    ConflictCode::AgentRetired,
                    format!("agent {id} is retired; register a new agent instead"),
                ));
            }
            Some((None,)) => {}
        }
        sqlx::query(sql::REVOKE_AGENT_TOKENS)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        insert_token(&mut tx, id, &minted).await?;
        tx.commit().await?;
        self.note_tokens_revoked();
        Ok(AgentWithToken {
            agent: self.get_agent(id).await?,
            token: minted.text,
        })
    }

    /// Retires an agent (docs/design.md §5 `DELETE /agents/{id}`): tokens revoked, its claims returned
    /// to `PENDING` (not counted as reclaims). Retiring a retired agent changes nothing, and
    /// returns the claims a retirement cut short left held.
    ///
    /// Two transactions. The first marks the agent retired and revokes its tokens without waiting
    /// for its claims and completes in flight: they lock its row FOR KEY SHARE, and a FOR UPDATE
    /// waiting for them could be passed over for as long as the agent keeps working (PostgreSQL
    /// lets a lock that conflicts with no holder through past a waiter). Once it commits, claims
    /// see the agent retired. The second waits for those still in flight
    /// (`sql/await_agent_statements.sql`), then returns every claim of the agent to `PENDING`.
    pub async fn retire_agent(&self, id: Uuid) -> Result<Agent, QueueError> {
        let mut tx = self.pool.begin().await?;
        let found: Option<(Uuid,)> = sqlx::query_as(sql::RETIRE_AGENT)
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
        if found.is_none() {
            return Err(QueueError::NotFound {
                what: "agent",
                id: id.to_string(),
            });
        }
        sqlx::query(sql::REVOKE_AGENT_TOKENS)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        self.note_tokens_revoked();
        self.release_claims_of_retired(id, true).await?;
        self.get_agent(id).await
    }

    /// The second step of a retirement ([`Self::retire_agent`]), and of maintenance's release
    /// of what a retirement cut short left held: returns every claim retired agent `id` holds to
    /// `PENDING` (not counted as reclaims), after its claims and completes still in flight. A
    /// retirement waits for them (`sql/await_agent_statements.sql`); maintenance (`wait` false)
    /// leaves an agent row another transaction holds to its next pass
    /// (`sql/lock_retired_agent.sql`) and waits at most a second for an order row. Returns how
    /// many claims were released.
    async fn release_claims_of_retired(&self, id: Uuid, wait: bool) -> Result<u64, QueueError> {
        let mut tx = self.pool.begin().await?;
        // Lock order: agent, then orders, then claims.
        if wait {
            sqlx::query(sql::AWAIT_AGENT_STATEMENTS)
                .bind(id)
                .execute(&mut *tx)
                .await?;
        } else {
            let locked: Option<(Uuid,)> = sqlx::query_as(sql::LOCK_RETIRED_AGENT)
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
            if locked.is_none() {
                return Ok(0);
            }
            sqlx::query("SET LOCAL lock_timeout = '1s'")
                .execute(&mut *tx)
                .await?;
        }
        let released = sqlx::query(sql::RELEASE_AGENT_CLAIMS)
            .bind(id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(released)
    }

    /// Releases the claims retired agents still hold, as their retirement would have (a
    /// maintenance step: a retirement whose second transaction never ran, because the server
    /// died between the two or it failed, leaves them held). Agents retired in the last 10 s are
    /// left to their retirement. Never waits for long: an agent row another transaction holds
    /// is left to the next pass (`sql/lock_retired_agent.sql`), and an order row held for more
    /// than a second fails that agent's release, which is logged and left to the next pass too;
    /// the other agents go on. Returns how many claims were released.
    pub async fn release_claims_of_retired_agents(&self) -> Result<u64, QueueError> {
        let agents: Vec<(Uuid,)> = sqlx::query_as(sql::RETIRED_WITH_CLAIMS)
            .bind(100_i64)
            .fetch_all(&self.pool)
            .await?;
        let mut released = 0;
        for (agent,) in agents {
            match self.release_claims_of_retired(agent, false).await {
                Ok(n) => released += n,
                Err(error) => tracing::warn!(
                    %agent, %error,
                    "could not release the claims of a retired agent; the next maintenance pass tries again"
                ),
            }
        }
        Ok(released)
    }

    /// The stored hash of agent token `token_id` and its agent, when the token is live (not
    /// revoked) and its agent not retired (docs/design.md §5). Storage only: `crate::auth` compares
    /// the secret and caches the answer.
    pub async fn live_agent_token(
        &self,
        token_id: Uuid,
    ) -> Result<Option<StoredAgentToken>, QueueError> {
        let row: Option<(Uuid, Vec<u8>)> = sqlx::query_as(sql::LIVE_AGENT_TOKEN)
            .bind(token_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|(agent_id, secret_hash)| StoredAgentToken {
            agent_id,
            secret_hash,
        }))
    }

    /// How many times this process has revoked or replaced agent tokens (rotate, retire), counted after each commit. A cache of verified tokens that notes this before its
    /// database read, and trusts an entry only while it is unchanged, honours every revocation
    /// made through this process at once.
    pub fn token_revocations(&self) -> u64 {
        self.token_revocations
            .load(std::sync::atomic::Ordering::Acquire)
    }

    fn note_tokens_revoked(&self) {
        self.token_revocations
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// A live agent token as stored: its agent and the SHA-256 hash of its secret.
#[derive(Debug, Clone)]
pub struct StoredAgentToken {
    pub agent_id: Uuid,
    pub secret_hash: Vec<u8>,
}

async fn insert_token(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    agent_id: Uuid,
    minted: &token::MintedToken,
) -> Result<(), QueueError> {
    sqlx::query(sql::INSERT_AGENT_TOKEN)
        .bind(minted.id)
        .bind(agent_id)
        .bind(&minted.secret_hash)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
