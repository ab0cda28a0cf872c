//! The pull loop every agent runs (docs/design.md §2, §5): long-poll claim with a lease, carry the
//! order out while heartbeating every lease/3, complete with the verdict. Shared by the external
//! worker (`pullman worker`) and the in-cluster executor (`pullman executor`), which differ only
//! in how they carry an order out ([`Carrier`]).
//!
//! - [`connect`]: the token file, `whoami`, and the capped backoff used while the server is away.
//! - [`order`]: the life of one claimed order as a state machine (claimed → applying → watching →
//!   reporting, or abandoned).
//! - `heartbeat`: the heartbeats of one order.
//! - [`output`]: the order's output sent to the server in numbered chunks, redacted and bounded.
//! - [`lines`]: a stream's bytes cut into lines the same way for both: redacted first, invalid
//!   UTF-8 replaced, long lines in pieces.
//! - [`redact`]: the secret values hidden in that output, multi-line ones included.
//! - [`report`]: the orders' verdicts sent to the server, several in one request when they
//!   come together.
//!
//! Shutdown: the first signal stops claiming and lets running orders finish; the second abandons
//! them (their carriers are stopped and no result is reported, so the reaper hands them out again).
//! A refused token (401/403 on claim, heartbeat or complete) ends the loop with
//! [`PullError::Unauthorized`]: the agent was retired or its token revoked.

pub mod connect;
mod heartbeat;
pub mod lines;
pub mod order;
pub mod output;
pub mod redact;
pub mod report;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

pub use connect::{Backoff, ConnectError, connect_as_agent};
pub use heartbeat::{Progress, lease_third};
pub use order::{Carrier, Ended, Reported, Stage, Verdict};

use crate::client::{Client, ClientError};
use crate::queue::limits;
use crate::wire::ClaimNextBody;

/// Why an order was given up without reporting a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abandon {
    /// A heartbeat answered `409 cancelled`: undo what can be undone.
    Cancelled,
    /// A heartbeat answered `409 reclaimed` / `not_claim_holder`: someone else may run it now.
    Reclaimed,
    /// The second shutdown signal: left to the reaper.
    Stopping,
    /// A heartbeat was answered 401/403: the agent was retired or its token revoked.
    Unauthorized,
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
    /// How often a running order heartbeats, which is also how soon it learns that it was
    /// cancelled or reclaimed (a heartbeat's 409). `None`: every lease/3, as docs/design.md §4
    /// has the executor do; the worker checks in more often so a cancel stops its command within
    /// about a second.
    pub heartbeat_every: Option<Duration>,
}

/// Cancellation tokens of a two-stage shutdown.
#[derive(Clone, Default)]
pub struct Shutdown {
    /// Stop claiming; let running orders finish.
    pub drain: CancellationToken,
    /// Stop running orders without reporting (an order whose verdict is already in reports it,
    /// in one try).
    pub abandon: CancellationToken,
}

impl Shutdown {
    /// Wires SIGINT/SIGTERM: the first drains, the second abandons. The handlers are installed
    /// before this returns, so a signal right after start is not met by its default action.
    /// Panics outside the tokio runtime or if the OS refuses a handler.
    pub fn on_signals() -> Self {
        let s = Shutdown::default();
        let task = s.clone();
        let mut signals = crate::signals::Signals::install().expect("installing signal handlers");
        tokio::spawn(async move {
            signals.recv().await;
            tracing::info!(
                "draining: no new claims; running orders finish (signal again to abandon them)"
            );
            task.drain.cancel();
            signals.recv().await;
            tracing::warn!("abandoning running orders; the reaper will hand them out again");
            task.abandon.cancel();
        });
        s
    }
}

/// Why the pull loop could not go on.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// The server refused the token: see [`ConnectError::Unauthorized`].
    #[error(
        "the server refused this agent's token{}; the agent was retired or its token revoked or \
         rotated: give a current token (pullman agents rotate-token) and start again",
        .0.as_ref().map(|e| format!(" ({e})")).unwrap_or_default()
    )]
    Unauthorized(Option<ClientError>),
}

