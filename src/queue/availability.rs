//! Whether the database is known to be down (docs/design.md §5: a database that is down answers
//! `503 database_unavailable` "at once once the outage is known").
//!
//! Without this, every request during an outage waits for the pool's acquire timeout (10 s)
//! before its `503`, so clients pile up and health checks time out. Once any request, the
//! notification listener or the maintenance loop sees the database unavailable, the API answers
//! `503` without touching the pool, and one prober checks the database every
//! [`PROBE_INTERVAL`] until it answers again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::Queue;

/// Pause between probes while the database is down.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(250);
/// Longest a probe waits for the database (connecting included).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The shared flag and the prober's wake-up.
#[derive(Default)]
pub(crate) struct Availability {
    down: AtomicBool,
    wake_prober: Notify,
}

impl Queue {
    /// True while the database is known to be unreachable: callers answer `503` at once.
    pub fn database_known_down(&self) -> bool {
        self.availability.down.load(Ordering::Acquire)
    }

    /// Records that the database was found unavailable (a connection error, a shutdown error);
    /// the prober started by [`spawn_availability_probe`] clears it once a query succeeds.
    pub fn note_database_unavailable(&self) {
        if !self.availability.down.swap(true, Ordering::AcqRel) {
            tracing::warn!("database unavailable: answering 503 at once until it is back");
        }
        self.availability.wake_prober.notify_one();
    }
}

/// Runs until `shutdown`: whenever the database is marked down, probes it every
/// [`PROBE_INTERVAL`] with `SELECT 1` (each bounded by [`PROBE_TIMEOUT`]) and clears the mark
/// on the first success, logging how long the outage lasted as seen from here.
pub fn spawn_availability_probe(
    queue: Queue,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let availability: Arc<Availability> = queue.availability.clone();
        loop {
            if !queue.database_known_down() {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = availability.wake_prober.notified() => {}
                }
                continue;
            }
            let since = Instant::now();
            loop {
                let probe = tokio::time::timeout(
                    PROBE_TIMEOUT,
                    sqlx::query("SELECT 1").execute(queue.pool()),
                );
                if matches!(probe.await, Ok(Ok(_))) {
                    availability.down.store(false, Ordering::Release);
                    tracing::info!(
                        down_for_ms = since.elapsed().as_millis() as u64,
                        "database reachable again"
                    );
                    break;
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(PROBE_INTERVAL) => {}
                }
            }
        }
    })
}
