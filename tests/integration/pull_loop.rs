//! The agents' pull loop (`pullman::pull::run`, what `pullman worker` and the executor run)
//! against a real server: an order gives its slot back once its verdict is in, so the next order
//! starts while it reports, and the reports waiting are bounded by the slots
//! (`pull::order::Slot`, `pull::order::REPORTS_PER_SLOT`, issue #34).

use std::sync::Arc;
use std::time::Duration;

use pullman::client::Client;
use pullman::pull::order::REPORTS_PER_SLOT;
use pullman::pull::{self, Carrier, LoopConfig, Shutdown, Verdict};
use pullman::testing::{TestServer, eventually};
use pullman::wire::WorkOrder;
use serde_json::json;
use sqlx::{PgPool, Postgres, Transaction};
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Says which orders it starts; the first `hold` orders it finishes have their rows locked in
/// transactions the test holds, so their completes wait at the database until the test lets go
/// (or, with `release_after`, until that much later). The orders after them end with `then`.
struct HoldsFirstReport {
    started: mpsc::UnboundedSender<Uuid>,
    pool: PgPool,
    lock: Arc<Mutex<Vec<Transaction<'static, Postgres>>>>,
    locked: std::sync::atomic::AtomicUsize,
    hold: usize,
    release_after: Option<Duration>,
    then: Verdict,
}

impl Carrier for HoldsFirstReport {
    type Started = ();

    async fn start(&self, order: &WorkOrder, _stop: &CancellationToken) -> Result<(), Verdict> {
        let _ = self.started.send(order.id);
        Ok(())
    }

    async fn finish(
        &self,
        order: &WorkOrder,
        _: (),
        _stop: &CancellationToken,
        _: &pull::Progress,
    ) -> Verdict {
        if self
            .locked
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            >= self.hold
        {
            return self.then.clone();
        }
        let mut tx = self.pool.begin().await.unwrap();
        sqlx::query("SELECT id FROM work_orders WHERE id = $1 FOR UPDATE")
            .bind(order.id)
            .execute(&mut *tx)
            .await
            .unwrap();
        self.lock.lock().await.push(tx);
        if let Some(after) = self.release_after {
            let lock = self.lock.clone();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                for tx in lock.lock().await.drain(..) {
                    tx.rollback().await.unwrap();
                }
            });
        }
        done()
    }
}

impl HoldsFirstReport {
    /// The carrier, on `server`'s database, holding the completes of the first `hold` orders
    /// (which succeed) and ending the others with `then`, and the ids of the orders it starts, in
    /// order.
    fn new(
        server: &TestServer,
        hold: usize,
        release_after: Option<Duration>,
        then: Verdict,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<Uuid>) {
        let (started, starts) = mpsc::unbounded_channel();
        let carrier = Arc::new(HoldsFirstReport {
            started,
            pool: server.pool.clone(),
            lock: Default::default(),
            locked: Default::default(),
            hold,
            release_after,
            then,
        });
        (carrier, starts)
    }

    /// How many completes are held now.
    async fn held(&self) -> usize {
        self.lock.lock().await.len()
    }

    /// Lets the held completes through: rolls back the transactions that lock their rows.
    async fn let_go(&self) {
        let held: Vec<_> = self.lock.lock().await.drain(..).collect();
        assert!(!held.is_empty(), "no held report to let go");
        for tx in held {
            tx.rollback().await.unwrap();
        }
    }
}

/// The task running a pull loop.
type LoopTask = tokio::task::JoinHandle<Result<(), pull::PullError>>;

/// Starts the pull loop of `agent` with one slot, a 60 s lease and claims that wait up to
/// `max_wait_seconds`, carrying orders out with `carrier`; returns its shutdown and its task.
fn one_slot_loop(
    server: &TestServer,
    agent: Uuid,
    token: &str,
    max_wait_seconds: u32,
    carrier: Arc<HoldsFirstReport>,
) -> (Shutdown, LoopTask) {
    let shutdown = Shutdown::default();
    let config = LoopConfig {
        agent_id: agent,
        work_types: Vec::new(),
        lease_seconds: 60,
        concurrency: 1,
        max_wait_seconds,
        heartbeat_every: None,
    };
    let agent_loop = tokio::spawn(pull::run(
        Client::new(&server.base, token).unwrap(),
        config,
        carrier,
        shutdown.clone(),
    ));
    (shutdown, agent_loop)
}

