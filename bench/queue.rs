//! Queue and pull-API benchmarks (issue: "how fast the queue and the pull API are, against the
//! database's own ceiling"). Prints a table; every figure is also given as a ratio against a
//! baseline measured in the same run, because the machine is shared and noisy.
//!
//!   cargo bench --bench queue                 # all scenarios, default sizes
//!   cargo bench --bench queue -- --quick      # smaller sizes, for a smoke run
//!   cargo bench --bench queue -- sql http     # only these scenarios
//!   cargo bench --bench queue -- --quick sql http batched pull river   # River as the peer (Go)
//!   cargo bench --bench queue -- soak --soak-minutes=3
//!   cargo bench --bench queue -- --quick --guard-http-ratio=0.4   # CI: exit 1 below the ratio, or when (2d) batches less
//!
//! Scenarios: sql (ceiling), http (end to end), unbatched and batched (end to end without any
//! batching, and with multi-claim and group commit), pull (the agents' own pull loop,
//! `pullman::pull`, one agent of 16 slots: bench/pull.rs), wake (long-poll wake-up), backlog (claim cost vs
//! backlog size, reaper sweep), ineligible (claim cost behind older orders no agent may take), soak (the end-to-end run held at a fixed offered load for 10
//! minutes), footprint (server RSS idle and with 1,000 long-polls; executor RSS idle when
//! KUBECONFIG names a reachable cluster), depth (the backlog routes at 1M pending, and what the
//! targeting indexes they use cost each insert), river (River, Go, works the same backlog with 16
//! workers on the same PostgreSQL: bench/river.rs), fair (fair share between tenants: claim cost
//! with many tenants, and a small tenant's wait behind a big one's backlog: bench/fair.rs), keys
//! (what concurrency keys cost a claim: every order keyed, and one hot key ahead of the backlog:
//! bench/keys.rs).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pullman::queue::{self, Queue};
use pullman::testing::{self, TestServer};

use http::Http;
use serde_json::json;
use sqlx::PgPool;

/// The admin token of the in-process server, also given to the `pullman serve` it starts.
const ADMIN: &str = testing::ADMIN_TOKEN;
const AGENTS: usize = 16;

struct Bench {
    quick: bool,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

impl Bench {
    /// Sorted latencies of `samples` single claims (each then completed) by one agent labelled
    /// `bench`, after 50 unmeasured ones (a connection's first claims plan their statements).
    async fn claim_latencies(queue: &Queue, samples: usize) -> Vec<Duration> {
        let agent = testing::register_agent(queue, json!({"name": "b", "labels": ["bench"]})).await;
        let req = queue::ClaimRequest {
            agent_id: agent,
            lease_seconds: None,
        };
        let mut lat = Vec::new();
        let warmup = 50;
        for i in 0..warmup + samples {
            let t0 = Instant::now();
            let o = queue.claim_next(&req, &[]).await.unwrap().unwrap();
            if i >= warmup {
                lat.push(t0.elapsed());
            }
            let done = queue::Completion {
                success: true,
                message: None,
                retryable: true,
                disrupted: false,
            };
            queue
                .complete(o.id, agent, o.claim_id, &done)
                .await
                .unwrap();
        }
        lat.sort();
        lat
    }

    /// (4') Claim p50 and p99 as in (4), the agent's 1,000 orders behind `ahead` older orders
    /// that no agent may take (targeted at a label none has): the hand-out walk tests each of
    /// them against the agent before it reaches one it may take (bench/README.md, issue #35).
    async fn ineligible_ahead(&self, ahead: usize, samples: usize) -> (Duration, Duration) {
        let pool = self.fresh_pool(4).await;
        let queue = Queue::new(pool.clone());
        sqlx::query(
            "INSERT INTO work_orders (id, work_type, yaml_content, max_retries, backoff_seconds, \
             claim_timeout_seconds, max_reclaims, target_labels, status, created_at) \
             SELECT gen_random_uuid(), 'custom', 'x', 3, 60, 3600, 5, ARRAY['elsewhere'], \
               'PENDING', now() - interval '1 day' + make_interval(secs => g / 1000.0) \
             FROM generate_series(1, $1) g",
        )
        .bind(ahead as i64)
        .execute(&pool)
        .await
        .unwrap();
        Self::fill(&pool, 1_000 + samples + 50, 0).await;
        let lat = Self::claim_latencies(&queue, samples).await;
        pool.close().await;
        (percentile(&lat, 0.5), percentile(&lat, 0.99))
    }

