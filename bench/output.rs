//! Output of running orders (docs/design.md §9, issues #24 and #35): how fast a line reaches a
//! follower, what output costs claims, the server's memory under 1 GiB of output, what is stored
//! of one-byte lines against the cap, 100 followers of one order, and what 1,000 idle followers
//! cost the database and claims.
//!
//!   cargo bench --bench output                # all of them, default sizes
//!   cargo bench --bench output -- --quick     # smaller sizes, for a smoke run
//!   cargo bench --bench output -- c e         # only the scenarios named
//!   cargo bench --bench output -- e --secs=90 # longer measuring windows (default 10, quick 3; (e) 61+)
//!
//! The server runs in-process over the shared throwaway PostgreSQL (`pullman::testing`). In (a)
//! and (b) the lines go through the worker's own sender (`pull::output::OutputSender`, in this
//! process rather than `pullman worker` processes); (b') posts the same lines as synthetic agents
//! sending ten chunks a second, ten times the worker's requests; (c) and (d) post chunks
//! directly. Followers read `?follow=true` over HTTP. Figures are printed as ratios against a
//! baseline measured in the same run.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pullman::api::OutputSettings;
use pullman::pull::output::{
    DEFAULT_BUFFER_BYTES, FLUSH_TIMEOUT, OutputConfig, OutputSender, Redactor,
};
use pullman::testing::{ADMIN_TOKEN, TestServer, configmap_order};
use reqwest::Method;
use serde_json::{Value, json};

const SENDERS: usize = 16;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4
}

/// An agent with `label` holding a claim on a fresh order: (agent, token, order, claim).
async fn claimed(s: &TestServer, label: &str) -> (String, String, String, String) {
    let (agent, token) = s.agent(json!({"name": label, "labels": [label]})).await;
    let order = s.order(configmap_order(label)).await;
    let (_, v) = s
        .call(
            Method::POST,
            &format!("/api/v1/agents/{agent}/claim"),
            Some(&token),
            Some(json!({"max_wait_seconds": 5})),
        )
        .await;
    let claim = v["claim_id"].as_str().unwrap().to_string();
    (agent, token, order, claim)
}

/// Posts one chunk, retrying on 429/503 after a short pause as an agent would.
async fn post(http: &reqwest::Client, url: &str, token: &str, body: &Value) {
    loop {
        let r = http.post(url).bearer_auth(token).json(body).send().await;
        match r {
            Ok(r) if r.status().is_success() => return,
            Ok(r) if r.status().as_u16() == 409 => return,
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Sends `per_second` lines a second in 10 chunks a second until `stop`; each text carries
/// the microseconds since `epoch` when it was sent.
async fn sender(
    s: Arc<TestServer>,
    label: String,
    per_second: usize,
    epoch: Instant,
    stop: Arc<AtomicBool>,
) -> (String, String, String, String) {
    let (agent, token, order, claim) = claimed(&s, &label).await;
    let url = s.url(&format!("/api/v1/work-orders/{order}/output"));
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut seq = 0i64;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let sent = epoch.elapsed().as_micros();
        let lines: Vec<Value> = (0..per_second / 10)
            .map(|i| json!({"stream": "stdout", "text": format!("{sent} line {i} of a benchmark sender, padded to a typical log line length"), "at": chrono::Utc::now()}))
            .collect();
        let body = json!({"agent_id": agent, "claim_id": claim, "seq": seq, "lines": lines});
        post(&s.http, &url, &token, &body).await;
        seq += 1;
    }
    (agent, token, order, claim)
}

/// Prints `per_second` lines a second (a tenth every 100 ms) through the worker's own sender
/// (`pull::output::OutputSender`: redaction, batching, at least one chunk a second) until `stop`;
/// each text starts with the microseconds since `epoch` when it was printed. Returns the claim
/// (agent, token, order, claim), its output all delivered.
async fn worker_sender(
    s: Arc<TestServer>,
    label: String,
    per_second: usize,
    epoch: Instant,
    stop: Arc<AtomicBool>,
) -> (String, String, String, String) {
    let (agent, token, order, claim) = claimed(&s, &label).await;
    let config = OutputConfig {
        client: pullman::client::Client::new(&s.base, &token).unwrap(),
        agent_id: agent.parse().unwrap(),
        buffer_bytes: DEFAULT_BUFFER_BYTES,
        redactor: Redactor::new([token.clone()]),
    };
    let out = OutputSender::start(&config, order.parse().unwrap(), claim.parse().unwrap(), 0);
    let lines = out.handle();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        for i in 0..per_second / 10 {
            let printed = epoch.elapsed().as_micros();
            lines.push(
                "stdout",
                &format!(
                    "{printed} line {i} of a benchmark worker, padded to a typical log line length"
                ),
                chrono::Utc::now(),
            )
            .await;
        }
    }
    out.finish(FLUSH_TIMEOUT).await;
    (agent, token, order, claim)
}

/// Follows `order` to its end; records, per line, the microseconds from send to receipt.
async fn follower(
    base: String,
    order: String,
    epoch: Instant,
    latencies: Option<Arc<std::sync::Mutex<Vec<f64>>>>,
) -> Vec<String> {
    let mut r = reqwest::Client::new()
        .get(format!(
            "{base}/api/v1/work-orders/{order}/output?follow=true"
        ))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    let mut pending = Vec::new();
    let mut texts = Vec::new();
    while let Some(chunk) = r.chunk().await.unwrap() {
        let now = epoch.elapsed().as_micros() as f64;
        pending.extend_from_slice(&chunk);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let v: Value = serde_json::from_slice(&line).unwrap();
            let text = v["text"].as_str().unwrap().to_string();
            if let Some(l) = &latencies
                && let Some(sent) = text.split(' ').next().and_then(|t| t.parse::<f64>().ok())
            {
                l.lock().unwrap().push((now - sent) / 1000.0);
            }
            texts.push(text);
        }
    }
    texts
}

