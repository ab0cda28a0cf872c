//! The life of one claimed order, as a state machine (docs/design.md §2, §4):
//!
//! ```text
//! Claimed ──▶ Applying ──▶ Watching ──▶ Reporting ──▶ (reported)
//!                 │  └────────────────────▲ (applying gave a verdict at once)
//!                 └──────────┴──▶ Abandoned(Cancelled | Reclaimed | Stopping | Unauthorized)
//! ```
//!
//! `Applying` and `Watching` are the carrier's two steps ([`Carrier::start`] and
//! [`Carrier::finish`]); while either runs, heartbeats go out every lease/3. A refused heartbeat
//! (the order was cancelled, reclaimed, or the token refused) or the second shutdown signal
//! moves the order to `Abandoned`: the carrier is told to stop, nothing is reported, and a
//! cancelled order is cleaned up ([`Carrier::cancelled`]). Every transition is in [`carry_one`].
//! The order's [`Slot`] is given back once `Reporting` holds a report permit; heartbeats go on
//! until then, and a refusal abandons the order there as well. A verdict already in is not
//! abandoned by the second signal: it is reported at once, in one try.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::Abandon;
use super::heartbeat::{Heartbeats, Progress};
use super::report::Reporter;
use crate::client::{Client, ClientError, Completed};
use crate::wire::CompleteBody;
use crate::wire::WorkOrder;

/// The result of carrying out one order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Success {
        message: String,
    },
    Failure {
        message: String,
        retryable: bool,
    },
    /// The attempt was ended by a disruption (eviction, drain, preemption, a lost node), not by
    /// the work (docs/design.md §12). `stopped`: the disrupted run is known to have stopped, so
    /// that an order with `retryOnDisruption: safe` may run again.
    Disrupted {
        message: String,
        stopped: bool,
    },
}

/// Where one claimed order is in its life. `S` is what the carrier's `Applying` step hands to
/// its `Watching` step.
#[derive(Debug)]
pub enum Stage<S> {
    /// Claimed; nothing done yet.
    Claimed,
    /// The carrier is starting the work (the executor applies objects; the worker starts CMD).
    Applying,
    /// The carrier waits for the verdict of what it started.
    Watching(S),
    /// A verdict is being reported to the server.
    Reporting(Verdict),
    /// Given up without a report.
    Abandoned(Abandon),
}

impl<S> Stage<S> {
    /// The stage's name for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Stage::Claimed => "claimed",
            Stage::Applying => "applying",
            Stage::Watching(_) => "watching",
            Stage::Reporting(_) => "reporting",
            Stage::Abandoned(_) => "abandoned",
        }
    }
}

/// What the server made of a reported verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reported {
    /// Recorded in the log with this outcome (`succeeded`, `failed`).
    Finished(String),
    /// A failure the server will retry.
    RetryScheduled,
    /// Refused with 409: the claim was no longer ours.
    Refused,
    /// Refused with 401/403.
    Unauthorized,
    /// Not delivered (server unreachable for about a minute, or another error).
    Lost,
}

/// How one order's life ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// The verdict was reported (or reporting was tried).
    Reported {
        verdict: Verdict,
        reported: Reported,
    },
    /// Given up without a report.
    Abandoned(Abandon),
}

impl Ended {
    /// Whether the token was refused on the way (the agent cannot go on).
    pub fn unauthorized(&self) -> bool {
        matches!(
            self,
            Ended::Abandoned(Abandon::Unauthorized)
                | Ended::Reported {
                    reported: Reported::Unauthorized,
                    ..
                }
        )
    }
}