    /// A fresh migrated database on the benchmark's PostgreSQL (`pullman::testing`).
    async fn fresh_pool(&self, max: u32) -> PgPool {
        testing::fresh_pool(max).await
    }

    /// Inserts `n` pending orders targeted at label `bench`, oldest first.
    async fn fill(pool: &PgPool, n: usize, log_rows: usize) {
        sqlx::query(
            "INSERT INTO work_orders (id, work_type, yaml_content, max_retries, backoff_seconds, \
             claim_timeout_seconds, max_reclaims, target_labels, status, created_at) \
             SELECT gen_random_uuid(), 'custom', 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n', \
               3, 60, 3600, 5, ARRAY['bench'], 'PENDING', now() - make_interval(secs => ($1 - g) / 1000.0) \
             FROM generate_series(1, $1) g",
        )
        .bind(n as i64)
        .execute(pool)
        .await
        .unwrap();
        if log_rows > 0 {
            sqlx::query(
                "INSERT INTO work_order_log (id, work_type, yaml_content, max_retries, backoff_seconds, \
                 claim_timeout_seconds, max_reclaims, targeting, outcome, retry_count, reclaim_count, \
                 source, ended_by, created_at, completed_at) \
                 SELECT gen_random_uuid(), 'custom', 'x', 3, 60, 3600, 5, '{}', 'succeeded', 0, 0, 'api', \
                   'agent', now(), now() - make_interval(secs => g) FROM generate_series(1, $1) g",
            )
            .bind(log_rows as i64)
            .execute(pool)
            .await
            .unwrap();
        }
        sqlx::query("VACUUM ANALYZE").execute(pool).await.unwrap();
    }