/// Runs the pull loop until drained, then waits for running orders. Transient claim failures
/// (server down, 5xx) are retried with [`Backoff`]; the first claim that works after failures
/// logs that the agent is connected again.
pub async fn run<C: Carrier>(
    client: Client,
    config: LoopConfig,
    carrier: Arc<C>,
    shutdown: Shutdown,
) -> Result<(), PullError> {
    run_loop(client, config, carrier, shutdown, Runs::Forever)
        .await
        .map(|_| ())
}

/// Claims and carries out at most one order (`pullman worker --once`), claimed before
/// `deadline` (None: waiting until drained). `Ok(None)`: no order came. Retries after failures
/// and a request to a server that does not answer end at the deadline too (a request at most
/// [`DEADLINE_GRACE`] after it, so a long-poll the server answers on time is not dropped).
pub async fn run_once<C: Carrier>(
    client: Client,
    mut config: LoopConfig,
    carrier: Arc<C>,
    shutdown: Shutdown,
    deadline: Option<tokio::time::Instant>,
) -> Result<Option<Ended>, PullError> {
    config.concurrency = 1;
    run_loop(client, config, carrier, shutdown, Runs::Once { deadline }).await
}

/// The longest an empty claim waits for a report in flight to end before claiming again.
const REPORT_WAIT_MOST: Duration = Duration::from_secs(1);

/// How long a claim request may outlast the `--once` deadline: the server answers a long-poll
/// bounded by the deadline within about a second; past this it is not answering at all.
pub const DEADLINE_GRACE: Duration = Duration::from_secs(2);

/// How many orders the pull loop takes.
#[derive(Debug, Clone, Copy)]
enum Runs {
    /// Orders until drained (`pullman worker`, the executor).
    Forever,
    /// One order, claimed before `deadline` if there is one (`pullman worker --once [--wait]`).
    Once {
        deadline: Option<tokio::time::Instant>,
    },
}

impl Runs {
    fn once(self) -> bool {
        matches!(self, Runs::Once { .. })
    }

    fn deadline(self) -> Option<tokio::time::Instant> {
        match self {
            Runs::Once { deadline } => deadline,
            Runs::Forever => None,
        }
    }
}

/// The orders the loop has running, and what the finished ones said.
struct Running {
    set: tokio::task::JoinSet<Ended>,
    /// A finished order whose token was refused: the agent cannot go on.
    refused: Option<PullError>,
    /// How the last finished order ended (what `--once` exits with).
    last: Option<Ended>,
}

impl Running {
    fn note(&mut self, done: Result<Ended, tokio::task::JoinError>) {
        if let Ok(ended) = done {
            if ended.unauthorized() && self.refused.is_none() {
                self.refused = Some(PullError::Unauthorized(None));
            }
            self.last = Some(ended);
        }
    }

    /// Notes the orders that have finished, without waiting, so the set does not grow.
    fn collect_finished(&mut self) {
        while let Some(done) = self.set.try_join_next() {
            self.note(done);
        }
    }

    /// Waits for the next order to finish; false when none runs.
    async fn join_next(&mut self) -> bool {
        match self.set.join_next().await {
            Some(done) => {
                self.note(done);
                true
            }
            None => false,
        }
    }
}