async fn complete(s: &TestServer, token: &str, order: &str, agent: &str, claim: &str) {
    s.call(
        Method::POST,
        &format!("/api/v1/work-orders/{order}/complete"),
        Some(token),
        Some(json!({"agent_id": agent, "claim_id": claim, "success": true})),
    )
    .await;
}

/// (a) 16 workers × 100 lines/s, one follower each: printed-to-seen latency (the worker sends at
/// least once a second, so up to a second of it is the batching).
async fn latency(secs: u64) {
    let s = Arc::new(TestServer::start().await);
    let epoch = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let lat = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut senders = Vec::new();
    for i in 0..SENDERS {
        senders.push(tokio::spawn(worker_sender(
            s.clone(),
            format!("lat{i}"),
            100,
            epoch,
            stop.clone(),
        )));
    }
    // Followers start once the orders exist (found by label through the admin list).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, list) = s
        .admin(Method::GET, "/api/v1/work-orders?limit=100", None)
        .await;
    let mut followers = Vec::new();
    for o in list["items"].as_array().unwrap() {
        let id = o["id"].as_str().unwrap().to_string();
        followers.push(tokio::spawn(follower(
            s.base.clone(),
            id,
            epoch,
            Some(lat.clone()),
        )));
    }
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for h in senders {
        let (agent, token, order, claim) = h.await.unwrap();
        complete(&s, &token, &order, &agent, &claim).await;
    }
    for f in followers {
        f.await.unwrap();
    }
    let mut l = lat.lock().unwrap().clone();
    l.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "| (a) line printed (pushed to the worker's sender) → seen by a follower, 16 workers × 100 lines/s, {} lines | p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms; p95 / goal (2 s) = {:.3} | goal p95 ≤ 2 s |",
        l.len(),
        percentile(&l, 0.5),
        percentile(&l, 0.95),
        percentile(&l, 0.99),
        percentile(&l, 0.95) / 2000.0
    );
}

/// Claim+complete throughput of 16 other agents for `secs`, with 16 senders of `lines` lines/s
/// running (0 = none).
/// Who sends the output in (b): nobody, the worker's own sender, or synthetic agents posting ten
/// chunks a second each (ten times the requests a worker makes for the same lines).
#[derive(Clone, Copy, PartialEq)]
enum Senders {
    None,
    Worker,
    TenChunksASecond,
    /// No sender: [`IDLE_FOLLOWERS`] followers of as many orders that print nothing.
    IdleFollowers,
    /// No sender: the orders of `IdleFollowers` without their followers (its baseline).
    IdleOrders,
    /// No sender, no order, but the same wait as `IdleFollowers` before the claims (the
    /// baseline of the orders' own cost).
    IdleEmpty,
}

/// Followers in (e): the default per-replica limit (`serve --max-output-followers`).
const IDLE_FOLLOWERS: usize = 1000;

/// Transactions the database has committed so far (every connection, every statement outside
/// an explicit transaction counts one).
async fn commits(s: &TestServer) -> i64 {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(&s.pool)
    .await
    .unwrap();
    n
}