    /// (1) The ceiling: the claim + complete cycle as two bare statements over 16 connections.
    async fn sql_ceiling(&self, orders: usize) -> f64 {
        let pool = self.fresh_pool(AGENTS as u32 + 2).await;
        Self::fill(&pool, orders, 0).await;
        let agent = uuid::Uuid::new_v4();
        let done = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..AGENTS {
            let (pool, done) = (pool.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let claimed: Option<(uuid::Uuid,)> = sqlx::query_as(
                        "WITH picked AS (SELECT id FROM work_orders WHERE status IN ('PENDING', 'RETRY_PENDING') \
                           AND status = 'PENDING' AND target_labels && ARRAY['bench'] \
                           ORDER BY created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED), \
                         c AS (INSERT INTO work_order_claims (work_order_id, claim_id, agent_id, claimed_at, deadline) \
                           SELECT id, gen_random_uuid(), $1, now(), now() + interval '1 hour' FROM picked RETURNING work_order_id) \
                         UPDATE work_orders w SET status = 'CLAIMED' FROM c WHERE w.id = c.work_order_id RETURNING w.id",
                    )
                    .bind(agent)
                    .fetch_optional(&pool)
                    .await
                    .unwrap();
                    let Some((id,)) = claimed else { return };
                    sqlx::query(
                        "WITH c AS (DELETE FROM work_order_claims WHERE work_order_id = $1 AND agent_id = $2 RETURNING *), \
                         w AS (DELETE FROM work_orders o USING c WHERE o.id = c.work_order_id RETURNING o.*) \
                         INSERT INTO work_order_log (id, work_type, yaml_content, max_retries, backoff_seconds, \
                           claim_timeout_seconds, max_reclaims, targeting, outcome, retry_count, reclaim_count, \
                           claimed_by, source, ended_by, created_at) \
                         SELECT id, work_type, yaml_content, max_retries, backoff_seconds, claim_timeout_seconds, \
                           max_reclaims, '{}', 'succeeded', retry_count, reclaim_count, $2, source, 'agent', created_at FROM w",
                    )
                    .bind(id)
                    .bind(agent)
                    .execute(&pool)
                    .await
                    .unwrap();
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let rate = done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
        pool.close().await;
        rate
    }

    /// Scenario 1 measured and printed as its table row; returns orders/s.
    async fn ceiling_row(&self, orders: usize) -> f64 {
        let c = self.sql_ceiling(orders).await;
        println!(
            "| 1. SQL ceiling: claim+complete, 16 connections, {orders} orders | {c:.0} orders/s | baseline |"
        );
        c
    }

    /// Scenario 2 measured and printed as its table row against `ceiling`; returns orders/s and
    /// orders a claim commit.
    async fn http_row(&self, orders: usize, ceiling: f64) -> (f64, f64) {
        let (rate, lat, per_commit) = self.http_end_to_end(orders).await;
        println!(
            "| 2. HTTP end to end: 16 agents, claim-next+complete (group commit and group claims on, as serve runs), {orders} backlog | {rate:.0} orders/s; claim p50 {} p99 {}; {per_commit:.1} claims a commit | {:.2} × ceiling |",
            ms(percentile(&lat, 0.5)),
            ms(percentile(&lat, 0.99)),
            rate / ceiling
        );
        (rate, per_commit)
    }

    /// The API server in-process over a fresh database, as the tests start it.
    async fn server(&self, max_conns: u32, max_long_polls: usize) -> TestServer {
        TestServer::start_with(max_conns, max_long_polls).await
    }

    /// (3) 64 agents long-polling an empty queue; orders inserted one at a time at a steady rate;
    /// time from the insert's commit to the claim response.
    async fn wake_up(&self, count: usize) -> Vec<Duration> {
        let server = self.server(80, 1024).await;
        let (base, queue) = (server.base.clone(), server.queue.clone());
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(128)
            .build()
            .unwrap();
        let committed: Arc<std::sync::Mutex<std::collections::HashMap<String, Instant>>> =
            Default::default();
        let lat: Arc<std::sync::Mutex<Vec<Duration>>> = Default::default();
        let remaining = Arc::new(AtomicUsize::new(count));
        let mut tasks = Vec::new();
        for i in 0..64 {
            let (id, token) = Self::agent(&http, &base, &format!("waiter-{i}")).await;
            let (http, base, committed, lat, remaining) = (
                http.clone(),
                base.clone(),
                committed.clone(),
                lat.clone(),
                remaining.clone(),
            );
            tasks.push(tokio::spawn(async move {
                while remaining.load(Ordering::Relaxed) > 0 {
                    let r = http
                        .post(format!("{base}/api/v1/agents/{id}/claim"))
                        .bearer_auth(&token)
                        .json(&json!({"max_wait_seconds": 5}))
                        .send()
                        .await
                        .unwrap();
                    if r.status().as_u16() != 200 {
                        continue;
                    }
                    let got = Instant::now();
                    let order: serde_json::Value = r.json().await.unwrap();
                    let oid = order["id"].as_str().unwrap().to_string();
                    // The inserter records the commit time right after commit returns.
                    loop {
                        if let Some(t) = committed.lock().unwrap().get(&oid) {
                            lat.lock().unwrap().push(got.saturating_duration_since(*t));
                            break;
                        }
                        tokio::task::yield_now().await;
                    }
                    remaining.fetch_sub(1, Ordering::Relaxed);
                }
            }));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let spec = queue::validate::validate_work_order(serde_json::from_value(json!({
            "work_type": "custom", "yaml_content": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
            "targeting": {"labels": ["bench"]}})).unwrap()).unwrap();
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        for _ in 0..count {
            tick.tick().await;
            let id = uuid::Uuid::new_v4();
            // Commit time is taken when the insert's transaction has committed.
            let before = Instant::now();
            queue.create_work_order(&spec, id, "bench").await.unwrap();
            let _ = before;
            committed
                .lock()
                .unwrap()
                .insert(id.to_string(), Instant::now());
        }
        for t in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
        drop(server);
        let mut l = lat.lock().unwrap().clone();
        l.sort();
        l
    }

    /// (4) Claim latency (p99 of single claims, one agent) with `pending` orders and `log` rows,
    /// and the reaper's sweep time with nothing to reap.
    /// Returns claim p50, claim p99 and the median sweep.
    async fn backlog(
        &self,
        pending: usize,
        log: usize,
        samples: usize,
    ) -> (Duration, Duration, Duration) {
        let pool = self.fresh_pool(4).await;
        let queue = Queue::new(pool.clone());
        Self::fill(&pool, pending, log).await;
        let lat = Self::claim_latencies(&queue, samples).await;
        let mut sweeps = Vec::new();
        for _ in 0..20 {
            let t0 = Instant::now();
            queue.maintain().await.unwrap();
            sweeps.push(t0.elapsed());
        }
        sweeps.sort();
        pool.close().await;
        (
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
            percentile(&sweeps, 0.5),
        )
    }
}

mod depth;
mod fair;
mod footprint;
mod guard;
mod http;
mod keys;
mod pull;
mod river;
mod soak;

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).map(|l| {
                l.split_whitespace()
                    .nth(1)
                    .unwrap_or("0")
                    .parse()
                    .unwrap_or(0)
            })
        })
        .unwrap_or(0)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    // `cargo test --all-targets` also runs this binary, built without optimizations: figures from
    // such a build mean nothing, so it only says how to run it.
    if cfg!(debug_assertions) {
        println!("benchmarks run optimized: cargo bench --bench queue");
        return;
    }
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let quick = args.iter().any(|a| a == "--quick");
    let soak_minutes: Option<u64> = args
        .iter()
        .find_map(|a| a.strip_prefix("--soak-minutes="))
        .map(|m| m.parse().expect("--soak-minutes=N takes whole minutes"));
    let wanted: Vec<&str> = args
        .iter()
        .filter(|a| !a.starts_with("--"))
        .map(String::as_str)
        .collect();
    let run = |s: &str| wanted.is_empty() || wanted.contains(&s);
    let guard: Option<f64> = args
        .iter()
        .find_map(|a| a.strip_prefix("--guard-http-ratio="))
        .map(|r| {
            r.parse()
                .expect("--guard-http-ratio=R takes a ratio such as 0.4")
        });
    // The process's PostgreSQL (`fsync=on`, default settings), one database per scenario.
    testing::server_url();
    let b = Bench { quick };
    let orders = if b.quick { 10_000 } else { 100_000 };
    println!(
        "Pullman queue benchmarks ({} cores, {} mode)\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        if quick { "quick" } else { "full" }
    );
    println!("| scenario | figure | ratio / target |");
    println!("|---|---|---|");
    if let Some(min) = guard {
        let http = guard::http_ratio(&b, orders, min).await;
        let batching = guard::batching(&b, orders).await;
        std::process::exit(http.max(batching));
    }
    let mut ceiling = None;
    // Printed after the table.
    let mut notes: Vec<String> = Vec::new();
    if ["sql", "http", "unbatched", "batched", "pull", "river"]
        .into_iter()
        .any(run)
    {
        ceiling = Some(b.ceiling_row(orders).await);
    }
    let mut http_rate = None;
    let mut batched_rate = None;
    if run("http") {
        let c = ceiling.unwrap();
        http_rate = Some(b.http_row(orders, c).await.0);
    }
    if run("unbatched") || run("batched") {
        let c = ceiling.unwrap();
        for (name, label, setup, target) in [
            (
                "unbatched",
                "2b. HTTP, nothing batched (--complete-batch 1 --claim-batch 1, one order per claim), 16 agents",
                Http::UNBATCHED,
                "target ≥ 0.7",
            ),
            (
                "batched",
                "2c. HTTP batched: 4 agents × 4 slots, multi-claim + group commit",
                Http::BATCHED,
                "",
            ),
        ] {
            if !run(name) {
                continue;
            }
            let (rate, lat, per_commit) = b.http_scenario(orders, setup).await;
            if name == "batched" {
                batched_rate = Some(rate);
            }
            println!(
                "| {label}, {orders} backlog | {rate:.0} orders/s; claim p50 {} p99 {}; {per_commit:.1} orders a claim commit | {:.2} × ceiling {target} |",
                ms(percentile(&lat, 0.5)),
                ms(percentile(&lat, 0.99)),
                rate / c
            );
        }
    }
    let mut pull_rate = None;
    if run("pull") {
        let c = ceiling.unwrap();
        let (rate, batching) = b.pull_loops(orders, 1, AGENTS).await;
        pull_rate = Some(rate);
        println!(
            "| 2d. The agents' own pull loop (pullman::pull, as worker and executor run it, work that returns at once): 1 agent × 16 slots, {orders} backlog | {rate:.0} orders/s; {:.1} orders a claim, {:.1} completes a request, {:.1} completes a commit | {:.2} × ceiling |",
            batching.per_claim,
            batching.per_request,
            batching.per_commit,
            rate / c
        );
    }
    if run("river") {
        let mut pullman: Vec<(&str, f64)> = http_rate.map(|r| ("2", r)).into_iter().collect();
        pullman.extend(batched_rate.map(|r| ("2c", r)));
        pullman.extend(pull_rate.map(|r| ("2d", r)));
        river::run(orders, ceiling, &pullman).await;
    }
    if run("wake") {
        let n = if b.quick { 100 } else { 400 };
        let lat = b.wake_up(n).await;
        println!(
            "| 3. Wake-up: 64 long-polls, {n} inserts at 20/s | p50 {} p99 {} ({} samples) | p99 target < 50 ms |",
            ms(percentile(&lat, 0.5)),
            ms(percentile(&lat, 0.99)),
            lat.len()
        );
    }
    if run("backlog") {
        let sizes: &[usize] = if b.quick {
            &[1_000, 100_000]
        } else {
            &[1_000, 100_000, 1_000_000]
        };
        let mut base = None;
        for &n in sizes {
            let log = if n >= 1_000_000 { 1_000_000 } else { 0 };
            let (p50, p99, sweep) = b.backlog(n, log, 500).await;
            let ratio = base
                .map(|b: Duration| p99.as_secs_f64() / b.as_secs_f64())
                .unwrap_or(1.0);
            base.get_or_insert(p99);
            println!(
                "| 4. Backlog: {n} pending{} | claim p50 {} p99 {}; reaper sweep {} | p99 {ratio:.2} × 1k (target ≤ 1.5; sweep < 10 ms) |",
                if log > 0 {
                    format!(" + {log} log rows")
                } else {
                    String::new()
                },
                ms(p50),
                ms(p99),
                ms(sweep)
            );
        }
    }
    if run("ineligible") {
        let sizes: &[usize] = if b.quick {
            &[0, 1_000, 10_000]
        } else {
            &[0, 1_000, 10_000, 100_000]
        };
        let mut base = None;
        for &n in sizes {
            let (p50, p99) = b.ineligible_ahead(n, 300).await;
            let ratio = p99.as_secs_f64() / base.get_or_insert(p99).as_secs_f64();
            println!(
                "| 4'. Claim behind {n} older orders no agent may take | claim p50 {} p99 {} | p99 {ratio:.2} × none ahead |",
                ms(p50),
                ms(p99)
            );
        }
    }
    if run("soak") {
        let minutes = soak_minutes.unwrap_or(if b.quick { 2 } else { 10 });
        notes.extend(soak::run(&b, orders, minutes, http_rate).await);
    }
    if run("footprint") {
        footprint::run(&b).await;
    }
    if run("fair") {
        fair::run(&b).await;
    }
    if run("keys") {
        keys::run(&b).await;
    }
    if run("depth") {
        depth::run(&b).await;
    }
    if !notes.is_empty() {
        println!();
        for line in notes {
            println!("{line}");
        }
    }
}
