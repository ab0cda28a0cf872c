//! (7) Queue depth for autoscalers (docs/design.md §10, issue #25): `GET /agents/{id}/backlog` and
//! the profile route answer from one statement (`sql/backlog.sql`). Target: under 50 ms with 1M
//! pending orders. Orders sit in 100 label pools; the profile and the agent take one pool, so 1%
//! match, as a scaler for one kind of agent asks. Baseline: the same calls at 1k pending.
//!
//! Over the same orders, through the API (issue #35): `GET /metrics` (target < 100 ms at 1M
//! pending: the costly gauges come from one replica's stored figures, `queue::gauges`, whose
//! computation is timed once) and `GET /work-orders/{id}` of the newest order, behind all the
//! others (target p99 < 10 ms).
//!
//! The statement counts through the partial GIN indexes on the targeting arrays
//! (migrations/20261206000001_targeting_indexes.sql). What they cost is the insert: the same run
//! times order creation (through `Queue::create_work_order`, as the API does) with and without
//! them, in mirrored windows (with, without, without, with) so a drift weighs on both alike.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use pullman::queue::eligibility::AgentProfile;
use pullman::queue::{self, Queue};
use pullman::testing::{TestServer, configmap_order};
use serde_json::json;
use sqlx::PgPool;

use super::{Bench, ms, percentile};

const POOLS: i64 = 100;
const INDEXES: [(&str, &str); 4] = [
    ("work_orders_target_agent_ids", "target_agent_ids"),
    ("work_orders_target_agent_names", "target_agent_names"),
    ("work_orders_target_labels", "target_labels"),
    (
        "work_orders_target_annotation_pairs",
        "target_annotation_pairs",
    ),
];

/// `n` pending orders, order `g` in label pool `g mod 100`, oldest first.
async fn fill(pool: &PgPool, n: i64) {
    sqlx::query(
        "INSERT INTO work_orders (id, work_type, yaml_content, max_retries, backoff_seconds, \
         claim_timeout_seconds, max_reclaims, target_labels, status, created_at, updated_at) \
         SELECT gen_random_uuid(), 'custom', 'x', 3, 60, 3600, 5, ARRAY['pool-' || (g % $2)], \
           'PENDING', now() - make_interval(secs => ($1 - g) / 1000.0), \
           now() - make_interval(secs => ($1 - g) / 1000.0) \
         FROM generate_series(1, $1) g",
    )
    .bind(n)
    .bind(POOLS)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE work_orders")
        .execute(pool)
        .await
        .unwrap();
}

/// p50 and p99 of `samples` calls of `call`, after 5 unmeasured ones (statement planning).
async fn timed<F, Fut>(samples: usize, mut call: F) -> (Duration, Duration)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = i64>,
{
    let mut lat = Vec::new();
    for i in 0..samples + 5 {
        let t0 = Instant::now();
        let count = call().await;
        assert!(count > 0, "the call found nothing to count");
        if i >= 5 {
            lat.push(t0.elapsed());
        }
    }
    lat.sort();
    (percentile(&lat, 0.5), percentile(&lat, 0.99))
}

/// What [`at_depth`] measured: backlog by profile and by agent, `GET /metrics`, and
/// `GET /work-orders/{id}` (p50, p99 each); and one computation of the database gauges.
struct Depth {
    backlog: [(Duration, Duration); 2],
    scrape: (Duration, Duration),
    get: (Duration, Duration),
    gauges: Duration,
}