/// Creates [`IDLE_FOLLOWERS`] orders that no agent may take (none for `IdleEmpty`) and, for
/// `IdleFollowers`, starts a follower of each; then prints the transactions a second the database
/// committed over `secs` (nothing else runs then: this is what idle followers cost it, or the
/// baselines'). The three kinds wait alike, so the claims measured next start as long after the
/// orders were created (autovacuum and the gauges' refresh see the same table in each window).
async fn idle_followers(
    s: &Arc<TestServer>,
    secs: u64,
    kind: Senders,
) -> Vec<tokio::task::JoinHandle<Vec<String>>> {
    let follow = matches!(kind, Senders::IdleFollowers);
    let orders = if matches!(kind, Senders::IdleEmpty) {
        0
    } else {
        IDLE_FOLLOWERS
    };
    let epoch = Instant::now();
    let mut followers = Vec::new();
    for _ in 0..orders {
        let order = s.order(configmap_order("nobody-takes-these")).await;
        if follow {
            followers.push(tokio::spawn(follower(s.base.clone(), order, epoch, None)));
        }
    }
    while follow && s.metrics.output_followers.get() < IDLE_FOLLOWERS as i64 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Statistics reach pg_stat_database when a backend's transaction ends or it idles 10 s.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let (before, t0) = (commits(s).await, Instant::now());
    tokio::time::sleep(Duration::from_secs(secs.max(10))).await;
    let rate = (commits(s).await - before - 1) as f64 / t0.elapsed().as_secs_f64();
    let what = match kind {
        Senders::IdleFollowers => format!("{IDLE_FOLLOWERS} idle followers"),
        Senders::IdleOrders => format!("their {IDLE_FOLLOWERS} orders alone (baseline)"),
        _ => "an empty queue (baseline)".to_string(),
    };
    println!(
        "| (e) {what}, database transactions a second (all of them; nothing else runs) | {rate:.1}/s | goal < 50/s with followers |"
    );
    followers
}

async fn throughput(secs: u64, lines: usize, senders_kind: Senders) -> f64 {
    let s = Arc::new(TestServer::start().await);
    let stop = Arc::new(AtomicBool::new(false));
    let epoch = Instant::now();
    let mut senders = Vec::new();
    for i in 0..SENDERS {
        let label = format!("out{i}");
        match senders_kind {
            Senders::None => {}
            Senders::Worker => {
                let task = worker_sender(s.clone(), label, lines, epoch, stop.clone());
                senders.push(tokio::spawn(async move {
                    task.await;
                }));
            }
            Senders::TenChunksASecond => {
                let task = sender(s.clone(), label, lines, epoch, stop.clone());
                senders.push(tokio::spawn(async move {
                    task.await;
                }));
            }
            Senders::IdleFollowers | Senders::IdleOrders | Senders::IdleEmpty => {}
        }
    }
    let followers = match senders_kind {
        Senders::IdleFollowers | Senders::IdleOrders | Senders::IdleEmpty => {
            idle_followers(&s, secs, senders_kind).await
        }
        _ => Vec::new(),
    };
    let done = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for i in 0..SENDERS {
        let (agent, token) = s
            .agent(json!({"name": format!("w{i}"), "labels": ["tp"]}))
            .await;
        let (s, stop, done) = (s.clone(), stop.clone(), done.clone());
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let order = s.order(configmap_order("tp")).await;
                let _ = order;
                let (st, v) = s
                    .call(
                        Method::POST,
                        &format!("/api/v1/agents/{agent}/claim"),
                        Some(&token),
                        Some(json!({})),
                    )
                    .await;
                if st != 200 {
                    continue;
                }
                let (id, claim) = (
                    v["id"].as_str().unwrap().to_string(),
                    v["claim_id"].as_str().unwrap().to_string(),
                );
                complete(&s, &token, &id, &agent, &claim).await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let start = done.load(Ordering::Relaxed);
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let rate = (done.load(Ordering::Relaxed) - start) as f64 / t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.await;
    }
    for h in senders {
        let _ = h.await;
    }
    for f in followers {
        f.abort();
    }
    rate
}

