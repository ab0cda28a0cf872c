//! (9) Fair share between tenants (docs/design.md §3, issue #40), two figures, each a ratio to
//! a baseline measured in the same run:
//!
//! - 9a. Claim cost: 8 agents claim and complete a backlog held by one tenant (claims walk
//!   priority and age, `queue::turns`), then the same backlog spread over one tenant per 10
//!   orders (claims walk the tenants' turns in served order, one index probe each, and move the
//!   served turn to the back). Targets: claim p99 ≤ 2 ×, throughput ≥ 0.9 ×.
//! - 9b. A small tenant behind a big one: 8 agents work tenant `big`'s backlog (5 ms per order)
//!   while tenant `small` creates an order every 50 ms; `small`'s wait from created to claimed,
//!   against the same agents with `big` absent (target: p95 ≤ 2 ×). First come, first served,
//!   `small` would wait for the whole backlog.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pullman::queue::{ClaimRequest, Completion, Queue};
use pullman::testing;
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use super::{Bench, ms, percentile};

const AGENTS: usize = 8;
const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n";

/// `n` pending orders for agents labelled `fair`, order `g` of tenant `t<g mod tenants>` (all
/// of tenant `big` when `tenants` is 1), oldest first.
async fn fill(pool: &PgPool, n: i64, tenants: i64) {
    sqlx::query(
        "INSERT INTO work_orders (id, work_type, yaml_content, max_retries, backoff_seconds, \
         claim_timeout_seconds, max_reclaims, target_labels, status, tenant, created_at) \
         SELECT gen_random_uuid(), 'custom', $3, 3, 60, 3600, 5, ARRAY['fair'], 'PENDING', \
           CASE WHEN $2 = 1 THEN 'big' ELSE 't' || (g % $2) END, \
           now() - make_interval(secs => ($1 - g) / 1000.0) \
         FROM generate_series(1, $1) g",
    )
    .bind(n)
    .bind(tenants)
    .bind(CM)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE").execute(pool).await.unwrap();
}

async fn agents(queue: &Queue) -> Vec<Uuid> {
    let mut ids = vec![];
    for i in 0..AGENTS {
        let body = json!({"name": format!("fair-{i}"), "labels": ["fair"]});
        ids.push(testing::register_agent(queue, body).await);
    }
    ids
}

fn done() -> Completion {
    Completion {
        success: true,
        message: None,
        retryable: true,
        disrupted: false,
    }
}

/// 9a: orders/s and claim latencies (sorted) of 8 agents working `n` orders over `tenants`;
/// `batched`: with the group claims and the group commit `serve` runs by default.
async fn drain(b: &Bench, n: i64, tenants: i64, batched: bool) -> (f64, Vec<Duration>) {
    drain_filled(b, n, batched, async |pool| fill(pool, n, tenants).await).await
}

/// Orders/s and claim latencies (sorted) of 8 agents labelled `fair` claiming and completing,
/// one order at a time, the `n` orders `fill` writes to a fresh database, until none is left.
/// `batched`: the queue groups claims and completes as `serve` does by default
/// (`queue::limits::CLAIM_BATCH_DEFAULT`, `COMPLETE_BATCH_DEFAULT`); else each claim and each
/// complete is its own statement and commit.
pub(super) async fn drain_filled(
    b: &Bench,
    n: i64,
    batched: bool,
    fill: impl AsyncFnOnce(&PgPool),
) -> (f64, Vec<Duration>) {
    let pool = b.fresh_pool(AGENTS as u32 + 2).await;
    let mut queue = Queue::new(pool.clone());
    if batched {
        use pullman::queue::limits::{CLAIM_BATCH_DEFAULT, COMPLETE_BATCH_DEFAULT};
        queue = queue
            .with_group_claims(CLAIM_BATCH_DEFAULT as usize)
            .with_group_commit(COMPLETE_BATCH_DEFAULT as usize);
    }
    fill(&pool).await;
    let started = Instant::now();
    let mut tasks = vec![];
    for agent in agents(&queue).await {
        let queue = queue.clone();
        tasks.push(tokio::spawn(async move {
            let req = ClaimRequest {
                agent_id: agent,
                lease_seconds: None,
            };
            let mut lat = vec![];
            loop {
                let t0 = Instant::now();
                let Some(o) = queue.claim_next(&req, &[]).await.unwrap() else {
                    return lat;
                };
                lat.push(t0.elapsed());
                queue
                    .complete(o.id, agent, o.claim_id, &done())
                    .await
                    .unwrap();
            }
        }));
    }
    let mut lat = vec![];
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    let rate = lat.len() as f64 / started.elapsed().as_secs_f64();
    assert_eq!(lat.len() as i64, n, "every order handed out once");
    lat.sort();
    pool.close().await;
    (rate, lat)
}