/// The calls of [`Depth`] with `n` pending orders.
async fn at_depth(b: &Bench, n: i64) -> Depth {
    let pool = b.fresh_pool(4).await;
    let queue = Queue::new(pool.clone());
    fill(&pool, n).await;
    let profile = AgentProfile {
        id: uuid::Uuid::nil(),
        name: String::new(),
        labels: vec!["pool-7".into()],
        annotations: BTreeMap::new(),
        work_types: vec![],
        tenant: None,
        retired: false,
    };
    let agent =
        pullman::testing::register_agent(&queue, json!({"name": "scaled", "labels": ["pool-7"]}))
            .await;
    let samples = if b.quick { 20 } else { 100 };
    let by_profile = timed(samples, || async {
        queue.profile_backlog(&profile).await.unwrap().count
    })
    .await;
    let by_agent = timed(samples, || async {
        queue.agent_backlog(agent).await.unwrap().count
    })
    .await;
    let server = TestServer::start_on(pool.clone(), 16).await;
    let newest = server.order(configmap_order("pool-7")).await;
    let t0 = Instant::now();
    let top = pullman::telemetry::tenants::TOP_TENANTS;
    server
        .queue
        .refresh_gauges(Duration::ZERO, top)
        .await
        .unwrap();
    let gauges = t0.elapsed();
    let scrape = timed(samples, || async {
        let r = server
            .http
            .get(server.url("/metrics"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.text().await.unwrap().len() as i64
    })
    .await;
    let path = format!("/api/v1/work-orders/{newest}");
    let get = timed(samples, || async {
        let (status, order) = server.admin_get(&path).await;
        assert_eq!(status, 200, "{order}");
        order["waiting"].as_object().map_or(0, |w| w.len() as i64)
    })
    .await;
    drop(server);
    pool.close().await;
    Depth {
        backlog: [by_profile, by_agent],
        scrape,
        get,
        gauges,
    }
}

/// Seconds to create `n` orders one by one.
async fn create(queue: &Queue, n: usize) -> f64 {
    let spec = queue::validate::validate_work_order(
        serde_json::from_value(json!({
            "work_type": "custom",
            "yaml_content": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
            "targeting": {"labels": ["pool-3"], "agent_names": ["scaled"]}
        }))
        .unwrap(),
    )
    .unwrap();
    let t0 = Instant::now();
    for _ in 0..n {
        queue
            .create_work_order(&spec, uuid::Uuid::new_v4(), "bench")
            .await
            .unwrap();
    }
    t0.elapsed().as_secs_f64()
}

/// Creates per second with the targeting indexes over without, over 100k pending orders.
async fn insert_ratio(b: &Bench) -> (f64, f64) {
    let pool = b.fresh_pool(4).await;
    let queue = Queue::new(pool.clone());
    fill(&pool, 100_000).await;
    let n = if b.quick { 500 } else { 2_000 };
    let drop_all = || async {
        for (name, _) in INDEXES {
            sqlx::query(&format!("DROP INDEX {name}"))
                .execute(&pool)
                .await
                .unwrap();
        }
    };
    let create_all = || async {
        for (name, column) in INDEXES {
            sqlx::query(&format!(
                "CREATE INDEX {name} ON work_orders USING gin ({column}) \
                 WHERE status IN ('PENDING', 'RETRY_PENDING')"
            ))
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    let with_1 = create(&queue, n).await;
    drop_all().await;
    let without = create(&queue, n).await + create(&queue, n).await;
    create_all().await;
    let with_2 = create(&queue, n).await;
    pool.close().await;
    let with_rate = 2.0 * n as f64 / (with_1 + with_2);
    let without_rate = 2.0 * n as f64 / without;
    (with_rate, without_rate)
}

pub async fn run(b: &Bench) {
    let big: i64 = if b.quick { 100_000 } else { 1_000_000 };
    let base = at_depth(b, 1_000).await;
    let at = at_depth(b, big).await;
    for (i, what) in ["profile route", "agent route"].iter().enumerate() {
        let (p50, p99) = at.backlog[i];
        println!(
            "| 7. Queue depth, {what}: {big} pending, 1% match | p50 {} p99 {} | p99 {:.1} × 1k pending; target < 50 ms |",
            ms(p50),
            ms(p99),
            p99.as_secs_f64() / base.backlog[i].1.as_secs_f64()
        );
    }
    for (what, (p50, p99), (_, base99), target) in [
        ("GET /metrics", at.scrape, base.scrape, "< 100 ms"),
        (
            "GET /work-orders/{id}, the newest",
            at.get,
            base.get,
            "p99 < 10 ms",
        ),
    ] {
        println!(
            "| 7. {what}: {big} pending | p50 {} p99 {} | p99 {:.1} × 1k pending; target {target} |",
            ms(p50),
            ms(p99),
            p99.as_secs_f64() / base99.as_secs_f64()
        );
    }
    println!(
        "| 7. Database gauges computed (one replica, off the scrape path): {big} pending | {} | {:.1} × 1k pending |",
        ms(at.gauges),
        at.gauges.as_secs_f64() / base.gauges.as_secs_f64()
    );
    let (with, without) = insert_ratio(b).await;
    println!(
        "| 7. Creates with the targeting indexes, 100000 pending | {with:.0}/s vs {without:.0}/s without | {:.2} × without |",
        with / without
    );
}
