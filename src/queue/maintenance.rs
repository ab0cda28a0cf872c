//! Queue maintenance (docs/design.md §2): the reaper of stale and expired claims, and the promotion of
//! due `RETRY_PENDING` orders. Each pass takes rows with `FOR UPDATE SKIP LOCKED`, so several
//! `pullman serve` replicas can run it at once without double counting or waiting on each other
//! (the release of a retired agent's left-over claims waits at most a second for an order row:
//! `Queue::release_claims_of_retired_agents`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::orders::{EndedBy, FinalClaim, finish};
use super::{AgentHealth, IDEMPOTENCY_KEY_RETENTION, Outcome, Queue, QueueError, sql};

/// How long a follower's row (`output_followers`, docs/design.md §9) is kept: one a killed server
/// left behind costs a NOTIFY when its order finishes, until then.
const FOLLOWER_ROW_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Rows handled per statement; a larger backlog is worked through in several batches.
const BATCH: i64 = 1000;

/// Stored output deleted per retention batch, bytes (docs/design.md §9): the entries of one batch
/// stop at the one that reaches it.
const LOG_BATCH_BYTES: i64 = 64 << 20;

/// Live agents by health (retired agents are not counted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AgentHealthCounts {
    /// Registered, never contacted the server.
    pub never_seen: i64,
    /// Contacted the server recently.
    pub active: i64,
    /// No contact for 3 × its lease or 5 minutes.
    pub stale: i64,
}

/// What one maintenance pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MaintenanceReport {
    /// Claims released back to `PENDING`.
    pub reclaimed: u64,
    /// Orders sent to the log because their reclaims ran out.
    pub reclaims_exhausted: u64,
    /// `RETRY_PENDING` orders made `PENDING`.
    pub promoted: u64,
    /// Log entries deleted past the log retention.
    pub log_entries_deleted: u64,
    /// Turns of tenants left without an order, dropped ([`Queue::drop_idle_turns`]).
    pub idle_turns_dropped: u64,
    /// Slot rows of concurrency keys without claims or waiting orders, dropped
    /// ([`Queue::drop_idle_slots`]).
    pub idle_slots_dropped: u64,
    /// Parked tenant turns whose tenants had orders to hand out, unparked
    /// ([`Queue::unpark_stranded_turns`]).
    pub turns_unparked: u64,
    /// Claims of retired agents returned to `PENDING`, left by a retirement cut short
    /// ([`Queue::release_claims_of_retired_agents`]).
    pub released_from_retired: u64,
}

/// How often [`run_maintenance`] drops idle tenant turns: the table lock holds claims off for a
/// moment. Until then an idle turn is parked (docs/design.md §3), out of the claims' way.
const TURN_DROP_INTERVAL: Duration = Duration::from_secs(60);

/// Runs `batch`, a statement taking at most [`BATCH`] rows, until a batch comes back short;
/// returns the rows it affected in all.
async fn until_short<F, Fut>(mut batch: F) -> Result<u64, QueueError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<sqlx::postgres::PgQueryResult, sqlx::Error>>,
{
    let mut total = 0;
    loop {
        let n = batch().await?.rows_affected();
        total += n;
        if (n as i64) < BATCH {
            return Ok(total);
        }
    }
}

impl Queue {
    /// Releases claims older than `claim_timeout_seconds` or whose lease expired (docs/design.md §2):
    /// back to `PENDING` with `reclaim_count + 1` and `retry_count` unchanged, or to the log as
    /// failed once `reclaim_count` would exceed `max_reclaims`. Returns (reclaimed, exhausted).
    pub async fn reap_stale_claims(&self) -> Result<(u64, u64), QueueError> {
        let mut reclaimed = 0;
        let mut exhausted = 0;
        loop {
            let mut tx = self.pool.begin().await?;
            #[derive(sqlx::FromRow)]
            struct Stale {
                work_order_id: Uuid,
                agent_id: Uuid,
                claim_id: Uuid,
                claimed_at: DateTime<Utc>,
                reclaim_count: i32,
                max_reclaims: i32,
            }
            let stale: Vec<Stale> = sqlx::query_as(sql::FIND_EXPIRED_CLAIMS)
                .bind(BATCH)
                .fetch_all(&mut *tx)
                .await?;
            if stale.is_empty() {
                return Ok((reclaimed, exhausted));
            }
            let batch_len = stale.len() as i64;
            let (requeue, give_up): (Vec<Stale>, Vec<Stale>) = stale
                .into_iter()
                .partition(|s| s.reclaim_count < s.max_reclaims);
            let ids: Vec<Uuid> = requeue.iter().map(|s| s.work_order_id).collect();
            // Each released claim is remembered (a late heartbeat is told `reclaimed`) and kept as
            // an attempt saying which limit ran out.
            sqlx::query(sql::RELEASE_EXPIRED_CLAIMS)
                .bind(&ids)
                .execute(&mut *tx)
                .await?;
            sqlx::query(sql::REQUEUE_RECLAIMED)
                .bind(&ids)
                .execute(&mut *tx)
                .await?;
            reclaimed += ids.len() as u64;
            for s in give_up {
                let message = format!("no agent completed it within {} claims", s.max_reclaims + 1);
                finish(
                    &mut tx,
                    s.work_order_id,
                    EndedBy::Reaper,
                    Outcome::Failed,
                    Some(&message),
                    Some(&message),
                    Some(FinalClaim {
                        agent_id: s.agent_id,
                        claim_id: s.claim_id,
                        claimed_at: s.claimed_at,
                    }),
                )
                .await?;
                exhausted += 1;
            }
            tx.commit().await?;
            if batch_len < BATCH {
                return Ok((reclaimed, exhausted));
            }
        }
    }

