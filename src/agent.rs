//! The pull loop every agent runs (DESIGN.md §2, §5): long-poll claim with a lease, heartbeat every
//! lease/3 while carrying the order out, complete with the verdict. Shared by the external worker
//! (`pullman worker`) and the in-cluster executor (`pullman executor`), which differ only in how
//! they carry an order out ([`Carrier`]).
//!
//! Shutdown: the first signal stops claiming and lets running orders finish; the second abandons
//! them (their carriers are stopped and no result is reported, so the reaper hands them out again).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use uuid::Uuid;

use crate::api::{ClaimNextBody, CompleteBody};
use crate::client::{Client, ClientError, Completed};
use crate::queue::WorkOrder;

/// The result of carrying out one order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Success { message: String },
    Failure { message: String, retryable: bool },
}

/// Why a carrier was told to stop before it finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// Heartbeat answered `409 cancelled`: undo what can be undone.
    Cancelled,
    /// Heartbeat answered `409 reclaimed` / `not_claim_holder`: someone else may run it now.
    Lost,
    /// Second shutdown signal: abandon to the reaper.
    Abandoned,
}

/// How an agent carries out a claimed order.
pub trait Carrier: Send + Sync + 'static {
    /// Carries `order` out. Must return promptly once `stop` is cancelled (the verdict is then
    /// discarded).
    fn carry(
        &self,
        order: WorkOrder,
        stop: CancellationToken,
    ) -> impl Future<Output = Verdict> + Send;

    /// Called after `carry` returned when the order was cancelled (DESIGN.md §4: the executor
    /// deletes the Jobs and BuildRuns it created). Default: nothing.
    fn cancelled(&self, _order: &WorkOrder) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// Settings of the pull loop.
#[derive(Debug, Clone)]
pub struct LoopConfig {
    pub agent_id: Uuid,
    /// Narrow claims to these work types (empty = the agent's capabilities).
    pub work_types: Vec<String>,
    /// Lease asked for on each claim, seconds.
    pub lease_seconds: u32,
    /// Orders carried out at once.
    pub concurrency: usize,
    /// Long-poll wait per claim request, seconds (server cap 30).
    pub max_wait_seconds: u32,
}

/// Cancellation tokens of a two-stage shutdown.
#[derive(Clone, Default)]
pub struct Shutdown {
    /// Stop claiming; let running orders finish.
    pub drain: CancellationToken,
    /// Stop running orders without reporting.
    pub abandon: CancellationToken,
}

impl Shutdown {
    /// Wires SIGINT/SIGTERM: the first drains, the second abandons.
    pub fn on_signals() -> Self {
        let s = Shutdown::default();
        let task = s.clone();
        tokio::spawn(async move {
            crate::signals::shutdown_signal().await;
            tracing::info!(
                "draining: no new claims; running orders finish (signal again to abandon them)"
            );
            task.drain.cancel();
            crate::signals::shutdown_signal().await;
            tracing::warn!("abandoning running orders; the reaper will hand them out again");
            task.abandon.cancel();
        });
        s
    }
}