/// 9b: `small`'s waits (sorted), created → claimed, with `big` holding `backlog` orders.
async fn small_waits(b: &Bench, backlog: i64, small_orders: usize) -> Vec<Duration> {
    let pool = b.fresh_pool(AGENTS as u32 + 2).await;
    let queue = Queue::new(pool.clone());
    if backlog > 0 {
        fill(&pool, backlog, 1).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = vec![];
    for agent in agents(&queue).await {
        let (queue, stop) = (queue.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let req = ClaimRequest {
                agent_id: agent,
                lease_seconds: None,
            };
            let mut waits = vec![];
            while !stop.load(Ordering::Relaxed) {
                let got = queue.claim_next(&req, &[]).await.unwrap();
                // 5 ms of work, or 5 ms until the next poll: the same cadence either way.
                tokio::time::sleep(Duration::from_millis(5)).await;
                if let Some(o) = got {
                    if o.tenant.as_deref() == Some("small") {
                        let claimed = o.claimed_at.expect("a claim has its time");
                        waits.push((claimed - o.created_at).to_std().unwrap_or_default());
                    }
                    queue
                        .complete(o.id, agent, o.claim_id, &done())
                        .await
                        .unwrap();
                }
            }
            waits
        }));
    }
    for _ in 0..small_orders {
        let body = json!({
            "work_type": "custom", "yaml_content": CM, "tenant": "small",
            "targeting": {"labels": ["fair"]},
        });
        testing::create_order(&queue, body).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The last order's claim.
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let mut waits = vec![];
    for t in tasks {
        waits.extend(t.await.unwrap());
    }
    assert_eq!(waits.len(), small_orders, "every small order claimed");
    waits.sort();
    pool.close().await;
    waits
}

/// Prints rows 9a and 9b.
pub async fn run(b: &Bench) {
    let n: i64 = if b.quick { 10_000 } else { 100_000 };
    for (row, batched) in [("9a", false), ("9a+", true)] {
        let (one_rate, one) = drain(b, n, 1, batched).await;
        let (many_rate, many) = drain(b, n, n / 10, batched).await;
        let (p99_one, p99_many) = (percentile(&one, 0.99), percentile(&many, 0.99));
        let how = if batched {
            "claims and completes batched as serve does"
        } else {
            "each claim and complete its own commit"
        };
        println!(
            "| {row}. Fair share, {n} pending, 8 agents, {how}: one tenant vs {} tenants | one: {one_rate:.0} orders/s, claim p99 {}; many: {many_rate:.0} orders/s, claim p99 {} | p99 {:.2} × (target ≤ 2), throughput {:.2} × (target ≥ 0.9) |",
            n / 10,
            ms(p99_one),
            ms(p99_many),
            p99_many.as_secs_f64() / p99_one.as_secs_f64(),
            many_rate / one_rate
        );
    }
    let backlog = if b.quick { 5_000 } else { 10_000 };
    let small = if b.quick { 40 } else { 100 };
    let alone = small_waits(b, 0, small).await;
    let behind = small_waits(b, backlog, small).await;
    let (p95_alone, p95_behind) = (percentile(&alone, 0.95), percentile(&behind, 0.95));
    println!(
        "| 9b. Fair share: tenant `small` (an order every 50 ms) behind `big`'s {backlog} pending, 8 agents at 5 ms per order | small's wait p95 {} behind, {} alone | {:.2} × (target ≤ 2) |",
        ms(p95_behind),
        ms(p95_alone),
        p95_behind.as_secs_f64() / p95_alone.as_secs_f64()
    );
}