/// The verdict of an order whose complete is not held.
fn done() -> Verdict {
    Verdict::Success {
        message: "done".into(),
    }
}

/// Registers an agent named and labelled `label` (with the fields of `extra` as well) and `n`
/// ConfigMap orders for it, created in turn: (agent id, token, order ids).
async fn agent_with_orders(
    server: &TestServer,
    label: &str,
    extra: serde_json::Value,
    n: usize,
) -> (Uuid, String, Vec<String>) {
    let mut body = json!({"name": label, "labels": [label]});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let (agent, token) = server.agent(body).await;
    let mut orders = Vec::new();
    for _ in 0..n {
        orders.push(server.order(pullman::testing::configmap_order(label)).await);
    }
    (agent.parse().unwrap(), token, orders)
}

/// Waits up to `secs` seconds for the loop's task to end (`what` says which end) and checks
/// that it ended without an error.
async fn ends(agent_loop: LoopTask, secs: u64, what: &str) {
    tokio::time::timeout(Duration::from_secs(secs), agent_loop)
        .await
        .expect(what)
        .unwrap()
        .unwrap();
}

/// The next order the carrier starts, within 10 s.
async fn next_start(starts: &mut mpsc::UnboundedReceiver<Uuid>, what: &str) -> Uuid {
    tokio::time::timeout(Duration::from_secs(10), starts.recv())
        .await
        .unwrap_or_else(|_| panic!("{what} did not start within 10 s"))
        .unwrap()
}

/// One slot, [`REPORTS_PER_SLOT`] + 2 orders. The completes of the first `REPORTS_PER_SLOT`
/// orders are held at the database: each order after the first starts while those before it
/// report (its slot was given back when the verdict before was in), until the report permits
/// are taken; then the next order's report waits for a permit, so it keeps its slot and the last
/// order is not claimed (the agent holds `REPORTS_PER_SLOT` + 1 claims, not more); once the held
/// completes go through, the last order runs, and every order is in the log once, succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_is_given_back_when_the_verdict_is_in_and_reports_waiting_are_bounded() {
    let server = TestServer::start().await;
    let n = REPORTS_PER_SLOT + 2;
    let (agent_id, token, orders) = agent_with_orders(&server, "pull-loop", json!({}), n).await;
    let (carrier, mut starts) = HoldsFirstReport::new(&server, REPORTS_PER_SLOT, None, done());
    let (shutdown, agent_loop) = one_slot_loop(&server, agent_id, &token, 1, carrier.clone());

    let mut started = Vec::new();
    for i in 0..=REPORTS_PER_SLOT {
        let what = format!(
            "order {} (while the completes before it wait at the database)",
            i + 1
        );
        started.push(next_start(&mut starts, &what).await);
    }
    eventually(10, "the held completes' rows locked", || {
        let carrier = carrier.clone();
        async move { (carrier.held().await == REPORTS_PER_SLOT).then_some(()) }
    })
    .await;

    // The last started order's report waits for a permit: it keeps its slot, so nothing more is
    // claimed. Watched for 1.5 s: another claim would come within milliseconds.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        starts.try_recv().is_err(),
        "an order started while every report permit and the slot were taken"
    );
    let (held,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM work_order_claims WHERE agent_id = $1")
            .bind(agent_id)
            .fetch_one(&server.pool)
            .await
            .unwrap();
    assert_eq!(
        held as usize,
        REPORTS_PER_SLOT + 1,
        "the agent holds the orders reporting and the one waiting to, no more"
    );

    // Let the held completes through: the last order runs.
    carrier.let_go().await;
    let last = next_start(&mut starts, "the last order").await;
    assert!(!started.contains(&last));
    started.push(last);

    eventually(10, "every order in the log", || {
        let pool = server.pool.clone();
        let ids = started.clone();
        async move {
            let (n,): (i64,) = sqlx::query_as(
                "SELECT count(*) FROM work_order_log WHERE outcome = 'succeeded' AND id = ANY($1)",
            )
            .bind(ids)
            .fetch_one(&pool)
            .await
            .unwrap();
            (n as usize == REPORTS_PER_SLOT + 2).then_some(())
        }
    })
    .await;
    let ids: Vec<String> = started.iter().map(Uuid::to_string).collect();
    for order in &orders {
        assert!(ids.contains(order), "order {order} was not carried out");
    }
    shutdown.drain.cancel();
    ends(agent_loop, 10, "the loop drains").await;
}

