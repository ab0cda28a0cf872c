//! Why a heartbeat or complete was refused (docs/design.md §5): the `code` of the `409`; and the
//! replay of a complete whose first answer was lost (docs/design.md §5 "Retry safety").
//!
//! The fencing itself is the statement's: a complete or heartbeat touches only the live claim
//! (`sql/live_claim.sql`). What this module decides, once nothing matched, in this order:
//!
//! | the order | this agent's claim (`claim_id` if named) | answer |
//! |---|---|---|
//! | any | ended by its own complete, same outcome | that complete's answer again (replay) |
//! | any | ended by its own complete, other outcome | `already_completed` |
//! | active | last held by this agent (lease or timeout ran out, or superseded) | `reclaimed` |
//! | active | released by the reaper or a retirement | `reclaimed` |
//! | active | another agent's, or none | `not_claim_holder` |
//! | in the log, cancelled | this agent's last claim | `cancelled` |
//! | in the log, ended by the reaper | this agent's last claim | `reclaimed` |
//! | in the log, otherwise | | `not_claim_holder` |
//! | unknown | | `404` |
//!
//! Replays need the `claim_id` ([`Queue::replay_or_refuse`]); the rest is
//! [`Queue::explain_refusal`] (`sql/refusal_active.sql`, then `sql/refusal_finished.sql`).

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::sql;
use super::{Completion, CompletionResult, ConflictCode, LogRow, Outcome, Queue, QueueError};

/// How a claim ended, as far as a repeated complete of it needs to know.
enum EndedClaim {
    /// The holder's complete scheduled a retry at this time (the order is active again).
    RetryScheduled(DateTime<Utc>),
    /// The holder's complete finished the order: its log entry.
    Finished(Box<super::LogEntry>),
}

impl Queue {
    /// A complete that found no live claim of this agent (docs/design.md §5 "Retry safety"): when the
    /// agent's own earlier complete of this claim ended it with the same outcome, the same answer
    /// again (the log entry, or the `202` with its `next_retry_after`), so an agent whose first
    /// answer was lost can tell success from loss. The same claim ended with a different outcome
    /// is `409 already_completed`; anything else is the `409` of [`Self::explain_refusal`].
    ///
    /// Only a request naming its `claim_id` is replayed: without the fencing token the server
    /// cannot tell a repeat from a second report, so that stays `409` as before.
    /// A retry-scheduled answer is repeated only until the order is claimed again: after that the
    /// claim it answered is history and the agent is told `not_claim_holder`.
    pub(super) async fn replay_or_refuse(
        &self,
        order_id: Uuid,
        agent_id: Uuid,
        claim_id: Option<Uuid>,
        completion: &Completion,
    ) -> Result<CompletionResult, QueueError> {
        let Some(claim_id) = claim_id else {
            return Err(self.explain_refusal(order_id, agent_id, None).await?);
        };
        let Some(ended) = self.ended_by_holder(order_id, agent_id, claim_id).await? else {
            return Err(self
                .explain_refusal(order_id, agent_id, Some(claim_id))
                .await?);
        };
        let asked = if completion.success {
            "success"
        } else {
            "failure"
        };
        let (same, before) = match &ended {
            EndedClaim::RetryScheduled(_) => (
                !completion.success && completion.retryable,
                "a retryable failure (retry scheduled)".to_string(),
            ),
            EndedClaim::Finished(entry) => (
                match entry.outcome {
                    Outcome::Succeeded => completion.success,
                    // A failure that ran out of retries was retryable when reported: a repeat
                    // of it, retryable or not, is the same report.
                    Outcome::Failed => !completion.success,
                    Outcome::Cancelled => false,
                },
                entry.outcome.as_str().to_string(),
            ),
        };
        if !same {
            return Err(QueueError::conflict(
                ConflictCode::AlreadyCompleted,
                format!(
                    "agent {agent_id} already completed its claim on work order {order_id} as {before}; a {asked} cannot replace it"
                ),
            ));
        }
        tracing::info!(work_order = %order_id, agent = %agent_id, "repeated complete answered again");
        Ok(match ended {
            EndedClaim::RetryScheduled(next_retry_after) => {
                CompletionResult::RetryScheduled { next_retry_after }
            }
            EndedClaim::Finished(entry) => CompletionResult::Finished(entry),
        })
    }

