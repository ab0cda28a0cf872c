//! Concurrency keys under the faults (docs/design.md §3, issue #40): every other order carries one
//! of [`keys_for`] keys, with `max` 1 to 3, and a watcher reads the claims table every
//! `SAMPLE_EVERY` for the whole run, replicas killed and PostgreSQL restarted included. Each
//! sample is one statement, so one snapshot: no key may have more claim rows than its `max`, and
//! each key's slot counter (`concurrency_slots.held`) must equal its claim rows (a key's row stays
//! at 0 while it has orders). After the drain no slot may be left held.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// How many keys the keyed orders of a run of `orders` share: 24, or more for a larger run, so that
/// a key carries at most ~62 orders (as in the full run's 3,000). A key of `max` 1 works its
/// orders one at a time, each dead agent's holding a lease (5 s) of it: 200 orders on one such key
/// took longer than the drain allows.
pub fn keys_for(orders: usize) -> usize {
    24.max(orders.div_ceil(125))
}
/// How often the watcher samples the claims.
const SAMPLE_EVERY: Duration = Duration::from_millis(20);

/// The `concurrency` of order `seq` of a run with `keys` keys: every other order has a key, `k<i>`
/// with `max` 1 + i % 3.
pub fn concurrency_of(seq: usize, keys: usize) -> Option<Value> {
    if seq % 2 == 1 {
        return None;
    }
    let key = (seq / 2) % keys;
    Some(json!({"key": format!("k{key}"), "max": 1 + key % 3}))
}

/// What the watcher saw.
#[derive(Debug, Default)]
pub struct KeyReport {
    /// Samples taken (one statement each).
    pub samples: u64,
    /// Samples that failed (the database was down or restarting).
    pub failed: u64,
    /// Claims of keyed orders seen in one sample, at most.
    pub peak_keyed_claims: i64,
    /// Per key, the most claims held at once, and its max.
    pub peaks: BTreeMap<String, (i64, i32)>,
    /// Claims of keyed orders in the whole run (each finished keyed order's last claim and its
    /// earlier attempts), read after the drain.
    pub keyed_claims: i64,
    /// Keys over their max, or counters that disagree with the claims: each fails the run.
    pub violations: Vec<String>,
}

/// One key in one sample.
#[derive(sqlx::FromRow)]
struct KeySample {
    key: Option<String>,
    max: Option<i32>,
    claims: i64,
    held: Option<i32>,
}

/// Samples the keys until `stop`, then checks that no slot is left held.
pub async fn watch(pool: PgPool, stop: CancellationToken) -> KeyReport {
    let mut report = KeyReport::default();
    // Keys of the claims, and every slot row, side by side in one snapshot: a slot with claims
    // but no row, or a row whose count is not its claims', disagrees.
    let sample = "SELECT max(w.concurrency_key) AS key, max(w.concurrency_max) AS max, \
                         count(c.work_order_id) AS claims, max(s.held) AS held \
                  FROM work_order_claims c \
                  JOIN work_orders w ON w.id = c.work_order_id \
                  FULL JOIN concurrency_slots s ON s.slot = c.concurrency_slot \
                  WHERE c.concurrency_slot IS NOT NULL OR s.slot IS NOT NULL \
                  GROUP BY COALESCE(c.concurrency_slot, s.slot)";
    while !stop.is_cancelled() {
        match sqlx::query_as::<_, KeySample>(sample)
            .fetch_all(&pool)
            .await
        {
            Ok(rows) => {
                report.samples += 1;
                let mut keyed = 0;
                for r in rows {
                    keyed += r.claims;
                    // A key's row stays (at 0) while it has orders; only keys with claims are named.
                    let key = r.key.unwrap_or_else(|| "(a key without claims)".into());
                    let max = r.max.unwrap_or(0);
                    if max > 0 && r.claims > i64::from(max) {
                        report.violations.push(format!(
                            "key {key}: {} claims held at once, max {max}",
                            r.claims
                        ));
                    }
                    if i64::from(r.held.unwrap_or(0)) != r.claims {
                        report.violations.push(format!(
                            "key {key}: slot counter {:?}, claims {}",
                            r.held, r.claims
                        ));
                    }
                    if r.claims > 0 {
                        let peak = report.peaks.entry(key).or_insert((0, max));
                        peak.0 = peak.0.max(r.claims);
                    }
                }
                report.peak_keyed_claims = report.peak_keyed_claims.max(keyed);
            }
            Err(_) => report.failed += 1,
        }
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(SAMPLE_EVERY) => {}
        }
    }
    match sqlx::query_as::<_, (i64,)>("SELECT count(*) FROM concurrency_slots WHERE held > 0")
        .fetch_one(&pool)
        .await
    {
        Ok((0,)) => {}
        Ok((n,)) => report
            .violations
            .push(format!("{n} slot(s) still held after the drain")),
        Err(e) => report
            .violations
            .push(format!("could not read the slots after the drain: {e}")),
    }
    let keyed: Result<(i64,), _> = sqlx::query_as(
        "SELECT (SELECT count(*) FROM work_order_log WHERE concurrency_key IS NOT NULL) \
              + (SELECT count(*) FROM work_order_attempts a \
                 JOIN work_order_log l ON l.id = a.work_order_id \
                 WHERE l.concurrency_key IS NOT NULL)",
    )
    .fetch_one(&pool)
    .await;
    report.keyed_claims = keyed.map_or(0, |(n,)| n);
    report.violations.dedup();
    report
}

/// The report's section on keys.
pub fn print(r: &KeyReport) {
    println!("\n### Concurrency keys (sampled every {SAMPLE_EVERY:?} from the claims table)\n");
    println!("| what | figure |");
    println!("|---|---|");
    println!(
        "| samples | {} ({} failed while the database was away) |",
        r.samples, r.failed
    );
    let at_max = r
        .peaks
        .values()
        .filter(|(p, m)| p == &i64::from(*m))
        .count();
    println!(
        "| keys that reached their max | {at_max} of {} |",
        r.peaks.len()
    );
    println!(
        "| keyed claims held at once, most | {} |",
        r.peak_keyed_claims
    );
    println!("| claims of keyed orders in the run | {} |", r.keyed_claims);
    println!("| violations | {} |", r.violations.len());
    for v in r.violations.iter().take(10) {
        println!("VIOLATION: {v}");
    }
}