/// An agent whose `max_concurrency` is its loop's concurrency (as an Executor's Deployment runs
/// it): a slot given back while its order still reports finds the server counting that claim, so
/// a long-poll would sleep up to its wait (30 s here) with nothing to wake it. The first order's
/// complete is held at the database for 2 s, so the next claim comes while it reports. While
/// reports are in flight the loop does not wait at the server: 5 orders are done within 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_at_its_max_concurrency_does_not_sleep_while_its_reports_end() {
    let server = TestServer::start().await;
    let capped = json!({"max_concurrency": 1});
    let (agent, token, orders) = agent_with_orders(&server, "capped-loop", capped, 5).await;
    let (carrier, _starts) =
        HoldsFirstReport::new(&server, 1, Some(Duration::from_secs(2)), done());
    let (shutdown, agent_loop) = one_slot_loop(&server, agent, &token, 30, carrier);
    for order in &orders {
        let entry = server.log_entry(order, 10).await;
        assert_eq!(entry["outcome"], "succeeded", "{entry}");
    }
    shutdown.drain.cancel();
    ends(agent_loop, 35, "the loop drains").await;
}

/// The second signal while an order waits for its turn to report: its verdict is reported at
/// once (without waiting for a report permit), not thrown away. One slot; the completes of the
/// first [`REPORTS_PER_SLOT`] orders are held at the database, the next order's verdict is in and
/// waits behind them; then both signals. That order (a failure, see below) reaches the log while
/// the others are still held; once let go, they do too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_signal_reports_a_verdict_that_waits_for_its_turn() {
    let server = TestServer::start().await;
    let n = REPORTS_PER_SLOT + 1;
    let (agent, token, _) = agent_with_orders(&server, "signal-loop", json!({}), n).await;
    // A failure: its complete does not go through the group commit, whose runners the held
    // completes may all occupy.
    let fails = Verdict::Failure {
        message: "after the held ones".into(),
        retryable: false,
    };
    let (carrier, mut starts) = HoldsFirstReport::new(&server, REPORTS_PER_SLOT, None, fails);
    let (shutdown, agent_loop) = one_slot_loop(&server, agent, &token, 1, carrier.clone());
    let mut held = Vec::new();
    for i in 0..REPORTS_PER_SLOT {
        held.push(next_start(&mut starts, &format!("order {}", i + 1)).await);
    }
    let waiting = next_start(&mut starts, "the order whose report waits").await;
    // Its verdict is in at once; it waits for a report permit.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        carrier.held().await,
        REPORTS_PER_SLOT,
        "the held completes' rows are locked"
    );
    shutdown.drain.cancel();
    shutdown.abandon.cancel();
    let entry = server.log_entry(&waiting.to_string(), 10).await;
    assert_eq!(entry["outcome"], "failed", "{entry}");
    assert_eq!(entry["message"], "after the held ones", "{entry}");
    assert_eq!(
        carrier.held().await,
        REPORTS_PER_SLOT,
        "the held completes' rows are still locked"
    );
    carrier.let_go().await;
    for order in held {
        let entry = server.log_entry(&order.to_string(), 10).await;
        assert_eq!(entry["outcome"], "succeeded", "{entry}");
    }
    ends(agent_loop, 10, "the loop ends").await;
}