/// How an agent carries out a claimed order, in two steps.
pub trait Carrier: Send + Sync + 'static {
    /// What [`Carrier::start`] hands to [`Carrier::finish`].
    type Started: Send + 'static;

    /// `Applying`: starts carrying `order` out. `Err(verdict)` goes straight to `Reporting` (for
    /// example an object the cluster rejected). Must return promptly once `stop` fires (the
    /// result is then discarded).
    fn start(
        &self,
        order: &WorkOrder,
        stop: &CancellationToken,
    ) -> impl Future<Output = Result<Self::Started, Verdict>> + Send;

    /// `Watching`: waits for the verdict of what `start` began, saying through `progress` what
    /// holds the order up meanwhile, if anything does (docs/design.md §12; its heartbeats carry
    /// it). Must return promptly once `stop` fires (the verdict is then discarded).
    fn finish(
        &self,
        order: &WorkOrder,
        started: Self::Started,
        stop: &CancellationToken,
        progress: &Progress,
    ) -> impl Future<Output = Verdict> + Send;

    /// Called when the order was cancelled while carried out (docs/design.md §4: the executor
    /// deletes the Jobs and BuildRuns it created). Default: nothing.
    fn cancelled(&self, _order: &WorkOrder) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// What [`carry_one`] needs besides the order.
pub struct OrderContext<'a> {
    pub client: &'a Client,
    pub agent_id: Uuid,
    /// Lease asked for with the claim, seconds; heartbeats go out every third of it unless
    /// `heartbeat_every` says more often.
    pub lease_seconds: u32,
    /// Heartbeat interval when it is not lease/3 ([`super::LoopConfig::heartbeat_every`]).
    pub heartbeat_every: Option<Duration>,
    /// The second shutdown signal.
    pub abandon: &'a CancellationToken,
    /// The agent's slot the order holds.
    pub slot: Slot,
}

/// The agent's slot an order holds (one of [`super::LoopConfig::concurrency`]). It is given back
/// as soon as the verdict is in, so the next order starts while this one reports: reporting is
/// not carrying out, and a slot held through the complete's commit left one agent of 16 slots at
/// about half of what River's 16 workers do, which free theirs the same way (`bench/queue.rs`
/// 2d, issue #34). The slot is given back once the order holds one of the agent's [`Reports`],
/// and heartbeats go on while it waits for one.
pub struct Slot {
    running: Option<OwnedSemaphorePermit>,
    reports: Arc<Reports>,
}

impl Slot {
    /// `running`: the slot's permit; `reports`: the agent's reports.
    pub fn new(running: OwnedSemaphorePermit, reports: Arc<Reports>) -> Self {
        Slot {
            running: Some(running),
            reports,
        }
    }

    /// Takes a report permit, then gives the slot back.
    async fn reporting(&mut self) -> ReportInFlight {
        let permit = self
            .reports
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the report semaphore is never closed");
        self.running = None;
        ReportInFlight {
            permit: Some(permit),
            reports: self.reports.clone(),
        }
    }
}

/// Reports an agent may have in flight per slot: an order's slot is given back once its report
/// holds one of them. With one per slot, a claim found the slots of the orders whose reports
/// waited for the last group commit still taken; with two, one agent of 16 slots worked 14 %
/// more orders a second (`bench/queue.rs` 2d, three runs each, alternated: 3,881–4,110 with one,
/// 4,411–4,626 with two, 4,214–4,943 with four; bench/README.md, issue #34).
pub const REPORTS_PER_SLOT: usize = 2;

/// The reports an agent's orders have in flight: at most [`REPORTS_PER_SLOT`] per slot, so an
/// agent holds at most three times its concurrency in claims while the server is slow to answer,
/// and stops claiming once that many reports wait (for a server that is away, say).
pub struct Reports {
    permits: Arc<Semaphore>,
    most: usize,
    ended: Notify,
    /// Sends the reports, several in one request when they come together.
    reporter: Reporter,
}

impl Reports {
    /// Room for `slots` reports (at least 1): the loop passes its slots × [`REPORTS_PER_SLOT`];
    /// they are sent by `reporter`.
    pub fn new(slots: usize, reporter: Reporter) -> Arc<Self> {
        Arc::new(Reports {
            permits: Arc::new(Semaphore::new(slots.max(1))),
            most: slots.max(1),
            ended: Notify::new(),
            reporter,
        })
    }

