//! An order's history: its attempts (every claim, docs/design.md §5 `GET /work-orders/{id}/attempts`),
//! and re-runs (`POST /work-orders/{id}/rerun`).
//!
//! Where attempts are recorded (migration `20261203000001`): the live claim is its
//! `work_order_claims` row; a claim that ended without finishing the order is a
//! `work_order_attempts` row written by the statement that ended it (retry scheduled, reaper,
//! retirement); the claim that finished the order is the log entry's own claim columns.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::sql;
use super::validate::WorkOrderSpec;
use super::{
    Attempt, AttemptResult, ConflictCode, Created, IdempotencyKey, Lookup, Queue, QueueError,
};

#[derive(sqlx::FromRow)]
struct AttemptRow {
    agent_id: Uuid,
    claim_id: Uuid,
    started_at: DateTime<Utc>,
    ended_at: Option<DateTime<Utc>>,
    result: String,
    message: Option<String>,
}

impl From<AttemptRow> for Attempt {
    fn from(r: AttemptRow) -> Self {
        let result = match r.result.as_str() {
            "running" => AttemptResult::Running,
            "succeeded" => AttemptResult::Succeeded,
            "retry_scheduled" => AttemptResult::RetryScheduled,
            "reclaimed" => AttemptResult::Reclaimed,
            "released" => AttemptResult::Released,
            "cancelled" => AttemptResult::Cancelled,
            "disrupted" => AttemptResult::Disrupted,
            // `failed`, and nothing else: the CHECK constraints allow no other spelling.
            _ => AttemptResult::Failed,
        };
        Attempt {
            agent_id: r.agent_id,
            claim_id: r.claim_id,
            started_at: r.started_at,
            ended_at: r.ended_at,
            result,
            message: r.message,
        }
    }
}

impl Queue {
    /// Every attempt (claim) of an active or finished order, oldest first; `404` for an unknown
    /// id. An order never claimed has none.
    pub async fn attempts(&self, id: Uuid) -> Result<Vec<Attempt>, QueueError> {
        let rows: Vec<AttemptRow> = sqlx::query_as(sql::ATTEMPTS)
            .bind(id)
            .fetch_all(&self.pool)
            .await?;
        if rows.is_empty() && matches!(self.lookup(id, false).await?, Lookup::Unknown) {
            return Err(QueueError::NotFound {
                what: "work order",
                id: id.to_string(),
            });
        }
        Ok(rows.into_iter().map(Into::into).collect())
    }

    /// Queues a new order with the work, settings and targeting of the finished order `id`
    /// (docs/design.md §5 `rerun`); the new order's `rerun_of` names `id`. `409 not_finished` while
    /// `id` is active, `404` when unknown. With `key`, a repeated call returns the order the
    /// first one made, as for create. A re-run is an API order whatever its original's source.
    pub async fn rerun(
        &self,
        id: Uuid,
        key: Option<&IdempotencyKey>,
    ) -> Result<Created, QueueError> {
        let entry = match self.lookup(id, true).await? {
            Lookup::Finished(entry) => entry,
            Lookup::Active(order) => {
                return Err(QueueError::conflict(
                    ConflictCode::NotFinished,
                    format!(
                        "work order {id} has not finished (it is {}); only finished orders can \
                         be re-run",
                        order.status.as_str()
                    ),
                ));
            }
            Lookup::Unknown => {
                return Err(QueueError::NotFound {
                    what: "work order",
                    id: id.to_string(),
                });
            }
        };
        let spec = WorkOrderSpec {
            work_type: entry.work_type,
            yaml_content: entry.yaml_content.unwrap_or_default(),
            max_retries: entry.max_retries,
            backoff_seconds: entry.backoff_seconds,
            claim_timeout_seconds: entry.claim_timeout_seconds,
            max_reclaims: entry.max_reclaims,
            priority: entry.priority,
            concurrency: entry.concurrency,
            tenant: entry.tenant,
            targeting: entry.targeting,
            retry_on_disruption: entry.retry_on_disruption,
        };
        self.create_api_order(&spec, key, Some(id)).await
    }
}
