//! Where an order's apply → `Succeeded` time goes, stage by stage, from the queue's own
//! timestamps (`GET /api/v1/work-order-log`: `created_at`, `claimed_at`, `completed_at`) between the two
//! the bench takes itself (the create answered, the watch saw `Succeeded`). The queue's are
//! PostgreSQL's `now()`, the start of the transaction that wrote each; the embedded PostgreSQL,
//! serve and the bench run on one machine, so their wall clocks agree. create → queued can come
//! out slightly negative: the controller may insert the row before the bench has read its
//! create's answer.

use std::collections::HashMap;
use std::time::{Instant, SystemTime};

use chrono::{DateTime, Utc};
use pullman::wire::LogEntry;
use uuid::Uuid;

use super::procs;

/// The four legs, in milliseconds, one entry per order that has all four timestamps.
#[derive(Default)]
pub struct Stages {
    /// create answered → queue row inserted (the controller saw the WorkOrder and queued it).
    pub queue: Vec<f64>,
    /// queue row inserted → claimed (a long-poll woke and claimed it).
    pub claim: Vec<f64>,
    /// claimed → completed (the executor applied the YAML and reported).
    pub work: Vec<f64>,
    /// completed → `Succeeded` seen by the bench's watch (status write and watch delivery).
    pub report: Vec<f64>,
}

/// Every log entry of serve at `url`, by id (pages of 1,000).
async fn log(url: &str) -> HashMap<Uuid, LogEntry> {
    let client = pullman::client::Client::new(url, procs::ADMIN).expect("a client for serve");
    let mut all = HashMap::new();
    let mut query = "limit=1000".to_string();
    loop {
        let page = client
            .list_log(&query)
            .await
            .expect("GET /api/v1/work-order-log");
        all.extend(page.items.into_iter().map(|e| (e.id, e)));
        match page.next_cursor {
            Some(c) => query = format!("limit=1000&cursor={c}"),
            None => return all,
        }
    }
}

/// The legs of every order in `created` (name → when its create answered, its uid) that `done`
/// (name → when the watch saw it finish) and serve's log both know.
pub async fn measure(
    url: &str,
    created: &HashMap<String, (Instant, Uuid)>,
    done: &HashMap<String, Instant>,
) -> Stages {
    // One fixed pair maps the bench's monotonic instants onto the wall clock serve stamps with.
    let (anchor, wall) = (Instant::now(), SystemTime::now());
    let at = |i: Instant| -> DateTime<Utc> {
        DateTime::<Utc>::from(wall - anchor.saturating_duration_since(i))
    };
    let ms = |from: DateTime<Utc>, to: DateTime<Utc>| {
        (to - from).num_microseconds().unwrap_or(0) as f64 / 1000.0
    };
    let log = log(url).await;
    let mut s = Stages::default();
    for (name, (start, uid)) in created {
        let (Some(end), Some(e)) = (done.get(name), log.get(uid)) else {
            continue;
        };
        let Some(claimed) = e.claimed_at else {
            continue;
        };
        s.queue.push(ms(at(*start), e.created_at));
        s.claim.push(ms(e.created_at, claimed));
        s.work.push(ms(claimed, e.completed_at));
        s.report.push(ms(e.completed_at, at(*end)));
    }
    for v in [&mut s.queue, &mut s.claim, &mut s.work, &mut s.report] {
        v.sort_by(|a, b| a.total_cmp(b));
    }
    s
}

impl Stages {
    /// `queue p50/p99 …; claim …; work …; report …`, in ms.
    pub fn summary(&self, percentile: fn(&[f64], f64) -> f64) -> String {
        let leg = |name: &str, v: &[f64]| {
            format!(
                "{name} {:.0}/{:.0}",
                percentile(v, 0.5),
                percentile(v, 0.99)
            )
        };
        format!(
            "legs p50/p99 ms: {}, {}, {}, {}",
            leg("create→queued", &self.queue),
            leg("queued→claimed", &self.claim),
            leg("claimed→completed", &self.work),
            leg("completed→seen Succeeded", &self.report),
        )
    }
}