    /// Reports in flight now.
    pub fn in_flight(&self) -> usize {
        self.most - self.permits.available_permits()
    }

    /// Resolves when a report in flight ends after this was called (the future listens from
    /// its creation, before it is first polled).
    pub fn one_ends(&self) -> tokio::sync::futures::Notified<'_> {
        self.ended.notified()
    }
}

/// A report in flight; says so when it ends, once its permit is back (so a loop woken by it
/// counts one report fewer).
struct ReportInFlight {
    permit: Option<OwnedSemaphorePermit>,
    reports: Arc<Reports>,
}

impl Drop for ReportInFlight {
    fn drop(&mut self) {
        drop(self.permit.take());
        self.reports.ended.notify_waiters();
    }
}

/// Runs one step of the carrier while watching heartbeats and the shutdown; on a refusal or the
/// second signal the step is told to stop, awaited, and its result dropped.
struct Guard<'a> {
    heartbeats: Heartbeats,
    stop: CancellationToken,
    abandon: &'a CancellationToken,
}

impl Guard<'_> {
    async fn run<F: Future>(&mut self, step: F) -> Result<F::Output, Abandon> {
        tokio::pin!(step);
        let why = tokio::select! {
            out = &mut step => match self.stopped() {
                Some(why) => why,
                None => return Ok(out),
            },
            why = self.heartbeats.refused() => why,
            _ = self.abandon.cancelled() => Abandon::Stopping,
        };
        self.stop.cancel();
        step.await;
        Err(why)
    }

    /// Why the step was stopped, if it was (its result is then not a verdict).
    fn stopped(&mut self) -> Option<Abandon> {
        if let Some(why) = self.heartbeats.refused_now() {
            return Some(why);
        }
        self.abandon.is_cancelled().then_some(Abandon::Stopping)
    }
}

/// Carries one claimed order through its stages, from `Claimed` to a report or `Abandoned`.
pub async fn carry_one<C: Carrier>(
    mut ctx: OrderContext<'_>,
    carrier: &C,
    order: WorkOrder,
) -> Ended {
    let progress = Progress::default();
    let mut guard = Guard {
        heartbeats: Heartbeats::start(
            ctx.client.clone(),
            ctx.agent_id,
            order.id,
            order.claim_id,
            ctx.heartbeat_every
                .unwrap_or_else(|| super::lease_third(ctx.lease_seconds)),
            &progress,
        ),
        stop: ctx.abandon.child_token(),
        abandon: ctx.abandon,
    };
    let mut stage: Stage<C::Started> = Stage::Claimed;
    loop {
        tracing::debug!(stage = stage.name(), "order stage");
        stage = match stage {
            Stage::Claimed => {
                tracing::info!(claim = %order.claim_id.map(|c| c.to_string()).unwrap_or_default(), work_type = %order.work_type, "claimed");
                Stage::Applying
            }
            Stage::Applying => {
                let stop = guard.stop.clone();
                match guard.run(carrier.start(&order, &stop)).await {
                    Ok(Ok(started)) => Stage::Watching(started),
                    Ok(Err(verdict)) => Stage::Reporting(verdict),
                    Err(why) => Stage::Abandoned(why),
                }
            }
            Stage::Watching(started) => {
                let stop = guard.stop.clone();
                match guard
                    .run(carrier.finish(&order, started, &stop, &progress))
                    .await
                {
                    Ok(verdict) => Stage::Reporting(verdict),
                    Err(why) => Stage::Abandoned(why),
                }
            }
            // The slot is given back once a report permit is held. Meanwhile heartbeats go on
            // and a refusal abandons the order as in the steps before (checked first: a
            // cancelled order is cleaned up, not reported). The second signal does not throw
            // the verdict away: it is reported at once, without a permit, in one try, so the
            // agent still stops promptly.
            Stage::Reporting(verdict) => {
                let waited = tokio::select! {
                    biased;
                    why = guard.heartbeats.refused() => Err(why),
                    reporting = ctx.slot.reporting() => Ok(Some(reporting)),
                    _ = ctx.abandon.cancelled() => Ok(None),
                };
                let waited = match guard.heartbeats.refused_now() {
                    Some(why) => Err(why),
                    None => waited,
                };
                match waited {
                    Err(why) => Stage::Abandoned(why),
                    Ok(reporting) => {
                        drop(guard);
                        // With a permit, with the agent's other reports; after the second
                        // signal alone, so that it goes at once even while the batches in
                        // flight wait for the server.
                        let via = match reporting {
                            Some(_) => Via::Batch(&ctx.slot.reports.reporter),
                            None => Via::Alone(ctx.client),
                        };
                        let reported = report(via, ctx.agent_id, &order, &verdict).await;
                        return Ended::Reported { verdict, reported };
                    }
                }
            }
            Stage::Abandoned(why) => {
                drop(guard);
                match why {
                    Abandon::Cancelled => {
                        tracing::info!("order was cancelled; cleaning up, reporting nothing");
                        carrier.cancelled(&order).await;
                    }
                    Abandon::Reclaimed => tracing::info!("claim lost; reporting nothing"),
                    Abandon::Stopping => {
                        tracing::warn!("abandoned; the reaper will hand it out again")
                    }
                    Abandon::Unauthorized => {
                        tracing::error!("token refused; reporting nothing")
                    }
                }
                return Ended::Abandoned(why);
            }
        };
    }
}