/// (c) One order sent `total` bytes in chunks of 512 KiB: RSS growth and stored bytes.
async fn one_gib(total: u64) {
    let s = TestServer::start_with_output(OutputSettings::default()).await;
    let (agent, token, order, claim) = claimed(&s, "big").await;
    let url = s.url(&format!("/api/v1/work-orders/{order}/output"));
    let line = "z".repeat(4095);
    let before = rss_kib();
    let mut peak = before;
    let mut sent = 0u64;
    let mut seq = 0i64;
    let t0 = Instant::now();
    while sent < total {
        let lines: Vec<Value> = (0..128)
            .map(|_| json!({"stream": "stdout", "text": line, "at": "2026-12-02T10:00:00Z"}))
            .collect();
        let body = json!({"agent_id": agent, "claim_id": claim, "seq": seq, "lines": lines});
        post(&s.http, &url, &token, &body).await;
        sent += 128 * 4095;
        seq += 1;
        if seq % 64 == 0 {
            peak = peak.max(rss_kib());
        }
    }
    let (stored,): (i64,) =
        sqlx::query_as("SELECT coalesce(sum(bytes), 0)::bigint FROM work_order_output")
            .fetch_one(&s.pool)
            .await
            .unwrap();
    let growth = peak.saturating_sub(before);
    println!(
        "| (c) one order sent {} MiB in {:.0} s | RSS growth {} KiB (growth / goal 32 MiB = {:.2}); stored {} bytes (stored / cap = {:.3}) | goal < 32 MiB, stored ≤ cap |",
        total >> 20,
        t0.elapsed().as_secs_f64(),
        growth,
        growth as f64 / (32.0 * 1024.0),
        stored,
        stored as f64 / OutputSettings::default().cap_bytes as f64
    );
}

/// (c') One order sends one-byte lines, `times` × as many as the cap counts (each line counts its
/// text, its stream name and a fixed overhead, docs/design.md §9), so the oldest are dropped all
/// along: the bytes its rows take in the database against the cap.
async fn one_byte_lines(times: usize) {
    let s = TestServer::start_with_output(OutputSettings::default()).await;
    let (agent, token, order, claim) = claimed(&s, "tiny").await;
    let url = s.url(&format!("/api/v1/work-orders/{order}/output"));
    let cap = OutputSettings::default().cap_bytes as usize;
    // The least a line can count: one byte of text and "stdout".
    let per_line = 1 + "stdout".len() + pullman::queue::output::STORED_LINE_OVERHEAD_BYTES as usize;
    let total = times * cap / per_line;
    // Printable characters in an order that repeats only every 94² lines, so the database's
    // compression of the stored arrays does not hide what they hold.
    let text = |i: usize| char::from(b'!' + ((i * 7 + i / 94) % 94) as u8).to_string();
    let t0 = Instant::now();
    for (seq, start) in (0..total).step_by(5000).enumerate() {
        let lines: Vec<Value> = (start..total.min(start + 5000))
            .map(|i| json!({"stream": "stdout", "text": text(i), "at": "2026-12-02T10:00:00Z"}))
            .collect();
        let body = json!({"agent_id": agent, "claim_id": claim, "seq": seq, "lines": lines});
        post(&s.http, &url, &token, &body).await;
    }
    let (counted, physical): (i64, i64) = sqlx::query_as(
        "SELECT coalesce(sum(bytes), 0)::bigint, coalesce(sum(pg_column_size(streams) \
         + pg_column_size(texts) + pg_column_size(ats) + 100), 0)::bigint FROM work_order_output",
    )
    .fetch_one(&s.pool)
    .await
    .unwrap();
    println!(
        "| (c') one order sent {total} one-byte lines ({times} × the cap's worth) in {:.0} s | counted {counted} bytes ({:.3} × the cap); its rows take {physical} bytes on disk (arrays as stored, compressed where the database did, + 100 a row) ({:.3} × the cap) | goal ≤ 1.1 × the cap |",
        t0.elapsed().as_secs_f64(),
        counted as f64 / cap as f64,
        physical as f64 / cap as f64
    );
}

/// (d) 100 followers of one order: every line once, in order.
async fn hundred_followers(lines: usize) {
    let s = Arc::new(TestServer::start().await);
    let (agent, token, order, claim) = claimed(&s, "many").await;
    let epoch = Instant::now();
    let followers: Vec<_> = (0..100)
        .map(|_| tokio::spawn(follower(s.base.clone(), order.clone(), epoch, None)))
        .collect();
    let url = s.url(&format!("/api/v1/work-orders/{order}/output"));
    let t0 = Instant::now();
    let want: Vec<String> = (0..lines).map(|i| format!("line {i}")).collect();
    for (seq, part) in want.chunks(50).enumerate() {
        let ls: Vec<Value> = part
            .iter()
            .map(|t| json!({"stream": "stdout", "text": t, "at": "2026-12-02T10:00:00Z"}))
            .collect();
        post(
            &s.http,
            &url,
            &token,
            &json!({"agent_id": agent, "claim_id": claim, "seq": seq, "lines": ls}),
        )
        .await;
    }
    let send_time = t0.elapsed();
    complete(&s, &token, &order, &agent, &claim).await;
    let mut ok = 0;
    for f in followers {
        if f.await.unwrap() == want {
            ok += 1;
        }
    }
    println!(
        "| (d) 100 followers of one order, {lines} lines | {ok}/100 saw every line once, in order; all done {:.2} s after the first chunk (sending took {:.2} s; ratio {:.2}) | every follower complete |",
        t0.elapsed().as_secs_f64(),
        send_time.as_secs_f64(),
        t0.elapsed().as_secs_f64() / send_time.as_secs_f64().max(0.001)
    );
}