    /// Makes due `RETRY_PENDING` orders `PENDING`, which wakes long-polling claimers through
    /// `NOTIFY`. (Claims accept due retries even before this runs; promotion is for the wake-up.)
    pub async fn promote_due_retries(&self) -> Result<u64, QueueError> {
        until_short(|| {
            sqlx::query(sql::PROMOTE_DUE_RETRIES)
                .bind(BATCH)
                .execute(&self.pool)
        })
        .await
    }

    /// Time until the earliest backing-off order is due (zero if one is already due), or `None`
    /// when nothing backs off. Lets the maintenance loop wake exactly when a retry falls due.
    pub async fn next_retry_due_in(&self) -> Result<Option<Duration>, QueueError> {
        let (secs,): (Option<f64>,) = sqlx::query_as(sql::NEXT_RETRY_DUE_IN)
            .fetch_one(&self.pool)
            .await?;
        Ok(secs.map(|s| Duration::from_secs_f64(s.max(0.0))))
    }

    /// Deletes history past its retention (docs/design.md §7): log entries of orders that finished
    /// more than `log_retention` ago, and `Idempotency-Key` records older than
    /// [`IDEMPOTENCY_KEY_RETENTION`]. In batches of [`BATCH`] rows, one commit each, oldest
    /// first, taken with `SKIP LOCKED`: several replicas can run it together, and a large backlog
    /// never becomes one long transaction. Returns the number of log entries deleted.
    pub async fn expire_history(&self, log_retention: Duration) -> Result<u64, QueueError> {
        let mut deleted = 0;
        // One cutoff for every batch: entries finishing meanwhile wait for the next pass, so the
        // loop ends. Batches are bounded by bytes too, so a short one is not the last one.
        let (cutoff,): (DateTime<Utc>,) = sqlx::query_as(sql::LOG_CUTOFF)
            .bind(log_retention.as_secs_f64())
            .fetch_one(&self.pool)
            .await?;
        loop {
            let n = self
                .expire_log_batch(cutoff, BATCH, LOG_BATCH_BYTES)
                .await?;
            if n == 0 {
                break;
            }
            deleted += n;
        }
        self.delete_in_batches(sql::EXPIRE_IDEMPOTENCY_KEYS, IDEMPOTENCY_KEY_RETENTION)
            .await?;
        self.delete_in_batches(sql::EXPIRE_FOLLOWERS, FOLLOWER_ROW_RETENTION)
            .await?;
        Ok(deleted)
    }

    /// Deletes one batch of log entries completed before `cutoff`, oldest first, with their
    /// attempts and output (docs/design.md §7, §9): at most `rows` entries, and no entry past
    /// the one whose stored output brings the batch to `bytes` (at least one entry, however
    /// large). Returns the entries deleted; 0 when none is due.
    pub async fn expire_log_batch(
        &self,
        cutoff: DateTime<Utc>,
        rows: i64,
        bytes: i64,
    ) -> Result<u64, QueueError> {
        Ok(sqlx::query(sql::EXPIRE_LOG)
            .bind(cutoff)
            .bind(rows)
            .bind(bytes)
            .execute(&self.pool)
            .await?
            .rows_affected())
    }

    /// Runs a `DELETE` taking `$1` (retention, seconds) and `$2` ([`BATCH`]) until a batch comes
    /// back short; returns the rows deleted.
    async fn delete_in_batches(
        &self,
        statement: &str,
        retention: Duration,
    ) -> Result<u64, QueueError> {
        until_short(|| {
            sqlx::query(statement)
                .bind(retention.as_secs_f64())
                .bind(BATCH)
                .execute(&self.pool)
        })
        .await
    }

    /// Age in seconds of the oldest claimable order, for the `pullman_queue_lag_seconds` gauge:
    /// a `PENDING` order counts from `created_at`, a due `RETRY_PENDING` one from
    /// `next_retry_after` (claimable once that passed, docs/design.md §3 rule 5). Zero when nothing is
    /// claimable. Both halves walk an index of claimable rows (`work_orders_claimable`,
    /// `work_orders_retry_due`) and stop at the first row.
    pub async fn oldest_claimable_age(&self) -> Result<f64, QueueError> {
        let (secs,): (Option<f64>,) = sqlx::query_as(sql::OLDEST_CLAIMABLE_AGE)
            .fetch_one(&self.pool)
            .await?;
        Ok(secs.unwrap_or(0.0).max(0.0))
    }

