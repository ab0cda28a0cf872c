//! (10) Concurrency keys (docs/design.md §3 "Concurrency keys", issue #40): what the slots cost
//! a claim, as ratios to the same backlog without keys, measured in the same run. 8 agents claim
//! and complete, one order at a time (`fair::drain_filled`):
//!
//! - 10a. Every order keyed, 200 keys of `max` 5: each claim takes a slot under the key row's lock
//!   and each complete frees it (the triggers on `work_order_claims`).
//! - 10b. One hot key: the oldest tenth of the backlog is one key of `max` 1, so every claim
//!   walks past its waiting orders (`key_full.sql`) to the orders after them: the limit
//!   docs/design.md §3 names.

use std::time::Duration;

use sqlx::PgPool;

use super::fair::drain_filled;
use super::{Bench, ms, percentile};

const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n";

/// `n` pending orders for agents labelled `fair`, oldest first; order `g` has key `k<g mod keys>`
/// of `max` when `g` ≤ `keyed` (none when `keys` is 0).
async fn fill(pool: &PgPool, n: i64, keyed: i64, keys: i64, max: i32) {
    sqlx::query(
        "INSERT INTO work_orders (id, work_type, yaml_content, max_retries, backoff_seconds, \
         claim_timeout_seconds, max_reclaims, target_labels, status, created_at, \
         concurrency_key, concurrency_max, concurrency_on_conflict) \
         SELECT gen_random_uuid(), 'custom', $2, 3, 60, 3600, 5, ARRAY['fair'], 'PENDING', \
           now() - make_interval(secs => ($1 - g) / 1000.0), \
           CASE WHEN $4 > 0 AND g <= $3 THEN 'k' || (g % $4) END, \
           CASE WHEN $4 > 0 AND g <= $3 THEN $5 END, \
           CASE WHEN $4 > 0 AND g <= $3 THEN 'queue' END \
         FROM generate_series(1, $1) g",
    )
    .bind(n)
    .bind(CM)
    .bind(keyed)
    .bind(keys)
    .bind(max)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO concurrency_slots (slot, held) \
         SELECT DISTINCT concurrency_slot, 0 FROM work_orders WHERE concurrency_slot IS NOT NULL",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE").execute(pool).await.unwrap();
}

fn row(name: &str, base: (f64, Vec<Duration>), keyed: (f64, Vec<Duration>)) {
    let (p99_base, p99_keyed) = (percentile(&base.1, 0.99), percentile(&keyed.1, 0.99));
    println!(
        "| {name} | without keys: {:.0} orders/s, claim p99 {}; with: {:.0} orders/s, claim p99 {} | throughput {:.2} ×, p99 {:.2} × |",
        base.0,
        ms(p99_base),
        keyed.0,
        ms(p99_keyed),
        keyed.0 / base.0,
        p99_keyed.as_secs_f64() / p99_base.as_secs_f64()
    );
}

/// Prints rows 10a and 10b.
pub async fn run(b: &Bench) {
    let n: i64 = if b.quick { 10_000 } else { 100_000 };
    let base = drain_filled(b, n, false, async |pool| fill(pool, n, 0, 0, 0).await).await;
    let keyed = drain_filled(b, n, false, async |pool| fill(pool, n, n, 200, 5).await).await;
    row(
        &format!(
            "10a. Concurrency keys, {n} pending, 8 agents: every order keyed (200 keys, max 5)"
        ),
        base.clone(),
        keyed,
    );
    let hot = drain_filled(b, n, false, async |pool| fill(pool, n, n / 10, 1, 1).await).await;
    row(
        &format!(
            "10b. Concurrency keys, {n} pending, 8 agents: the oldest {} one key of max 1",
            n / 10
        ),
        base,
        hot,
    );
}
