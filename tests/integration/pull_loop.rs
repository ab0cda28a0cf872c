//! The agents' pull loop (`pullman::pull::run`, what `pullman worker` and the executor run)
//! against a real server: an order gives its slot back once its verdict is in, so the next order
//! starts while it reports, and the reports waiting are bounded by the slots (`pull::order::Slot`,
//! issue #34).

use std::sync::Arc;
use std::time::Duration;

use pullman::client::Client;
use pullman::pull::{self, Carrier, LoopConfig, Shutdown, Verdict};
use pullman::testing::{TestServer, eventually};
use pullman::wire::WorkOrder;
use serde_json::json;
use sqlx::{PgPool, Postgres, Transaction};
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Says which orders it starts; the first order it finishes has its row locked in a transaction
/// the test holds, so that order's complete waits at the database until the test lets go (or,
/// with `release_after`, until that much later).
struct HoldsFirstReport {
    started: mpsc::UnboundedSender<Uuid>,
    pool: PgPool,
    lock: Arc<Mutex<Option<Transaction<'static, Postgres>>>>,
    locked_once: std::sync::atomic::AtomicBool,
    release_after: Option<Duration>,
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
        if !self
            .locked_once
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            let mut tx = self.pool.begin().await.unwrap();
            sqlx::query("SELECT id FROM work_orders WHERE id = $1 FOR UPDATE")
                .bind(order.id)
                .execute(&mut *tx)
                .await
                .unwrap();
            *self.lock.lock().await = Some(tx);
            if let Some(after) = self.release_after {
                let lock = self.lock.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    if let Some(tx) = lock.lock().await.take() {
                        tx.rollback().await.unwrap();
                    }
                });
            }
        }
        Verdict::Success {
            message: "done".into(),
        }
    }
}

/// One slot, three orders. The first order's complete is held at the database: the second
/// order starts meanwhile (its slot was given back when the first's verdict was in); its own
/// report waits for the one report permit, so it keeps its slot and the third order is not
/// claimed (the agent holds two claims, not more); once the first complete goes through, the
/// third order runs, and every order is in the log once, succeeded.
impl HoldsFirstReport {
    /// The carrier, on `server`'s database, and the ids of the orders it starts, in order.
    fn new(
        server: &TestServer,
        release_after: Option<Duration>,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<Uuid>) {
        let (started, starts) = mpsc::unbounded_channel();
        let carrier = Arc::new(HoldsFirstReport {
            started,
            pool: server.pool.clone(),
            lock: Default::default(),
            locked_once: Default::default(),
            release_after,
        });
        (carrier, starts)
    }

    /// Lets the held complete through: rolls back the transaction that locks the first
    /// order's row.
    async fn let_go(&self) {
        let held = self.lock.lock().await.take().expect("a held report");
        held.rollback().await.unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_is_given_back_when_the_verdict_is_in_and_reports_waiting_are_bounded() {
    let server = TestServer::start().await;
    let (agent_id, token, orders) = agent_with_orders(&server, "pull-loop", json!({}), 3).await;
    let (carrier, mut starts) = HoldsFirstReport::new(&server, None);
    let (shutdown, agent_loop) = one_slot_loop(&server, agent_id, &token, 1, carrier.clone());

    let first = next_start(&mut starts, "the first order").await;
    let second = next_start(
        &mut starts,
        "the second order (while the first's complete waits at the database)",
    )
    .await;
    assert_ne!(first, second);
    assert!(
        carrier.lock.lock().await.is_some(),
        "the first order's row is held"
    );

    // The second order's report waits for the first's: it keeps its slot, so nothing more is
    // claimed. Watched for 1.5 s: a third claim would come within milliseconds.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        starts.try_recv().is_err(),
        "a third order started while two reports were waiting"
    );
    let (held,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM work_order_claims WHERE agent_id = $1")
            .bind(agent_id)
            .fetch_one(&server.pool)
            .await
            .unwrap();
    assert_eq!(held, 2, "the agent holds the two orders reporting, no more");

    // Let the first complete through: the third order runs.
    carrier.let_go().await;
    let third = next_start(&mut starts, "the third order").await;
    assert!(![first, second].contains(&third));

    eventually(10, "every order in the log", || {
        let pool = server.pool.clone();
        async move {
            let (n,): (i64,) = sqlx::query_as(
                "SELECT count(*) FROM work_order_log WHERE outcome = 'succeeded' AND id = ANY($1)",
            )
            .bind([first, second, third].into_iter().collect::<Vec<Uuid>>())
            .fetch_one(&pool)
            .await
            .unwrap();
            (n == 3).then_some(())
        }
    })
    .await;
    let ids: Vec<String> = [first, second, third].iter().map(Uuid::to_string).collect();
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
    let (carrier, _starts) = HoldsFirstReport::new(&server, Some(Duration::from_secs(2)));
    let (shutdown, agent_loop) = one_slot_loop(&server, agent, &token, 30, carrier);
    for order in &orders {
        let entry = server.log_entry(order, 10).await;
        assert_eq!(entry["outcome"], "succeeded", "{entry}");
    }
    shutdown.drain.cancel();
    ends(agent_loop, 35, "the loop drains").await;
}

/// The second signal while an order waits for its turn to report: its verdict is reported at
/// once (without waiting for a report permit), not thrown away. One slot; the first order's
/// complete is held at the database, the second order's verdict is in and waits behind it; then
/// both signals. The second order reaches the log while the first is still held; once let go,
/// the first does too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_signal_reports_a_verdict_that_waits_for_its_turn() {
    let server = TestServer::start().await;
    let (agent, token, _) = agent_with_orders(&server, "signal-loop", json!({}), 2).await;
    let (carrier, mut starts) = HoldsFirstReport::new(&server, None);
    let (shutdown, agent_loop) = one_slot_loop(&server, agent, &token, 1, carrier.clone());
    let first = next_start(&mut starts, "the first order").await;
    let second = next_start(&mut starts, "the second order").await;
    // The second order's verdict is in at once; it waits for the first's report.
    tokio::time::sleep(Duration::from_millis(300)).await;
    shutdown.drain.cancel();
    shutdown.abandon.cancel();
    let entry = server.log_entry(&second.to_string(), 10).await;
    assert_eq!(entry["outcome"], "succeeded", "{entry}");
    assert!(
        carrier.lock.lock().await.is_some(),
        "the first order's row is still held"
    );
    carrier.let_go().await;
    let entry = server.log_entry(&first.to_string(), 10).await;
    assert_eq!(entry["outcome"], "succeeded", "{entry}");
    ends(agent_loop, 10, "the loop ends").await;
}
