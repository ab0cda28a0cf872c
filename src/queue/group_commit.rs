//! Group commit of successful completes (issue #34): completes that arrive together, from any
//! agents, share one statement and one commit (`sql/complete_success_many.sql`) instead of one
//! each.
//!
//! What each request sees does not change: a complete is answered only after the commit that
//! ended its claim; fencing is the statement's (the live claim of that agent, and of that
//! `claim_id` when given); a complete the batch did not apply (not the live holder, or a repeat)
//! goes on exactly as a single one does, to `replay_or_refuse`; every order is moved to the log
//! once, by whichever statement deleted its claim row.
//!
//! How batches form: [`RUNNERS`] tasks take completes from one queue. A runner takes the first
//! waiting complete, yields once to the scheduler (so that completes sent at the same moment are
//! in too), then takes every other waiting (up to `max_batch`), runs them, answers them and comes
//! back. Nothing waits to fill a batch: a lone complete runs at once, alone (one scheduler turn
//! later); under load, completes arriving while the runners are busy form the next batches. A
//! batch that fails as a whole (a deadlock with another writer) is retried one complete at a
//! time, so one bad complete cannot fail the others; a batch that found the database unavailable
//! is answered `503` at once, every complete of it (docs/design.md §5: a complete whose commit
//! outcome is unknown is answered `503`, and its repeat is answered as a replay if it was
//! committed). Retried one by one, each would wait out the pool's acquire timeout after the
//! other: 10 s each behind an outage, so a batch of 8 took more than a minute and its agents'
//! requests timed out.

use std::collections::HashMap;

use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::{LogEntry, LogRow, QueueError, sql};

/// Tasks running batches at once: while one waits for its commit, the other gathers the next
/// batch, and a batch held up by a row lock does not hold up every complete. Fewer runners make
/// bigger batches: with 4, 16 agents completing at once were committed mostly one by one (44% of
/// completes alone, the rest in batches of 3.8 on average, `pg_stat_statements`), and
/// `bench/queue.rs` (2d), one agent of 16 slots, read 1,758–1,894 orders/s with 4 runners,
/// 1,857–2,167 with 2 and 1,771–2,300 with 1, three runs each alternated in one sitting
/// (bench/README.md, issue #34). With the batching of 2026-12-07 (the yields here and in the pull
/// loop), one runner read about 10 % more in (2d) and the same in (2), and was not taken: behind
/// an outage its one batch waits out the pool's acquire timeout (10 s) while the next batch
/// waits behind it, so the completes that arrive meanwhile would be answered after up to 20 s.
pub const RUNNERS: usize = 2;

/// The answer to one complete: its log entry, or `None` when the agent did not hold the live
/// claim (the caller explains the `409` or replays an earlier answer).
type Answer = Result<Option<LogEntry>, QueueError>;

/// One successful complete waiting for its batch.
struct Complete {
    order_id: Uuid,
    agent_id: Uuid,
    claim_id: Option<Uuid>,
    message: Option<String>,
    reply: oneshot::Sender<Answer>,
}

/// The queue of completes and its runners; the runners stop when the last [`GroupCommit`] clone
/// is dropped.
#[derive(Clone)]
pub(crate) struct GroupCommit {
    sender: mpsc::UnboundedSender<Complete>,
}

impl GroupCommit {
    /// Starts [`RUNNERS`] runners on `pool` (on the current tokio runtime), each running at most
    /// `max_batch` completes per statement (at least 1; `Queue::with_group_commit` starts none
    /// for 1).
    pub(crate) fn start(pool: PgPool, max_batch: usize) -> Self {
        let run = move |batch| {
            let pool = pool.clone();
            async move { run_batch(&pool, batch).await }
        };
        GroupCommit {
            sender: crate::gather::spawn_runners(RUNNERS, max_batch.max(1), run),
        }
    }

