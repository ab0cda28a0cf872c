//! (2) HTTP end to end: agents over HTTP with keep-alive claim and complete until the backlog is
//! gone, against the API server in-process (`pullman::testing::TestServer`), set up as [`Http`]
//! says: as `serve` runs by default, with nothing batched, or with multi-claim and group commit.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pullman::testing::TestServer;
use serde_json::json;

use super::{ADMIN, AGENTS, Bench};

/// How an end-to-end HTTP run is set up: the server's group commit, the agents, and how many
/// orders each carries at once.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Http {
    /// `serve --complete-batch` (1: every complete its own statement and commit, and every
    /// claim too: the test server turns group claims off with it, `testing::TestServer`).
    pub(crate) complete_batch: usize,
    /// Agents claiming at once (at most [`AGENTS`]).
    pub(crate) agents: usize,
    /// Orders each agent claims per request (`max_orders` when above 1) and completes at once.
    pub(crate) slots: usize,
}

impl Http {
    /// As `serve` runs by default: group commit and group claims on, 16 agents taking one order
    /// at a time.
    pub(crate) const DEFAULT: Http = Http {
        complete_batch: pullman::queue::limits::COMPLETE_BATCH_DEFAULT as usize,
        agents: AGENTS,
        slots: 1,
    };
    /// Nothing batched: one order per claim, one claim and one complete per statement and
    /// commit.
    pub(crate) const UNBATCHED: Http = Http {
        complete_batch: 1,
        ..Http::DEFAULT
    };
    /// 16 slots as 4 agents of 4, each claiming its free slots in one request (multi-claim) and
    /// completing them together (group commit): the same 16 at work as River's 16 workers.
    pub(crate) const BATCHED: Http = Http {
        agents: 4,
        slots: 4,
        ..Http::DEFAULT
    };
}

impl Bench {
    pub(crate) async fn agent(http: &reqwest::Client, base: &str, name: &str) -> (String, String) {
        let v: serde_json::Value = http
            .post(format!("{base}/api/v1/agents"))
            .bearer_auth(ADMIN)
            .json(&json!({"name": name, "labels": ["bench"]}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        (
            v["agent"]["id"].as_str().unwrap().into(),
            v["token"].as_str().unwrap().into(),
        )
    }

    /// A keep-alive HTTP client and [`AGENTS`] agents named `<prefix>-<i>`, labelled `bench`.
    pub(crate) async fn agents(
        base: &str,
        prefix: &str,
    ) -> (reqwest::Client, Vec<(String, String)>) {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()
            .unwrap();
        let mut creds = Vec::new();
        for i in 0..AGENTS {
            creds.push(Self::agent(&http, base, &format!("{prefix}-{i}")).await);
        }
        (http, creds)
    }

    /// One claim-next (no wait) + successful complete over HTTP as agent `id`. Returns the claim
    /// latency, or `None` when nothing was left to claim.
    pub(crate) async fn cycle(
        http: &reqwest::Client,
        base: &str,
        id: &str,
        token: &str,
    ) -> Option<Duration> {
        let t0 = Instant::now();
        let r = http
            .post(format!("{base}/api/v1/agents/{id}/claim"))
            .bearer_auth(token)
            .body("")
            .send()
            .await
            .unwrap();
        if r.status().as_u16() == 204 {
            return None;
        }
        assert_eq!(r.status().as_u16(), 200);
        let order: serde_json::Value = r.json().await.unwrap();
        let latency = t0.elapsed();
        Self::complete(http, base, id, token, &order).await;
        Some(latency)
    }

    /// (2) 16 agents over HTTP with keep-alive, claim-next + complete, against a server as
    /// `serve` runs by default (group commit and group claims on). Returns what
    /// [`Self::http_scenario`] returns.
    pub(crate) async fn http_end_to_end(&self, orders: usize) -> (f64, Vec<Duration>, f64) {
        self.http_scenario(orders, Http::DEFAULT).await
    }

    /// An end-to-end run of `setup` over HTTP with keep-alive: each agent claims (up to its
    /// slots, with `max_orders` when it has more than one) and completes what it got
    /// concurrently, until the backlog is gone. Returns (orders/s, claim latencies sorted,
    /// orders a claim commit): the last is 1.0 when every claim commits alone, more when the
    /// server's group claims (or multi-claims) put several in one transaction, whose claims
    /// share its `now()` as `claimed_at`.
    pub(crate) async fn http_scenario(
        &self,
        orders: usize,
        setup: Http,
    ) -> (f64, Vec<Duration>, f64) {
        let server = TestServer::start_with_batch(40, 1024, setup.complete_batch).await;
        let base = server.base.clone();
        Self::fill(&server.pool, orders, 0).await;
        let (http, creds) = Self::agents(&base, "bench").await;
        let started = Instant::now();
        let done = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for (id, token) in creds.into_iter().take(setup.agents) {
            let (http, base, done) = (http.clone(), base.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                while let Some((latency, n)) =
                    Bench::cycle_many(&http, &base, &id, &token, setup.slots).await
                {
                    lat.push(latency);
                    done.fetch_add(n, Ordering::Relaxed);
                }
                lat
            }));
        }
        let mut lat = Vec::new();
        for t in tasks {
            lat.extend(t.await.unwrap());
        }
        let rate = done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
        lat.sort();
        let (per_commit,): (f64,) = sqlx::query_as(
            "SELECT count(*)::float8 / greatest(count(DISTINCT claimed_at), 1) FROM work_order_log",
        )
        .fetch_one(&server.pool)
        .await
        .unwrap();
        drop(server);
        (rate, lat, per_commit)
    }

    /// One claim-next for up to `slots` orders (no wait; `max_orders` when `slots` > 1), then a
    /// successful complete of each, sent together. Returns the claim latency and the orders
    /// completed, or `None` when nothing was left to claim.
    pub(crate) async fn cycle_many(
        http: &reqwest::Client,
        base: &str,
        id: &str,
        token: &str,
        slots: usize,
    ) -> Option<(Duration, usize)> {
        if slots <= 1 {
            return Self::cycle(http, base, id, token).await.map(|l| (l, 1));
        }
        let t0 = Instant::now();
        let r = http
            .post(format!("{base}/api/v1/agents/{id}/claim"))
            .bearer_auth(token)
            .json(&json!({"max_orders": slots}))
            .send()
            .await
            .unwrap();
        if r.status().as_u16() == 204 {
            return None;
        }
        assert_eq!(r.status().as_u16(), 200);
        let answer: serde_json::Value = r.json().await.unwrap();
        let latency = t0.elapsed();
        let orders = answer["orders"].as_array().unwrap();
        let completes = orders
            .iter()
            .map(|order| Self::complete(http, base, id, token, order));
        futures::future::join_all(completes).await;
        Some((latency, orders.len()))
    }

    /// A successful complete of `order` (as claimed) by agent `id`; panics unless it is `200`.
    async fn complete(
        http: &reqwest::Client,
        base: &str,
        id: &str,
        token: &str,
        order: &serde_json::Value,
    ) {
        let oid = order["id"].as_str().unwrap();
        let r = http
            .post(format!("{base}/api/v1/work-orders/{oid}/complete"))
            .bearer_auth(token)
            .json(&json!({"agent_id": id, "claim_id": order["claim_id"], "success": true}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
    }
}