#[tokio::main]
async fn main() {
    // `cargo test --all-targets` runs this binary too, without `--bench` and unoptimized: its full
    // run (1 GiB of output, six windows of 61 s or more) took minutes of every CI run and its
    // figures from such a build mean nothing, so it only says how to run it.
    if !std::env::args().any(|a| a == "--bench") {
        println!("a benchmark: cargo bench --bench output [-- --quick] [a b c d e]");
        return;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    // Scenarios named after the flags (`a b c d e`) run alone; none named runs them all.
    let named: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let run = |s: &str| named.is_empty() || named.iter().any(|n| n == s);
    // Longer windows shrink the noise of a ratio of two rates (each window is measured twice).
    if std::env::args().any(|a| a == "--secs") {
        panic!("--secs takes its value after '=': --secs=30");
    }
    let secs = std::env::args()
        .find_map(|a| a.strip_prefix("--secs=").map(str::to_owned))
        .map(|v| {
            v.parse::<u64>()
                .ok()
                .filter(|s| (1..=600).contains(s))
                .unwrap_or_else(|| panic!("--secs={v}: a whole number of seconds, 1-600"))
        })
        .unwrap_or(if quick { 3 } else { 10 });
    println!("| scenario | figure | goal |\n|---|---|---|");
    if run("a") {
        latency(secs).await;
    }
    if run("b") {
        senders_vs_claims(secs).await;
    }
    if run("c") {
        one_gib(if quick { 64 << 20 } else { 1 << 30 }).await;
        one_byte_lines(if quick { 1 } else { 4 }).await;
    }
    if run("d") {
        hundred_followers(if quick { 500 } else { 2000 }).await;
    }
    if run("e") {
        // At least one whole safety re-read period of the followers (api::output's FOLLOW_POLL,
        // 60 s) in each window: what they cost includes it.
        idle_followers_vs_claims(if quick { secs } else { secs.max(61) }).await;
    }
}

/// Claim rates beside each of three kinds of load: each kind twice, in mirrored order (a, b, c,
/// c, b, a), so a drift over the run (the shared database filling up, other load) weighs on each
/// alike. Returns the mean of each kind's two windows.
async fn mirrored(secs: u64, lines: usize, kinds: [Senders; 3]) -> [f64; 3] {
    let mut rates = [0.0; 3];
    for i in [0, 1, 2, 2, 1, 0] {
        rates[i] += throughput(secs, lines, kinds[i]).await / 2.0;
    }
    rates
}

/// (b) and (b'): claims beside output senders.
async fn senders_vs_claims(secs: u64) {
    let kinds = [Senders::None, Senders::Worker, Senders::TenChunksASecond];
    let [without, with, synthetic] = mirrored(secs, 1000, kinds).await;
    println!(
        "| (b) claim+complete of 16 other agents, with 16 workers' senders × 1000 lines/s vs without (mean of two windows each) | {with:.0}/s vs {without:.0}/s: ratio {:.2} | goal ≥ 0.9 |",
        with / without.max(0.001)
    );
    println!(
        "| (b') the same lines posted as 10 chunks a second per sender (10× the worker's requests) | {synthetic:.0}/s vs {without:.0}/s: ratio {:.2} | (harsher than the goal's case) |",
        synthetic / without.max(0.001)
    );
}

/// (e): claims beside idle followers.
async fn idle_followers_vs_claims(secs: u64) {
    // The followers' orders wait in the queue in both windows, so the ratio is the followers'.
    let kinds = [
        Senders::IdleEmpty,
        Senders::IdleOrders,
        Senders::IdleFollowers,
    ];
    let [empty, without, with] = mirrored(secs, 0, kinds).await;
    println!(
        "| (e) claim+complete of 16 agents beside {IDLE_FOLLOWERS} idle followers vs their orders alone (mean of two windows each) | {with:.0}/s vs {without:.0}/s: ratio {:.2} | goal ≥ 0.95 |",
        with / without.max(0.001)
    );
    println!(
        "| (e) the same, their {IDLE_FOLLOWERS} orders (no agent may take them) vs an empty queue | {without:.0}/s vs {empty:.0}/s: ratio {:.2} | |",
        without / empty.max(0.001)
    );
}