    /// Completes `order_id` as succeeded for `agent_id` in the next batch and returns once that
    /// batch committed (see the module docs for what the answer means).
    pub(crate) async fn complete(
        &self,
        pool: &PgPool,
        order_id: Uuid,
        agent_id: Uuid,
        claim_id: Option<Uuid>,
        message: Option<&str>,
    ) -> Answer {
        let (reply, answer) = oneshot::channel();
        let complete = Complete {
            order_id,
            agent_id,
            claim_id,
            message: message.map(str::to_string),
            reply,
        };
        if let Err(mpsc::error::SendError(complete)) = self.sender.send(complete) {
            // The runners are gone (the runtime is stopping): complete it here.
            return one(pool, &complete).await;
        }
        match answer.await {
            Ok(answer) => answer,
            // A runner dropped it without an answer (its task was cancelled mid-batch): whether
            // that batch committed is unknown, so ask again alone; the statement is fenced and a
            // repeat is answered as a replay.
            Err(_) => single(pool, order_id, agent_id, claim_id, message).await,
        }
    }
}

/// Runs one batch and answers each of its completes.
async fn run_batch(pool: &PgPool, batch: Vec<Complete>) {
    // An order twice in one batch (an agent repeating a complete it has not been answered yet):
    // the repeat runs after the batch, alone, and is answered as a replay.
    let mut seen = std::collections::HashSet::new();
    let (batch, repeats): (Vec<Complete>, Vec<Complete>) =
        batch.into_iter().partition(|c| seen.insert(c.order_id));
    let alone = if batch.len() == 1 {
        batch
    } else {
        match many(pool, &batch).await {
            Ok(mut entries) => {
                for c in batch {
                    let entry = entries.remove(&c.order_id);
                    // The request may be gone (its client disconnected): its order is
                    // completed all the same.
                    let _ = c.reply.send(Ok(entry));
                }
                Vec::new()
            }
            Err(QueueError::Unavailable(error)) => {
                tracing::warn!(%error, completes = batch.len(), "a group commit found the database unavailable; answering each complete 503");
                let why = error.to_string();
                for c in batch {
                    let _ = c.reply.send(Err(unavailable("group commit", &why)));
                }
                Vec::new()
            }
            Err(error) => {
                tracing::warn!(%error, completes = batch.len(), "a group commit failed; completing its orders one by one");
                batch
            }
        }
    };
    for c in alone.into_iter().chain(repeats) {
        let answer = one(pool, &c).await;
        let _ = c.reply.send(answer);
    }
}

/// Several completes in one statement (`sql/complete_success_many.sql`): the log entries of the
/// orders completed, by order id.
async fn many(pool: &PgPool, batch: &[Complete]) -> Result<HashMap<Uuid, LogEntry>, QueueError> {
    let orders: Vec<Uuid> = batch.iter().map(|c| c.order_id).collect();
    let agents: Vec<Uuid> = batch.iter().map(|c| c.agent_id).collect();
    let claims: Vec<Option<Uuid>> = batch.iter().map(|c| c.claim_id).collect();
    let messages: Vec<Option<&str>> = batch.iter().map(|c| c.message.as_deref()).collect();
    let rows: Vec<LogRow> = sqlx::query_as(sql::COMPLETE_SUCCESS_MANY)
        .bind(orders)
        .bind(agents)
        .bind(claims)
        .bind(messages)
        .fetch_all(pool)
        .await?;
    Ok(rows
        .into_iter()
        .map(|row| {
            let entry: LogEntry = row.into();
            (entry.id, entry)
        })
        .collect())
}

/// The `503` of one request of a batch (a group commit, a group claim) that found the database
/// unavailable: `batch` names the batch, `why` is its error (`sqlx::Error` is not `Clone`).
pub(super) fn unavailable(batch: &str, why: &str) -> QueueError {
    QueueError::Unavailable(sqlx::Error::Io(std::io::Error::other(format!(
        "the {batch} this request was in: {why}"
    ))))
}

async fn one(pool: &PgPool, c: &Complete) -> Answer {
    single(
        pool,
        c.order_id,
        c.agent_id,
        c.claim_id,
        c.message.as_deref(),
    )
    .await
}

