//! The holder's side of a claim (docs/design.md §2, §5): heartbeat and complete. Fencing: both act
//! only on the live claim of the asking agent (and of the given `claim_id`), and only while its
//! lease and deadline hold; anything else is a `409` that changes nothing.
//!
//! Complete has two shapes, both here:
//! * success is one statement (`sql/complete_success.sql`, issue #7; its twin is
//!   `sql/claim_next.sql`). As transactions of four to six statements, the two calls every order
//!   goes through held the pull API to a third of the bare-SQL ceiling on two cores (round trips,
//!   context switches, protocol). One statement is one round trip and one commit, and takes the
//!   same row locks in the same order (agent → order → claim, see `queue`): each CTE that must
//!   lock later reads the earlier one through a sub-query, so the earlier one has run first.
//! * failure is a transaction: whether to retry is decided in Rust (`rules::decide_failure`;
//!   for a disrupted attempt `rules::decide_disruption`, docs/design.md §12) between locking the
//!   order and writing it.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgArguments;
use sqlx::query::QueryAs;
use uuid::Uuid;

use super::Heartbeat;
use crate::queue::model::ClaimWaiting;
use crate::queue::orders::{EndedBy, FinalClaim, finish};
use crate::queue::rules::{self, DisruptionDecision, FailureDecision};
use crate::queue::sql;
use crate::queue::validate::validate_completion;
use crate::queue::{
    Completion, CompletionResult, LogEntry, Outcome, Queue, QueueError, RetryOnDisruption,
    group_commit, text,
};

