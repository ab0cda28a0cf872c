//! Agents and their tokens (DESIGN.md §5): registration, listing with derived health, token
//! rotation, retirement.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use uuid::Uuid;

use super::validate::AgentSpec;
use super::{
    Agent, AgentWithToken, ConflictCode, Page, Queue, QueueError, WorkType, cursor, rules,
};
use crate::auth::token;

/// Result of checking an agent bearer token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenCheck {
    /// The token is live and bound to this agent.
    Valid { agent_id: Uuid },
    /// Unknown, revoked, or the secret does not match.
    Invalid,
}

const AGENT_COLUMNS: &str = "a.id, a.name, a.labels, a.annotations, a.work_types, a.tenant, \
    a.max_concurrency, a.lease_seconds, a.created_at, a.last_seen_at, a.retired_at, now() AS now, \
    (SELECT count(*) FROM work_order_claims c WHERE c.agent_id = a.id) AS active_claims";

#[derive(sqlx::FromRow)]
struct AgentRow {
    id: Uuid,
    name: String,
    labels: Vec<String>,
    annotations: Json<BTreeMap<String, String>>,
    work_types: Vec<String>,
    tenant: Option<String>,
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
        Agent {
            health: rules::agent_health(
                r.retired_at.is_some(),
                r.last_seen_at,
                r.lease_seconds,
                r.now,
            ),
            id: r.id,
            name: r.name,
            labels: r.labels,
            annotations: r.annotations.0,
            work_types: WorkType::parse_all(&r.work_types),
            tenant: r.tenant,
            max_concurrency: r.max_concurrency,
            lease_seconds: r.lease_seconds,
            active_claims: r.active_claims,
            created_at: r.created_at,
            last_seen_at: r.last_seen_at,
            retired_at: r.retired_at,
        }
    }
}

fn work_type_strings(types: &[WorkType]) -> Vec<&'static str> {
    types.iter().map(|t| t.as_str()).collect()
}

impl Queue {
    /// Registers an agent and mints its first token (DESIGN.md §5 `POST /agents`). With `id`
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
        let inserted = sqlx::query(
            "INSERT INTO agents (id, name, labels, annotations, annotation_pairs, work_types, \
             tenant, max_concurrency, lease_seconds) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(id)
        .bind(&spec.name)
        .bind(&spec.labels)
        .bind(Json(&spec.annotations))
        .bind(rules::annotation_pairs(&spec.annotations))
        .bind(work_type_strings(&spec.work_types))
        .bind(&spec.tenant)
        .bind(spec.max_concurrency)
        .bind(spec.lease_seconds)
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
        self.verified_tokens.forget_agent(id);
        Ok(AgentWithToken {
            agent: self.get_agent(id).await?,
            token: minted.text,
        })
    }

    /// Updates an agent's attributes in place (the Executor reconciler keeps them in step with
    /// the resource). The token is untouched. `404` for an unknown agent, `409` for a retired one.
    pub async fn update_agent(&self, id: Uuid, spec: &AgentSpec) -> Result<Agent, QueueError> {
        let updated = sqlx::query(
            "UPDATE agents SET name = $2, labels = $3, annotations = $4, annotation_pairs = $5, \
             work_types = $6, tenant = $7, max_concurrency = $8, lease_seconds = $9 \
             WHERE id = $1 AND retired_at IS NULL",
        )
        .bind(id)
        .bind(&spec.name)
        .bind(&spec.labels)
        .bind(Json(&spec.annotations))
        .bind(rules::annotation_pairs(&spec.annotations))
        .bind(work_type_strings(&spec.work_types))
        .bind(&spec.tenant)
        .bind(spec.max_concurrency)
        .bind(spec.lease_seconds)
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
        let sql = format!("SELECT {AGENT_COLUMNS} FROM agents a WHERE a.id = $1");
        let row: Option<AgentRow> = sqlx::query_as(&sql)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(Into::into).ok_or_else(|| QueueError::NotFound {
            what: "agent",
            id: id.to_string(),
        })
    }

    /// Agents in registration order (DESIGN.md §5 `GET /agents`).
    pub async fn list_agents(
        &self,
        limit: i64,
        cursor_text: Option<&str>,
    ) -> Result<Page<Agent>, QueueError> {
        let after = cursor_text.map(cursor::decode).transpose()?;
        let sql = format!(
            "SELECT {AGENT_COLUMNS} FROM agents a \
             WHERE ($1::timestamptz IS NULL OR (a.created_at, a.id) > ($1, $2)) \
             ORDER BY a.created_at, a.id LIMIT $3"
        );
        let rows: Vec<AgentRow> = sqlx::query_as(&sql)
            .bind(after.map(|a| a.0))
            .bind(after.map(|a| a.1))
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        let items: Vec<Agent> = rows.into_iter().map(Into::into).collect();
        let next_cursor = (items.len() as i64 == limit)
            .then(|| items.last().map(|a| cursor::encode(a.created_at, a.id)))
            .flatten();
        Ok(Page { items, next_cursor })
    }