/// The loop: collect finished orders → take a free slot → claim (for every free slot at once) →
/// spawn each order claimed; then, drained, wait for the running ones.
async fn run_loop<C: Carrier>(
    client: Client,
    config: LoopConfig,
    carrier: Arc<C>,
    shutdown: Shutdown,
    runs: Runs,
) -> Result<Option<Ended>, PullError> {
    let slots = Arc::new(Semaphore::new(config.concurrency.max(1)));
    let pull = Pull {
        reports: order::Reports::new(
            config.concurrency * order::REPORTS_PER_SLOT,
            report::Reporter::start(client.clone(), config.agent_id),
        ),
        client,
        config,
        carrier,
        shutdown,
        runs,
    };
    let shutdown = &pull.shutdown;
    let mut running = Running {
        set: tokio::task::JoinSet::new(),
        refused: None,
        last: None,
    };
    let mut backoff = Backoff::default();
    loop {
        running.collect_finished();
        if running.refused.is_some() || (runs.once() && running.last.is_some()) {
            break;
        }
        let permit = tokio::select! {
            _ = shutdown.drain.cancelled() => break,
            p = slots.clone().acquire_owned() => p.expect("semaphore never closes"),
        };
        if runs.once() && !running.set.is_empty() {
            // The one order is running: wait for it instead of claiming another.
            drop(permit);
            running.join_next().await;
            break;
        }
        // The orders of the last claim that finish at once (work that returns promptly) free
        // their slots in their own tasks: one turn of the scheduler lets them, so this claim
        // asks for all of them rather than for the first slot and what happened to be free.
        // Without it one agent of 16 slots claimed 8.2 orders a claim, 15.3 with it
        // (`bench/queue.rs` 2d; bench/README.md, issue #34).
        tokio::task::yield_now().await;
        let Some(max_wait) = claim_wait(&pull.config, runs, &backoff) else {
            break;
        };
        let permits = more_permits(&pull.config, &slots, permit);
        if let Flow::Stop = pull
            .claim(&mut running, &mut backoff, permits, max_wait)
            .await
        {
            break;
        }
    }
    // Orders that finished since the last claim stay in the set until joined.
    running.collect_finished();
    if running.refused.is_some() {
        // The same token cannot heartbeat or report: stop running orders at once.
        shutdown.abandon.cancel();
    }
    if !running.set.is_empty() {
        tracing::info!(
            running = running.set.len(),
            "waiting for running orders to finish"
        );
    }
    while running.join_next().await {}
    match running.refused {
        Some(e) => Err(e),
        None => Ok(running.last),
    }
}

/// What the loop does after a claim step: claim again, or stop claiming.
enum Flow {
    Next,
    Stop,
}

/// What every claim of one loop reads.
struct Pull<C> {
    client: Client,
    config: LoopConfig,
    carrier: Arc<C>,
    shutdown: Shutdown,
    runs: Runs,
    reports: Arc<order::Reports>,
}

impl<C: Carrier> Pull<C> {
    /// One claim-next for as many orders as `permits` (free slots), long-polling up to `max_wait`
    /// seconds: ask ([`Self::ask`]), then start what came ([`Self::start`]), wait for a report
    /// when nothing came while reports are in flight, or back off ([`Self::back_off`]). A refused
    /// token is put in `running.refused` and stops the loop.
    async fn claim(
        &self,
        running: &mut Running,
        backoff: &mut Backoff,
        permits: Vec<OwnedSemaphorePermit>,
        mut max_wait: i64,
    ) -> Flow {
        // While reports are in flight the server still counts their claims: an agent at its
        // max_concurrency (an Executor's) would get nothing and its long-poll would sleep, as
        // nothing wakes it when its own claims end. So it does not wait at the server; an empty
        // answer waits here for a report to end instead.
        // Listening before counting: a report that ends in between still wakes the wait below.
        let report_ends = self.reports.one_ends();
        let reporting = self.reports.in_flight() > 0;
        if reporting {
            max_wait = 0;
        }
        let Some(claimed) = self.ask(permits.len(), max_wait).await else {
            return Flow::Stop;
        };
        match claimed {
            Ok(claim) => {
                let failures = backoff.succeeded();
                if failures > 0 {
                    tracing::info!(failures, "connected to the server again");
                }
                if claim.is_empty() && reporting {
                    tokio::select! {
                        _ = self.shutdown.drain.cancelled() => return Flow::Stop,
                        _ = report_ends => {}
                        _ = tokio::time::sleep(REPORT_WAIT_MOST) => {}
                    }
                    return Flow::Next;
                }
                self.start(running, claim, permits);
                Flow::Next
            }
            Err(error) if error.is_unauthorized() => {
                running.refused = Some(PullError::Unauthorized(Some(error)));
                Flow::Stop
            }
            Err(error) => self.back_off(backoff, error).await,
        }
    }