/// Runs the pull loop until drained, then waits for running orders.
pub async fn run<C: Carrier>(
    client: Client,
    config: LoopConfig,
    carrier: Arc<C>,
    shutdown: Shutdown,
) {
    let slots = Arc::new(Semaphore::new(config.concurrency.max(1)));
    let mut running = tokio::task::JoinSet::new();
    let mut backoff = Duration::from_millis(500);
    loop {
        let permit = tokio::select! {
            _ = shutdown.drain.cancelled() => break,
            p = slots.clone().acquire_owned() => p.expect("semaphore never closes"),
        };
        let body = ClaimNextBody {
            work_types: (!config.work_types.is_empty()).then(|| config.work_types.clone()),
            max_wait_seconds: Some(i64::from(config.max_wait_seconds)),
            lease_seconds: Some(i64::from(config.lease_seconds)),
        };
        let claimed = tokio::select! {
            _ = shutdown.drain.cancelled() => break,
            r = client.claim_next(config.agent_id, &body) => r,
        };
        match claimed {
            Ok(Some(order)) => {
                backoff = Duration::from_millis(500);
                let (client, carrier, shutdown, config) = (
                    client.clone(),
                    carrier.clone(),
                    shutdown.clone(),
                    config.clone(),
                );
                running.spawn(async move {
                    work_one(&client, &config, carrier.as_ref(), &shutdown, order).await;
                    drop(permit);
                });
            }
            Ok(None) => {}
            Err(error) => {
                if error.is_transient() || error.code() == Some("too_many_long_polls") {
                    tracing::warn!(%error, retry_in = ?backoff, "claim failed; retrying");
                } else {
                    tracing::error!(%error, retry_in = ?backoff, "claim refused; retrying (check the token and agent)");
                }
                tokio::select! {
                    _ = shutdown.drain.cancelled() => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
        // Reap finished tasks so the set does not grow.
        while running.try_join_next().is_some() {}
    }
    if !running.is_empty() {
        tracing::info!(
            running = running.len(),
            "waiting for running orders to finish"
        );
    }
    while running.join_next().await.is_some() {}
}

/// Carries out one claimed order with heartbeats, then reports the verdict.
async fn work_one<C: Carrier>(
    client: &Client,
    config: &LoopConfig,
    carrier: &C,
    shutdown: &Shutdown,
    order: WorkOrder,
) {
    let order_id = order.id;
    let claim_id = order.claim_id;
    let claim = claim_id.map(|c| c.to_string()).unwrap_or_default();
    tracing::info!(work_order = %order_id, %claim, work_type = %order.work_type, "claimed");
    let stop = shutdown.abandon.child_token();
    let reason = Arc::new(std::sync::Mutex::new(None::<StopReason>));
    // Aborted with this task, so an abandoned order stops heartbeating and its lease can lapse.
    let heartbeats = {
        let (client, stop, reason) = (client.clone(), stop.clone(), reason.clone());
        let every = Duration::from_secs(u64::from(config.lease_seconds.max(3)) / 3);
        let agent_id = config.agent_id;
        AbortOnDropHandle::new(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                match client.heartbeat(order_id, agent_id, claim_id).await {
                    Ok(_) => {}
                    Err(e) if e.is_conflict() => {
                        let why = if e.code() == Some("cancelled") {
                            StopReason::Cancelled
                        } else {
                            StopReason::Lost
                        };
                        tracing::warn!(work_order = %order_id, error = %e, "heartbeat refused; stopping work on the order");
                        *reason.lock().unwrap() = Some(why);
                        stop.cancel();
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(work_order = %order_id, error = %e, "heartbeat failed; will retry")
                    }
                }
            }
        }))
    };
    let verdict = carrier.carry(order.clone(), stop.clone()).await;
    heartbeats.abort();
    let stopped = *reason.lock().unwrap();
    match stopped {
        Some(StopReason::Cancelled) => {
            tracing::info!(work_order = %order_id, "order was cancelled; cleaning up, reporting nothing");
            carrier.cancelled(&order).await;
            return;
        }
        Some(_) => {
            tracing::info!(work_order = %order_id, "claim lost; reporting nothing");
            return;
        }
        None if shutdown.abandon.is_cancelled() => {
            tracing::warn!(work_order = %order_id, "abandoned; the reaper will hand it out again");
            return;
        }
        None => {}
    }
    let (success, message, retryable) = match verdict {
        Verdict::Success { message } => (true, message, None),
        Verdict::Failure { message, retryable } => (false, message, Some(retryable)),
    };
    let body = CompleteBody {
        agent_id: config.agent_id,
        claim_id,
        success,
        message: Some(message),
        retryable,
    };
    report(client, order_id, &body).await;
}

/// Reports a verdict, retrying transient failures for up to about a minute.
async fn report(client: &Client, order_id: Uuid, body: &CompleteBody) {
    let mut delay = Duration::from_millis(500);
    for attempt in 1..=8 {
        match client.complete(order_id, body).await {
            Ok(Completed::Finished(entry)) => {
                tracing::info!(work_order = %order_id, outcome = entry.outcome.as_str(), "completed");
                return;
            }
            Ok(Completed::RetryScheduled(r)) => {
                tracing::info!(work_order = %order_id, next_retry_after = %r.next_retry_after, "failed; retry scheduled");
                return;
            }
            Err(e) if e.is_transient() && attempt < 8 => {
                tracing::warn!(work_order = %order_id, error = %e, "complete failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(15));
            }
            Err(e) => {
                report_refused(order_id, &e);
                return;
            }
        }
    }
}

fn report_refused(order_id: Uuid, e: &ClientError) {
    if e.is_conflict() {
        tracing::warn!(work_order = %order_id, error = %e, "result refused: the claim is no longer ours");
    } else {
        tracing::error!(work_order = %order_id, error = %e, "could not report the result");
    }
}
