//! (2d) The agents' own pull loop: `pullman::pull::run`, the loop `pullman worker` and
//! `pullman executor` run, with a carrier whose work returns at once, against the API server
//! in-process. Where (2) and (2c) are clients written for the bench, this is the product's agent:
//! it claims every free slot in one request (`max_orders`), carries each order out in its own
//! task, and frees the slot once the order's complete is answered, so slots refill one by one
//! while others report, as River's 16 workers do.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use pullman::client::Client;
use pullman::pull::{self, Carrier, LoopConfig, Shutdown, Verdict};
use pullman::testing::TestServer;
use pullman::wire::WorkOrder;
use tokio_util::sync::CancellationToken;

use super::Bench;

/// A carrier whose work is done as soon as it starts; it counts the orders it was given, so the
/// run can drain the agents once every order of the backlog was handed out.
struct Noop {
    given: Arc<AtomicUsize>,
    all: usize,
    drain: CancellationToken,
}

impl Carrier for Noop {
    type Started = ();

    async fn start(&self, _order: &WorkOrder, _stop: &CancellationToken) -> Result<(), Verdict> {
        if self.given.fetch_add(1, Ordering::Relaxed) + 1 >= self.all {
            // Every order was handed out: stop claiming; the loops return once the running
            // orders' completes are answered.
            self.drain.cancel();
        }
        Ok(())
    }

    async fn finish(
        &self,
        _order: &WorkOrder,
        _: (),
        _stop: &CancellationToken,
        _: &pull::Progress,
    ) -> Verdict {
        Verdict::Success {
            message: String::new(),
        }
    }
}

impl Bench {
    /// (2d) `agents` pull loops of `slots` slots each (`LoopConfig::concurrency`) work a backlog
    /// of `orders` against a server as `serve` runs by default. Returns orders/s, from the start
    /// of the loops until the last complete was answered, and how the orders were batched;
    /// panics unless every order of the backlog is in the log as succeeded.
    pub(crate) async fn pull_loops(
        &self,
        orders: usize,
        agents: usize,
        slots: usize,
    ) -> (f64, Batching) {
        let server = TestServer::start_with_batch(
            40,
            1024,
            pullman::queue::limits::COMPLETE_BATCH_DEFAULT as usize,
        )
        .await;
        let base = server.base.clone();
        Self::fill(&server.pool, orders, 0).await;
        let (_, creds) = Self::agents(&base, "pull").await;
        let shutdown = Shutdown::default();
        let carrier = Arc::new(Noop {
            given: Arc::default(),
            all: orders,
            drain: shutdown.drain.clone(),
        });
        let started = Instant::now();
        let mut loops = Vec::new();
        for (id, token) in creds.into_iter().take(agents) {
            let client = Client::new(&base, &token).unwrap();
            let config = LoopConfig {
                agent_id: id.parse().unwrap(),
                work_types: Vec::new(),
                lease_seconds: 300,
                concurrency: slots,
                max_wait_seconds: 1,
                heartbeat_every: None,
            };
            let (carrier, shutdown) = (carrier.clone(), shutdown.clone());
            loops.push(tokio::spawn(pull::run(client, config, carrier, shutdown)));
        }
        for l in loops {
            l.await.unwrap().unwrap();
        }
        let seconds = started.elapsed().as_secs_f64();
        let (logged,): (i64,) =
            sqlx::query_as("SELECT count(*) FROM work_order_log WHERE outcome = 'succeeded'")
                .fetch_one(&server.pool)
                .await
                .unwrap();
        assert_eq!(
            logged as usize, orders,
            "the pull loops finished with orders missing from the log"
        );
        // The orders of one claim share its claimed_at, those of one commit their completed_at
        // (both the transaction's now()).
        let (claims, commits): (i64, i64) = sqlx::query_as(
            "SELECT count(DISTINCT claimed_at), count(DISTINCT completed_at) FROM work_order_log",
        )
        .fetch_one(&server.pool)
        .await
        .unwrap();
        // Every report went in one request that succeeded (no fault here): a batch complete or a
        // single one, each answered 200 (success).
        let requests: u64 = [
            "/api/v1/agents/{id}/complete",
            "/api/v1/work-orders/{id}/complete",
        ]
        .into_iter()
        .map(|route| {
            let labels = pullman::telemetry::HttpLabels {
                method: "POST".into(),
                route: route.into(),
                status: 200,
            };
            server.metrics.http_requests.get_or_create(&labels).get()
        })
        .sum();
        drop(server);
        let batching = Batching {
            per_claim: orders as f64 / claims.max(1) as f64,
            per_commit: orders as f64 / commits.max(1) as f64,
            per_request: orders as f64 / requests.max(1) as f64,
        };
        (orders as f64 / seconds, batching)
    }
}

/// How a (2d) run batched its orders: orders per claim-next, completes per commit and completes
/// per request (batch complete, `pull::report`), on average.
pub(crate) struct Batching {
    pub(crate) per_claim: f64,
    pub(crate) per_commit: f64,
    pub(crate) per_request: f64,
}