    /// Revokes every live token of the agent and mints a new one (DESIGN.md §5
    /// `POST /agents/{id}/token`). `404` unknown, `409 agent_retired`.
    pub async fn rotate_agent_token(&self, id: Uuid) -> Result<AgentWithToken, QueueError> {
        let minted = token::mint_agent_token();
        let mut tx = self.pool.begin().await?;
        let live: Option<(Option<DateTime<Utc>>,)> =
            sqlx::query_as("SELECT retired_at FROM agents WHERE id = $1 FOR UPDATE")
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
        sqlx::query(
            "UPDATE agent_tokens SET revoked_at = now() WHERE agent_id = $1 AND revoked_at IS NULL",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?;
        insert_token(&mut tx, id, &minted).await?;
        tx.commit().await?;
        self.verified_tokens.forget_agent(id);
        Ok(AgentWithToken {
            agent: self.get_agent(id).await?,
            token: minted.text,
        })
    }

    /// Retires an agent (DESIGN.md §5 `DELETE /agents/{id}`): tokens revoked, its claims returned
    /// to `PENDING` (not counted as reclaims). Retiring a retired agent changes nothing.
    pub async fn retire_agent(&self, id: Uuid) -> Result<Agent, QueueError> {
        let mut tx = self.pool.begin().await?;
        let found: Option<(Uuid,)> = sqlx::query_as(
            "UPDATE agents SET retired_at = COALESCE(retired_at, now()) WHERE id = $1 RETURNING id",
        )
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        if found.is_none() {
            return Err(QueueError::NotFound {
                what: "agent",
                id: id.to_string(),
            });
        }
        sqlx::query(
            "UPDATE agent_tokens SET revoked_at = now() WHERE agent_id = $1 AND revoked_at IS NULL",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?;
        // Lock order: agent (above), then orders, then claims.
        sqlx::query(
            "WITH held AS (SELECT w.id FROM work_orders w JOIN work_order_claims c \
               ON c.work_order_id = w.id WHERE c.agent_id = $1 ORDER BY w.id FOR UPDATE OF w), \
             released AS (DELETE FROM work_order_claims c USING held \
               WHERE c.work_order_id = held.id \
               RETURNING c.work_order_id, c.claim_id, c.agent_id, c.claimed_at), \
             remembered AS (INSERT INTO released_claims (claim_id, work_order_id, agent_id) \
               SELECT claim_id, work_order_id, agent_id FROM released), \
             attempt AS (INSERT INTO work_order_attempts \
               (claim_id, work_order_id, agent_id, started_at, ended, message) \
               SELECT claim_id, work_order_id, agent_id, claimed_at, 'released', \
                 'its agent was retired' FROM released) \
             UPDATE work_orders w SET status = 'PENDING', updated_at = now() \
             FROM released WHERE w.id = released.work_order_id",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        self.verified_tokens.forget_agent(id);
        self.get_agent(id).await
    }

    /// Checks an agent bearer token (DESIGN.md §5). The secret is compared in constant time.
    /// A token verified within the last second is trusted without a database read
    /// ([`crate::auth::cache`]); revocation through this process takes effect at once, through
    /// another replica within that second.
    pub async fn check_agent_token(&self, text: &str) -> Result<TokenCheck, QueueError> {
        let Some((token_id, secret)) = token::parse_agent_token(text) else {
            return Ok(TokenCheck::Invalid);
        };
        if let Some(agent_id) = self.verified_tokens.agent_for(token_id, secret) {
            return Ok(TokenCheck::Valid { agent_id });
        }
        let row: Option<(Uuid, Vec<u8>)> = sqlx::query_as(
            "SELECT t.agent_id, t.secret_hash FROM agent_tokens t JOIN agents a ON a.id = t.agent_id \
             WHERE t.id = $1 AND t.revoked_at IS NULL AND a.retired_at IS NULL",
        )
        .bind(token_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(match row {
            Some((agent_id, stored)) if token::verify(secret, &stored) => {
                self.verified_tokens.remember(token_id, secret, agent_id);
                TokenCheck::Valid { agent_id }
            }
            _ => TokenCheck::Invalid,
        })
    }
}

async fn insert_token(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    agent_id: Uuid,
    minted: &token::MintedToken,
) -> Result<(), QueueError> {
    sqlx::query("INSERT INTO agent_tokens (id, agent_id, secret_hash) VALUES ($1, $2, $3)")
        .bind(minted.id)
        .bind(agent_id)
        .bind(&minted.secret_hash)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
