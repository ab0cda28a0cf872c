//! (5) Soak: the end-to-end run of (2) held at a fixed offered load for N minutes (default 10).
//! Target: throughput in the last minute ≥ 80% of the first, i.e. dead tuples and index bloat do
//! not strangle the claim path. Reports table and index sizes at the start and the end.
//!
//! Offered load: permits are issued at a fixed rate (70% of the throughput (2) measured in the
//! same run, else 200/s); each agent takes a permit before a claim-next + complete cycle, and a
//! producer inserts as many new orders as permits issued, so the backlog stays level. Permits
//! accumulate at most one second's worth, so a slowdown shows as lost throughput.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::sync::Semaphore;

use super::{Bench, ms, percentile};

const TICK: Duration = Duration::from_millis(100);

/// Table and index sizes and tuple counts of the queue's tables, as Markdown rows.
async fn sizes(pool: &PgPool, when: &str) -> Vec<String> {
    let rows: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT relname::text, pg_relation_size(relid), pg_indexes_size(relid), \
           n_dead_tup, autovacuum_count + vacuum_count \
         FROM pg_stat_user_tables \
         WHERE relname IN ('work_orders', 'work_order_claims', 'work_order_log', 'agents') \
         ORDER BY relname",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut out = Vec::new();
    for (table, heap, indexes, dead, vacuums) in rows {
        // Exact, unlike the statistics' estimate.
        let (live,): (i64,) = sqlx::query_as(&format!("SELECT count(*) FROM {table}"))
            .fetch_one(pool)
            .await
            .unwrap();
        out.push((table, heap, indexes, live, dead, vacuums));
    }
    out.into_iter()
        .map(|(table, heap, indexes, live, dead, vacuums)| {
            format!(
                "| {when} | {table} | {:.1} MiB | {:.1} MiB | {live} | {dead} | {vacuums} |",
                heap as f64 / 1048576.0,
                indexes as f64 / 1048576.0
            )
        })
        .collect()
}

/// Runs the soak; prints its row of the main table and returns the size table for the notes.
pub async fn run(b: &Bench, backlog: usize, minutes: u64, http_rate: Option<f64>) -> Vec<String> {
    let offered = http_rate
        .map(|r| (r * 0.7).floor())
        .unwrap_or(200.0)
        .max(10.0);
    let server = b.server(40, 1024).await;
    let (base, pool) = (server.base.clone(), server.pool.clone());
    Bench::fill(&pool, backlog, 0).await;
    // Statistics are flushed to pg_stat_* at most once a second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut notes = vec![
        format!(
            "Soak sizes ({minutes} min at {offered:.0} orders/s offered, {backlog} backlog kept level):"
        ),
        String::new(),
        "| when | table | heap | indexes | rows | dead rows (estimate) | vacuums so far |".into(),
        "|---|---|---|---|---|---|---|".into(),
    ];
    notes.extend(sizes(&pool, "start").await);

    let (http, creds) = Bench::agents(&base, "soak").await;
    let permits = Arc::new(Semaphore::new(0));
    let started = Instant::now();
    let end = started + Duration::from_secs(minutes * 60);
    // claim latencies per minute
    let per_minute: Arc<Mutex<Vec<Vec<Duration>>>> =
        Arc::new(Mutex::new(vec![Vec::new(); minutes as usize]));

    let issuer = {
        let (permits, pool) = (permits.clone(), pool.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(TICK);
            let mut owed = 0.0f64;
            while Instant::now() < end {
                tick.tick().await;
                owed += offered * TICK.as_secs_f64();
                let n = owed.floor() as usize;
                owed -= n as f64;
                if n == 0 {
                    continue;
                }
                sqlx::query(
                    "INSERT INTO work_orders (id, work_type, yaml_content, max_retries, \
                       backoff_seconds, claim_timeout_seconds, max_reclaims, target_labels, status) \
                     SELECT gen_random_uuid(), 'custom', \
                       'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n', 3, 60, 3600, 5, \
                       ARRAY['bench'], 'PENDING' FROM generate_series(1, $1)",
                )
                .bind(n as i64)
                .execute(&pool)
                .await
                .unwrap();
                let cap = offered as usize;
                permits.add_permits(n.min(cap.saturating_sub(permits.available_permits())));
            }
            permits.close();
        })
    };

    let mut tasks = Vec::new();
    for (id, token) in creds {
        let (http, base, permits, per_minute) = (
            http.clone(),
            base.clone(),
            permits.clone(),
            per_minute.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while let Ok(permit) = permits.acquire().await {
                permit.forget();
                let t0 = Instant::now();
                let latency = Bench::cycle(&http, &base, &id, &token)
                    .await
                    .expect("the backlog is kept level");
                let minute = (t0 - started).as_secs() / 60;
                if let Some(bucket) = per_minute.lock().unwrap().get_mut(minute as usize) {
                    bucket.push(latency);
                }
            }
        }));
    }
    issuer.await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    notes.extend(sizes(&pool, "end").await);
    drop(server);

    let mut buckets = per_minute.lock().unwrap().clone();
    for bucket in &mut buckets {
        bucket.sort();
    }
    let (first, last) = (&buckets[0], &buckets[buckets.len() - 1]);
    let rate = |b: &Vec<Duration>| b.len() as f64 / 60.0;
    let per_minute_rates: Vec<String> = buckets.iter().map(|b| format!("{:.0}", rate(b))).collect();
    println!(
        "| 5. Soak: {minutes} min at {offered:.0} orders/s offered, 16 agents, {backlog} backlog | first minute {:.0}/s (claim p99 {}), last {:.0}/s (claim p99 {}); per minute: {} | {:.2} × first minute (target ≥ 0.8) |",
        rate(first),
        ms(percentile(first, 0.99)),
        rate(last),
        ms(percentile(last, 0.99)),
        per_minute_rates.join(", "),
        rate(last) / rate(first).max(f64::MIN_POSITIVE)
    );
    notes
}