    /// The claim-next request for up to `slots` orders; `None` when the loop drains or
    /// `--once --wait` runs out (plus [`DEADLINE_GRACE`]) before the server answers.
    async fn ask(
        &self,
        slots: usize,
        max_wait: i64,
    ) -> Option<Result<Vec<crate::wire::WorkOrder>, ClientError>> {
        let config = &self.config;
        let body = ClaimNextBody {
            work_types: (!config.work_types.is_empty()).then(|| config.work_types.clone()),
            max_wait_seconds: Some(max_wait),
            lease_seconds: Some(i64::from(config.lease_seconds)),
            max_orders: (config.concurrency > 1).then_some(slots as i64),
        };
        let give_up = async {
            match self.runs.deadline() {
                Some(at) => tokio::time::sleep_until(at + DEADLINE_GRACE).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.shutdown.drain.cancelled() => None,
            _ = give_up => {
                tracing::warn!("the server did not answer the claim before --wait ran out");
                None
            }
            r = self.client.claim_next(config.agent_id, &body) => Some(r),
        }
    }

    /// Starts each order claimed in its own task with one of `permits`; slots left over are
    /// free again as their permits drop.
    fn start(
        &self,
        running: &mut Running,
        claim: Vec<crate::wire::WorkOrder>,
        permits: Vec<OwnedSemaphorePermit>,
    ) {
        for (order, permit) in claim.into_iter().zip(permits) {
            let slot = order::Slot::new(permit, self.reports.clone());
            spawn_order(
                running,
                &self.client,
                &self.config,
                &self.carrier,
                &self.shutdown,
                order,
                slot,
            );
        }
    }

    /// A failed claim: logged (a warning when it may pass, an error when the server refused it),
    /// then the loop waits out the backoff, never past `--once --wait`.
    async fn back_off(&self, backoff: &mut Backoff, error: ClientError) -> Flow {
        let wait = backoff.failed();
        if error.is_transient() || error.code() == Some("too_many_long_polls") {
            tracing::warn!(%error, retry_in = ?wait, "claim failed; retrying");
        } else {
            tracing::error!(%error, retry_in = ?wait, "claim refused; retrying");
        }
        let wake = tokio::time::Instant::now() + wait;
        let wake = self.runs.deadline().map_or(wake, |at| wake.min(at));
        tokio::select! {
            _ = self.shutdown.drain.cancelled() => Flow::Stop,
            _ = tokio::time::sleep_until(wake) => Flow::Next,
        }
    }
}

/// How long the next claim may long-poll, in seconds; `None` when `--once --wait` has run out.
fn claim_wait(config: &LoopConfig, runs: Runs, backoff: &Backoff) -> Option<i64> {
    // With --once and --wait, the long-poll never outlasts the wait (a claim answered after
    // its request was dropped would sit claimed until the reaper hands it out again).
    let mut max_wait = i64::from(config.max_wait_seconds);
    if let Some(at) = runs.deadline() {
        let left = at.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return None;
        }
        max_wait = max_wait.min(left.as_secs_f64().ceil() as i64);
    }
    if backoff.failures() > 0 {
        // After failures the first claim does not wait, so its answer says at once that the
        // server is back (a long-poll would answer only when its wait ends, up to 30 s on).
        max_wait = 0;
    }
    Some(max_wait)
}

/// Multi-claim: `first` and every other free slot (up to the server's `max_orders`), so an agent
/// with room for several orders fills it in one round trip and one commit (each order still
/// holds one slot).
fn more_permits(
    config: &LoopConfig,
    slots: &Arc<Semaphore>,
    first: OwnedSemaphorePermit,
) -> Vec<OwnedSemaphorePermit> {
    let mut permits = vec![first];
    if config.concurrency > 1 {
        let most = limits::MAX_ORDERS.max as usize;
        while permits.len() < most {
            match slots.clone().try_acquire_owned() {
                Ok(p) => permits.push(p),
                Err(_) => break,
            }
        }
    }
    permits
}

/// Carries `order` out in its own task, holding `slot` until its verdict is in
/// ([`order::Slot`]).
fn spawn_order<C: Carrier>(
    running: &mut Running,
    client: &Client,
    config: &LoopConfig,
    carrier: &Arc<C>,
    shutdown: &Shutdown,
    order: crate::wire::WorkOrder,
    slot: order::Slot,
) {
    let span = tracing::info_span!("order", id = %order.id);
    let (client, carrier, abandon) = (client.clone(), carrier.clone(), shutdown.abandon.clone());
    let (agent_id, lease_seconds, heartbeat_every) = (
        config.agent_id,
        config.lease_seconds,
        config.heartbeat_every,
    );
    running.set.spawn(
        async move {
            let ctx = order::OrderContext {
                client: &client,
                agent_id,
                lease_seconds,
                heartbeat_every,
                abandon: &abandon,
                slot,
            };
            order::carry_one(ctx, carrier.as_ref(), order).await
        }
        .instrument(span),
    );
}