impl Queue {
    /// Extends the lease of the agent's live claim (docs/design.md §2, §5). A lease never extends past
    /// `claimed_at + claim_timeout_seconds`. `waiting` is what holds the order up now, as the
    /// agent says (§12; `None`: nothing), kept with the claim. `409` (`cancelled`, `reclaimed`,
    /// `not_claim_holder`) when the agent does not hold a live claim; `404` unknown order.
    pub async fn heartbeat(
        &self,
        order_id: Uuid,
        agent_id: Uuid,
        claim_id: Option<Uuid>,
        waiting: Option<&ClaimWaiting>,
    ) -> Result<Heartbeat, QueueError> {
        // One transaction, so one WAL flush; the agent row first, as everywhere (lock order).
        let mut tx = self.pool.begin().await?;
        touch_agent(&mut *tx, agent_id).await?;
        let row: Option<(Option<DateTime<Utc>>, DateTime<Utc>)> = sqlx::query_as(sql::HEARTBEAT)
            .bind(order_id)
            .bind(agent_id)
            .bind(claim_id)
            .bind(waiting.map(sqlx::types::Json))
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

    /// Reports the result of the agent's live claim (docs/design.md §2, §5): success or a
    /// non-retryable / out-of-retries failure moves the order to the log; a retryable failure with
    /// retries left schedules `RETRY_PENDING` with exponential backoff. One transaction; a result
    /// from anyone but the live claim holder is `409` and changes nothing (a repeat of the result
    /// that finished the order is answered as it was, `replay_or_refuse`). A failure with
    /// `disrupted` follows the order's `retry_on_disruption` instead of its retries (§12);
    /// `disrupted` with `success` is `400 invalid_field` and changes nothing.
    pub async fn complete(
        &self,
        order_id: Uuid,
        agent_id: Uuid,
        claim_id: Option<Uuid>,
        completion: &Completion,
    ) -> Result<CompletionResult, QueueError> {
        validate_completion(completion)?;
        // Stored as text::storable makes it: no U+0000, cut with a marker past the limit.
        let message = completion
            .message
            .as_deref()
            .map(|m| text::storable(m, text::MAX_MESSAGE_BYTES));
        let message = message.as_deref();
        let done = if completion.success {
            self.commit_success(order_id, agent_id, claim_id, message)
                .await?
                .map(|entry| CompletionResult::Finished(Box::new(entry)))
        } else {
            let failure = Failure {
                order_id,
                agent_id,
                claim_id,
                message,
                retryable: completion.retryable,
                disrupted: completion.disrupted,
            };
            self.complete_failure(&failure).await?
        };
        match done {
            Some(result) => Ok(result),
            None => {
                self.replay_or_refuse(order_id, agent_id, claim_id, completion)
                    .await
            }
        }
    }

    /// A reported failure, in one transaction: lock the order, end the live claim, decide in
    /// Rust whether to retry (`rules::decide_failure`, or for a disrupted attempt
    /// `rules::decide_disruption`), then schedule the retry or finish the order. `None` when the
    /// agent holds no live claim on the order (nothing is written).
    async fn complete_failure(
        &self,
        failure: &Failure<'_>,
    ) -> Result<Option<CompletionResult>, QueueError> {
        let Failure {
            order_id,
            agent_id,
            claim_id,
            message,
            retryable,
            disrupted,
        } = *failure;
        let mut tx = self.pool.begin().await?;
        // First, keeping the lock order agent → order → claim; and in this transaction, because
        // a separate statement would cost a second WAL flush per completion.
        touch_agent(&mut *tx, agent_id).await?;
        let order: Option<FailingOrder> = sqlx::query_as(sql::LOCK_ORDER_FOR_FAILURE)
            .bind(order_id)
            .fetch_optional(&mut *tx)
            .await?;
        let claim: Option<(Uuid, DateTime<Utc>)> = match order {
            None => None,
            Some(_) => {
                sqlx::query_as(sql::END_LIVE_CLAIM)
                    .bind(order_id)
                    .bind(agent_id)
                    .bind(claim_id)
                    .fetch_optional(&mut *tx)
                    .await?
            }
        };
        let (Some(order), Some((claim_id, claimed_at))) = (order, claim) else {
            tx.commit().await?;
            return Ok(None);
        };
        let ended = EndedAttempt {
            order_id,
            order,
            claim: FinalClaim {
                agent_id,
                claim_id,
                claimed_at,
            },
            message,
        };
        let result = if disrupted {
            ended.disrupted(&mut tx, retryable).await?
        } else {
            ended.failed(&mut tx, retryable).await?
        };
        tx.commit().await?;
        if matches!(result, CompletionResult::RetryScheduled { .. }) {
            // Maintenance may be asleep past the retry's time: it looks again (docs/design.md §7).
            self.retry_scheduled.notify_one();
        }
        Ok(Some(result))
    }
}

/// A failure reported by `agent_id` for its claim (`claim_id`, when given) on `order_id`, with
/// its stored `message` and whether the agent thinks a retry may help; `disrupted`: the attempt
/// was ended by a disruption, and then `retryable` says the disrupted run is known to have
/// stopped (docs/design.md §12).
#[derive(Clone, Copy)]
struct Failure<'a> {
    order_id: Uuid,
    agent_id: Uuid,
    claim_id: Option<Uuid>,
    message: Option<&'a str>,
    retryable: bool,
    disrupted: bool,
}

/// What a failed complete reads of the order it locked (`sql/lock_order_for_failure.sql`).
#[derive(sqlx::FromRow)]
struct FailingOrder {
    retry_count: i32,
    max_retries: i32,
    backoff_seconds: i32,
    retry_on_disruption: String,
    reclaim_count: i32,
    max_reclaims: i32,
}

/// A failed attempt whose claim `complete_failure` has ended: the order as it was locked, the
/// claim and the agent's stored message, which either end of it records.
struct EndedAttempt<'a> {
    order_id: Uuid,
    order: FailingOrder,
    claim: FinalClaim,
    message: Option<&'a str>,
}

/// The error recorded for a disrupted attempt reported without a message.
const DISRUPTED_WITHOUT_MESSAGE: &str = "the agent reported a disruption without a message";

impl<'a> EndedAttempt<'a> {
    /// The order runs again (the `202`): `query`, `sql/schedule_retry.sql` or
    /// `sql/requeue_disrupted.sql` with its leading parameters bound, takes `error` and the ended
    /// claim as its last four, keeps the claim as an attempt without finishing the order, and
    /// answers when the order may be claimed again.
    async fn run_again(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        query: QueryAs<'a, sqlx::Postgres, (DateTime<Utc>,), PgArguments>,
        error: &'a str,
    ) -> Result<CompletionResult, QueueError> {
        let (next_retry_after,) = query
            .bind(error)
            .bind(self.claim.claim_id)
            .bind(self.claim.agent_id)
            .bind(self.claim.claimed_at)
            .fetch_one(&mut **tx)
            .await?;
        Ok(CompletionResult::RetryScheduled { next_retry_after })
    }

