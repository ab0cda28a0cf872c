//! The holder's side of a claim (DESIGN.md §2, §5): heartbeat and complete. Fencing: both act
//! only on the live claim of the asking agent (and of the given `claim_id`), and only while its
//! lease and deadline hold; anything else is a `409` that changes nothing.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{CONTACT_DUE, Heartbeat};
use crate::queue::orders::{EndedBy, FinalClaim, finish};
use crate::queue::rules::{self, FailureDecision};
use crate::queue::{Completion, CompletionResult, Outcome, Queue, QueueError, text};

impl Queue {
    /// Extends the lease of the agent's live claim (DESIGN.md §2, §5). A lease never extends past
    /// `claimed_at + claim_timeout_seconds`. `409` (`cancelled`, `reclaimed`,
    /// `not_claim_holder`) when the agent does not hold a live claim; `404` unknown order.
    pub async fn heartbeat(
        &self,
        order_id: Uuid,
        agent_id: Uuid,
        claim_id: Option<Uuid>,
    ) -> Result<Heartbeat, QueueError> {
        // One transaction, so one WAL flush; the agent row first, as everywhere (lock order).
        let mut tx = self.pool.begin().await?;
        touch_agent(&mut *tx, agent_id).await?;
        let row: Option<(Option<DateTime<Utc>>, DateTime<Utc>)> = sqlx::query_as(
            "UPDATE work_order_claims SET lease_expires_at = CASE WHEN lease_seconds IS NULL \
               THEN NULL ELSE LEAST(now() + make_interval(secs => lease_seconds), deadline) END \
             WHERE work_order_id = $1 AND agent_id = $2 AND ($3::uuid IS NULL OR claim_id = $3) \
               AND deadline > now() AND (lease_expires_at IS NULL OR lease_expires_at > now()) \
             RETURNING lease_expires_at, deadline",
        )
        .bind(order_id)
        .bind(agent_id)
        .bind(claim_id)
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        match row {
            Some((lease_expires_at, claim_expires_at)) => Ok(Heartbeat {
                lease_expires_at,
                claim_expires_at,
            }),
            None => Err(self.explain_refusal(order_id, agent_id, claim_id).await?),
        }
    }

    /// Reports the result of the agent's live claim (DESIGN.md §2, §5): success or a
    /// non-retryable / out-of-retries failure moves the order to the log; a retryable failure with
    /// retries left schedules `RETRY_PENDING` with exponential backoff. One transaction; a result
    /// from anyone but the live claim holder is `409` and changes nothing.
    pub async fn complete(
        &self,
        order_id: Uuid,
        agent_id: Uuid,
        claim_id: Option<Uuid>,
        completion: &Completion,
    ) -> Result<CompletionResult, QueueError> {
        // Stored as text::storable makes it: no U+0000, cut with a marker past the limit.
        let message = completion
            .message
            .as_deref()
            .map(|m| text::storable(m, text::MAX_MESSAGE_BYTES));
        let message = message.as_deref();
        if completion.success {
            return match self
                .complete_success_one_trip(order_id, agent_id, claim_id, message)
                .await?
            {
                Some(entry) => Ok(CompletionResult::Finished(Box::new(entry))),
                None => {
                    self.replay_or_refuse(order_id, agent_id, claim_id, completion)
                        .await
                }
            };
        }
        // A failure: the retry decision is made here (rules::decide_failure), so a transaction.
        let mut tx = self.pool.begin().await?;
        // First, keeping the lock order agent → order → claim; and in this transaction, because
        // a separate statement would cost a second WAL flush per completion.
        touch_agent(&mut *tx, agent_id).await?;
        let order: Option<(i32, i32, i32)> = sqlx::query_as(
            "SELECT retry_count, max_retries, backoff_seconds FROM work_orders \
             WHERE id = $1 FOR UPDATE",
        )
        .bind(order_id)
        .fetch_optional(&mut *tx)
        .await?;
        let claim: Option<(Uuid, DateTime<Utc>)> = match order {
            None => None,
            Some(_) => {
                sqlx::query_as(
                    "DELETE FROM work_order_claims WHERE work_order_id = $1 AND agent_id = $2 \
                   AND ($3::uuid IS NULL OR claim_id = $3) AND deadline > now() \
                   AND (lease_expires_at IS NULL OR lease_expires_at > now()) \
                 RETURNING claim_id, claimed_at",
                )
                .bind(order_id)
                .bind(agent_id)
                .bind(claim_id)
                .fetch_optional(&mut *tx)
                .await?
            }
        };
        let (Some((retry_count, max_retries, backoff_seconds)), Some((claim_id, claimed_at))) =
            (order, claim)
        else {
            tx.commit().await?;
            return self
                .replay_or_refuse(order_id, agent_id, claim_id, completion)
                .await;
        };
        let final_claim = FinalClaim {
            agent_id,
            claim_id,
            claimed_at,
        };
        let error = message.unwrap_or("the agent reported failure without a message");
        let result = match rules::decide_failure(
            retry_count,
            max_retries,
            backoff_seconds,
            completion.retryable,
        ) {
            FailureDecision::Retry {
                retry_count,
                delay_seconds,
            } => {
                // The claim ends here without finishing the order: it is kept as an attempt.
                let (next_retry_after,): (DateTime<Utc>,) = sqlx::query_as(
                    "WITH attempt AS (INSERT INTO work_order_attempts \
                       (claim_id, work_order_id, agent_id, started_at, ended, message) \
                       VALUES ($5, $1, $6, $7, 'retry_scheduled', $4)) \
                     UPDATE work_orders SET status = 'RETRY_PENDING', retry_count = $2, \
                     next_retry_after = now() + make_interval(secs => $3), last_error = $4, \
                     last_error_at = now(), updated_at = now() WHERE id = $1 \
                     RETURNING next_retry_after",
                )
                .bind(order_id)
                .bind(retry_count)
                .bind(delay_seconds as f64)
                .bind(error)
                .bind(final_claim.claim_id)
                .bind(agent_id)
                .bind(final_claim.claimed_at)
                .fetch_one(&mut *tx)
                .await?;
                CompletionResult::RetryScheduled { next_retry_after }
            }
            FailureDecision::Fail => CompletionResult::Finished(Box::new(
                finish(
                    &mut tx,
                    order_id,
                    EndedBy::Agent,
                    Outcome::Failed,
                    message,
                    Some(error),
                    Some(final_claim),
                )
                .await?,
            )),
        };
        tx.commit().await?;
        Ok(result)
    }
}

/// Records contact with the agent (`last_seen_at`, DESIGN.md §5 agent health) when it is due
/// ([`CONTACT_DUE`]). When it is, the agent row is locked first, as the lock order says; when it
/// is not, the caller takes no agent lock at all.
async fn touch_agent(exec: impl sqlx::PgExecutor<'_>, agent_id: Uuid) -> Result<(), QueueError> {
    sqlx::query(&format!(
        "UPDATE agents SET last_seen_at = now() WHERE id = $1 AND {CONTACT_DUE}"
    ))
    .bind(agent_id)
    .execute(exec)
    .await?;
    Ok(())
}