    /// How this agent's own complete ended its claim `claim_id` on the order, if it did.
    async fn ended_by_holder(
        &self,
        order_id: Uuid,
        agent_id: Uuid,
        claim_id: Uuid,
    ) -> Result<Option<EndedClaim>, QueueError> {
        // Active again after a retry: the claim is the order's last, no claim is live, it was not
        // released (no reclaimed or released attempt), and the retry time is set (a claim
        // clears it).
        let retry: Option<(DateTime<Utc>,)> = sqlx::query_as(sql::RETRY_SCHEDULED_BY_HOLDER)
            .bind(order_id)
            .bind(agent_id)
            .bind(claim_id)
            .fetch_optional(&self.pool)
            .await?;
        if let Some((next_retry_after,)) = retry {
            return Ok(Some(EndedClaim::RetryScheduled(next_retry_after)));
        }
        let entry: Option<LogRow> = sqlx::query_as(sql::COMPLETED_BY_HOLDER)
            .bind(order_id)
            .bind(agent_id)
            .bind(claim_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(entry.map(|e| EndedClaim::Finished(Box::new(e.into()))))
    }

    /// Says why a heartbeat or complete was refused (docs/design.md §5): `cancelled` when the order was
    /// cancelled under this agent's claim, `reclaimed` when this agent's claim was released (reaper,
    /// expired lease, retirement) or superseded, `not_claim_holder` otherwise; `404` unknown order.
    pub(super) async fn explain_refusal(
        &self,
        order_id: Uuid,
        agent_id: Uuid,
        claim_id: Option<Uuid>,
    ) -> Result<QueueError, QueueError> {
        let active: Option<(Option<Uuid>, bool)> = sqlx::query_as(sql::REFUSAL_ACTIVE)
            .bind(order_id)
            .bind(agent_id)
            .bind(claim_id)
            .fetch_optional(&self.pool)
            .await?;
        if let Some((holder, released)) = active {
            let (code, why) = if holder == Some(agent_id) {
                (
                    ConflictCode::Reclaimed,
                    "its lease or claim timeout ran out, or the claim named was superseded",
                )
            } else if released {
                (
                    ConflictCode::Reclaimed,
                    "its claim was released by the reaper or by retirement",
                )
            } else {
                (
                    ConflictCode::NotClaimHolder,
                    "another agent holds it or it is not claimed",
                )
            };
            return Ok(QueueError::conflict(
                code,
                format!("agent {agent_id} does not hold work order {order_id}: {why}"),
            ));
        }
        let finished: Option<(String, Option<Uuid>, Option<Uuid>)> =
            sqlx::query_as(sql::REFUSAL_FINISHED)
                .bind(order_id)
                .fetch_optional(&self.pool)
                .await?;
        let mine = |holder: Option<Uuid>, held_claim: Option<Uuid>| {
            holder == Some(agent_id) && claim_id.is_none_or(|c| held_claim == Some(c))
        };
        let Some((ended_by, claimed_by, last_claim)) = finished else {
            return Ok(QueueError::NotFound {
                what: "work order",
                id: order_id.to_string(),
            });
        };
        let (code, why) = match ended_by.as_str() {
            "cancel" if mine(claimed_by, last_claim) => (
                ConflictCode::Cancelled,
                format!("work order {order_id} was cancelled"),
            ),
            "reaper" if mine(claimed_by, last_claim) => (
                ConflictCode::Reclaimed,
                format!(
                    "work order {order_id} was reclaimed and then failed: no agent finished it"
                ),
            ),
            _ => (
                ConflictCode::NotClaimHolder,
                format!(
                    "work order {order_id} already finished; agent {agent_id} holds no claim on it"
                ),
            ),
        };
        Ok(QueueError::conflict(code, why))
    }
}