    /// The end of an attempt that failed (docs/design.md §2), in the caller's transaction: a
    /// retry (`sql/schedule_retry.sql`, the `202`) or the log as failed.
    async fn failed(
        self,
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        retryable: bool,
    ) -> Result<CompletionResult, QueueError> {
        let error = self
            .message
            .unwrap_or("the agent reported failure without a message");
        let decision = rules::decide_failure(
            self.order.retry_count,
            self.order.max_retries,
            self.order.backoff_seconds,
            retryable,
        );
        Ok(match decision {
            FailureDecision::Retry {
                retry_count,
                delay_seconds,
            } => {
                // $1 order, $2 retry count, $3 delay; the rest as `run_again` binds them.
                let query = sqlx::query_as(sql::SCHEDULE_RETRY)
                    .bind(self.order_id)
                    .bind(retry_count)
                    .bind(delay_seconds as f64);
                self.run_again(tx, query, error).await?
            }
            FailureDecision::Fail => CompletionResult::Finished(Box::new(
                finish(
                    tx,
                    self.order_id,
                    EndedBy::Agent,
                    Outcome::Failed,
                    self.message,
                    Some(error),
                    Some(self.claim),
                )
                .await?,
            )),
        })
    }

    /// The end of an attempt ended by a disruption (docs/design.md §12), in the caller's
    /// transaction: the order runs again at once (`sql/requeue_disrupted.sql`, the `202`) or goes
    /// to the log as failed with `ended_by = disruption`, the message saying why it was not run
    /// again when its policy is `safe`.
    async fn disrupted(
        self,
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        stopped: bool,
    ) -> Result<CompletionResult, QueueError> {
        let order = &self.order;
        // The column's CHECK allows only the two spellings.
        let policy = RetryOnDisruption::parse(&order.retry_on_disruption).unwrap_or_default();
        let error = self.message.unwrap_or(DISRUPTED_WITHOUT_MESSAGE);
        match rules::decide_disruption(policy, stopped, order.reclaim_count, order.max_reclaims) {
            DisruptionDecision::RunAgain => {
                // $1 order; the rest as `run_again` binds them.
                let query = sqlx::query_as(sql::REQUEUE_DISRUPTED).bind(self.order_id);
                self.run_again(tx, query, error).await
            }
            DisruptionDecision::Fail { why_not } => {
                let why_not = why_not.unwrap_or_default();
                // The reason stays whole: the agent's message gives up the room it needs.
                let limit = text::MAX_MESSAGE_BYTES - why_not.len();
                let error = format!("{}{why_not}", text::storable(error, limit));
                let entry = finish(
                    tx,
                    self.order_id,
                    EndedBy::Disruption,
                    Outcome::Failed,
                    Some(&error),
                    Some(&error),
                    Some(self.claim),
                )
                .await?;
                Ok(CompletionResult::Finished(Box::new(entry)))
            }
        }
    }
}

impl Queue {
    /// A successful complete in one statement (`sql/complete_success.sql`), or in the next group
    /// commit when it is on (`queue::group_commit`). `None` when the agent holds no live claim
    /// on the order (the caller explains the 409).
    pub(super) async fn commit_success(
        &self,
        order_id: Uuid,
        agent_id: Uuid,
        claim_id: Option<Uuid>,
        message: Option<&str>,
    ) -> Result<Option<LogEntry>, QueueError> {
        match &self.group_commit {
            Some(group) => {
                group
                    .complete(&self.pool, order_id, agent_id, claim_id, message)
                    .await
            }
            None => group_commit::single(&self.pool, order_id, agent_id, claim_id, message).await,
        }
    }
}

/// Records contact with the agent when it is due (`sql/record_contact.sql`).
async fn touch_agent(exec: impl sqlx::PgExecutor<'_>, agent_id: Uuid) -> Result<(), QueueError> {
    sqlx::query(sql::RECORD_CONTACT)
        .bind(agent_id)
        .execute(exec)
        .await?;
    Ok(())
}