    /// Live (not retired) agents by derived health (`rules::agent_health`, docs/design.md §5), for the
    /// `pullman_agents{health}` gauge.
    pub async fn count_agents_by_health(&self) -> Result<AgentHealthCounts, QueueError> {
        /// `last_seen_at`, `lease_seconds`, and the database's `now()`.
        type ContactRow = (Option<DateTime<Utc>>, Option<i32>, DateTime<Utc>);
        let rows: Vec<ContactRow> = sqlx::query_as(sql::AGENT_CONTACTS)
            .fetch_all(&self.pool)
            .await?;
        let mut counts = AgentHealthCounts::default();
        for (last_seen_at, lease_seconds, now) in rows {
            match super::rules::agent_health(false, last_seen_at, lease_seconds, now) {
                AgentHealth::NeverSeen => counts.never_seen += 1,
                AgentHealth::Active => counts.active += 1,
                AgentHealth::Stale => counts.stale += 1,
                AgentHealth::Retired => {}
            }
        }
        Ok(counts)
    }

    /// One maintenance pass: release what retirements cut short left held, reap, promote, then
    /// unpark stranded tenant turns.
    pub async fn maintain(&self) -> Result<MaintenanceReport, QueueError> {
        // First, so a retired agent's claims go back uncounted rather than reaped as reclaims.
        let released_from_retired = self.release_claims_of_retired_agents().await?;
        let (reclaimed, reclaims_exhausted) = self.reap_stale_claims().await?;
        let promoted = self.promote_due_retries().await?;
        let turns_unparked = self.unpark_stranded_turns().await?;
        Ok(MaintenanceReport {
            reclaimed,
            reclaims_exhausted,
            promoted,
            turns_unparked,
            released_from_retired,
            ..MaintenanceReport::default()
        })
    }
}

/// Runs maintenance every `interval` (docs/design.md §7: 10 s by default), and when a retry falls
/// due, until `shutdown` fires: the pass promotes it, which wakes long-polls that may take it
/// (docs/design.md §2, §7). A retry scheduled by this process while it sleeps wakes it to look at the
/// earliest due time again, so a 1 s backoff is claimable after about 1 s, not at the next tick.
/// (Several replicas each run maintenance; the one that scheduled a retry promotes it on time.)
/// Each report goes to `on_report` (metrics); failures are logged and retried at the next tick.
/// With `log_retention`, history past it is deleted too ([`Queue::expire_history`]). Once a
/// minute ([`TURN_DROP_INTERVAL`]) it drops idle tenant turns ([`Queue::drop_idle_turns`]) and
/// idle concurrency-key slots ([`Queue::drop_idle_slots`]).
pub async fn run_maintenance(
    queue: Queue,
    interval: Duration,
    log_retention: Option<Duration>,
    shutdown: tokio_util::sync::CancellationToken,
    on_report: impl Fn(&MaintenanceReport) + Send,
) {
    // A small floor keeps a tight loop from forming around clock jitter.
    let due_at = |due: Duration| tokio::time::Instant::now() + due.max(Duration::from_millis(50));
    let mut turns_dropped_at = tokio::time::Instant::now();
    loop {
        let next_tick = tokio::time::Instant::now() + interval;
        let mut wake_at = next_tick;
        let pass = async {
            let mut report = queue.maintain().await?;
            if let Some(retention) = log_retention {
                report.log_entries_deleted = queue.expire_history(retention).await?;
            }
            if turns_dropped_at.elapsed() >= TURN_DROP_INTERVAL {
                turns_dropped_at = tokio::time::Instant::now();
                report.idle_turns_dropped = queue.drop_idle_turns().await?;
                report.idle_slots_dropped = queue.drop_idle_slots().await?;
            }
            Ok::<_, QueueError>(report)
        };
        match pass.await {
            Ok(report) => {
                if report != MaintenanceReport::default() {
                    tracing::info!(
                        reclaimed = report.reclaimed,
                        reclaims_exhausted = report.reclaims_exhausted,
                        promoted = report.promoted,
                        log_entries_deleted = report.log_entries_deleted,
                        idle_turns_dropped = report.idle_turns_dropped,
                        idle_slots_dropped = report.idle_slots_dropped,
                        turns_unparked = report.turns_unparked,
                        released_from_retired = report.released_from_retired,
                        "maintenance pass"
                    );
                }
                on_report(&report);
                if let Ok(Some(due)) = queue.next_retry_due_in().await {
                    wake_at = wake_at.min(due_at(due));
                }
            }
            Err(error) => {
                if matches!(error, QueueError::Unavailable(_)) {
                    queue.note_database_unavailable();
                }
                tracing::warn!(%error, "maintenance pass failed; retrying next tick")
            }
        }
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep_until(wake_at) => break,
                _ = queue.retry_scheduled.notified() => {
                    if let Ok(Some(due)) = queue.next_retry_due_in().await {
                        wake_at = wake_at.min(due_at(due));
                    }
                }
            }
        }
    }
}