/// One complete in one statement (`sql/complete_success.sql`).
pub(super) async fn single(
    pool: &PgPool,
    order_id: Uuid,
    agent_id: Uuid,
    claim_id: Option<Uuid>,
    message: Option<&str>,
) -> Answer {
    let row: Option<LogRow> = sqlx::query_as(sql::COMPLETE_SUCCESS)
        .bind(order_id)
        .bind(agent_id)
        .bind(claim_id)
        .bind(message)
        .fetch_optional(pool)
        .await?;
    Ok(row.map(Into::into))
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use std::collections::HashSet;

    use super::super::{ClaimRequest, Completion, CompletionResult, Queue, QueueError};
    use crate::testing::fresh_pool;

    fn success() -> Completion {
        Completion {
            success: true,
            message: Some("done".into()),
            retryable: true,
            disrupted: false,
        }
    }

    /// 24 completes sent at once by 8 agents share statements and commits (orders finished by
    /// one statement share its `completed_at`, the transaction's `now()`); within the batches a
    /// complete with another claim's id is refused with 409 and changes nothing, a repeat gets
    /// the same log entry, and every order is logged once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn completes_sent_together_share_commits_and_keep_their_own_answers() {
        let pool = fresh_pool(20).await;
        let queue = Queue::new(pool.clone()).with_group_commit(64);
        sqlx::query(
            "INSERT INTO work_orders (id, work_type, yaml_content, max_retries, backoff_seconds, \
             claim_timeout_seconds, max_reclaims, target_labels, status) \
             SELECT gen_random_uuid(), 'custom', 'x', 3, 60, 3600, 5, ARRAY['gc'], 'PENDING' \
             FROM generate_series(1, 24)",
        )
        .execute(&pool)
        .await
        .unwrap();
        let mut claims = Vec::new();
        for i in 0..8 {
            let agent = uuid::Uuid::new_v4();
            sqlx::query("INSERT INTO agents (id, name, labels) VALUES ($1, $2, ARRAY['gc'])")
                .bind(agent)
                .bind(format!("gc-{i}"))
                .execute(&pool)
                .await
                .unwrap();
            let req = ClaimRequest {
                agent_id: agent,
                lease_seconds: None,
            };
            for order in queue.claim_next_many(&req, &[], 3).await.unwrap() {
                claims.push((order.id, agent, order.claim_id.unwrap()));
            }
        }
        assert_eq!(claims.len(), 24);
        let (stale_order, stale_agent, _) = claims[0];
        let mut sends = Vec::new();
        for &(order, agent, claim) in &claims {
            let q = queue.clone();
            sends.push(tokio::spawn(async move {
                q.complete(order, agent, Some(claim), &success()).await
            }));
        }
        // Another claim's id for an order of the batch: fenced out, whichever commits first.
        let q = queue.clone();
        let stale = tokio::spawn(async move {
            q.complete(
                stale_order,
                stale_agent,
                Some(uuid::Uuid::new_v4()),
                &success(),
            )
            .await
        });
        let mut ids = HashSet::new();
        for send in sends {
            match send.await.unwrap().unwrap() {
                CompletionResult::Finished(entry) => assert!(ids.insert(entry.id)),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(ids.len(), 24);
        match stale.await.unwrap() {
            Err(QueueError::Conflict { .. }) => {}
            other => panic!("a complete with another claim id was not refused: {other:?}"),
        }
        // The holder's repeat is answered with the same entry.
        let (order, agent, claim) = claims[5];
        match queue.complete(order, agent, Some(claim), &success()).await {
            Ok(CompletionResult::Finished(entry)) => assert_eq!(entry.id, order),
            other => panic!("{other:?}"),
        }
        let (logged, commits): (i64, i64) = sqlx::query_as(
            "SELECT count(*), count(DISTINCT completed_at) FROM work_order_log \
             WHERE outcome = 'succeeded'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(logged, 24, "every order logged once");
        assert!(
            commits < 24,
            "24 completes sent together took 24 commits: nothing was batched"
        );
    }
}