/// Tries of a report: transient failures are retried for up to about a minute.
const REPORT_TRIES: u32 = 8;

/// How a report goes to the server.
enum Via<'a> {
    /// With the agent's other reports (`report::Reporter`), retried for about a minute.
    Batch(&'a Reporter),
    /// As a single complete, in one try.
    Alone(&'a Client),
}

/// Reports a verdict (transient failures retried with backoff, [`REPORT_TRIES`] tries in all,
/// when it goes [`Via::Batch`]).
async fn report(via: Via<'_>, agent_id: Uuid, order: &WorkOrder, verdict: &Verdict) -> Reported {
    let tries = match via {
        Via::Batch(_) => REPORT_TRIES,
        Via::Alone(_) => 1,
    };
    let (success, message, retryable, disrupted) = match verdict {
        Verdict::Success { message } => (true, message.clone(), None, None),
        Verdict::Failure { message, retryable } => (false, message.clone(), Some(*retryable), None),
        Verdict::Disrupted { message, stopped } => {
            (false, message.clone(), Some(*stopped), Some(true))
        }
    };
    let body = CompleteBody {
        agent_id,
        claim_id: order.claim_id,
        success,
        message: Some(message),
        retryable,
        disrupted,
    };
    let mut delay = Duration::from_millis(500);
    for attempt in 1..=tries {
        let answer = match via {
            Via::Batch(reporter) => reporter.complete(order.id, body.clone()).await,
            Via::Alone(client) => client.complete(order.id, &body).await.map_err(Arc::new),
        };
        match answer {
            Ok(Completed::Finished(entry)) => {
                tracing::info!(outcome = entry.outcome.as_str(), "completed");
                return Reported::Finished(entry.outcome.as_str().to_string());
            }
            Ok(Completed::RetryScheduled(r)) => {
                tracing::info!(next_retry_after = %r.next_retry_after, "failed; retry scheduled");
                return Reported::RetryScheduled;
            }
            Err(e) if e.is_transient() && attempt < tries => {
                tracing::warn!(error = %e, "complete failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(15));
            }
            Err(e) => return report_refused(&e),
        }
    }
    Reported::Lost
}

fn report_refused(e: &ClientError) -> Reported {
    if e.is_conflict() {
        tracing::warn!(error = %e, "result refused: the claim is no longer ours");
        Reported::Refused
    } else if e.is_unauthorized() {
        tracing::error!(error = %e, "result refused: the token was refused");
        Reported::Unauthorized
    } else {
        tracing::error!(error = %e, "could not report the result");
        Reported::Lost
    }
}
