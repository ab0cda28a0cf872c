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
/// Longest a probe waits on the pool, and then (when the pool did not answer) on a connection
/// of its own that finds out why.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The shared flag, the prober's wake-up, and what its last probe met.
#[derive(Default)]
pub(crate) struct Availability {
    down: AtomicBool,
    wake_prober: Notify,
    /// The last failed probe's error, for `/readyz` and the log: "refused", "timed out" and "a
    /// read-only standby" (a failover under way, issue #41) call for different actions.
    last_probe_error: std::sync::Mutex<Option<String>>,
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

    /// Why the last probe of a known outage failed, if one has failed.
    pub(crate) fn last_probe_error(&self) -> Option<String> {
        self.availability
            .last_probe_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Runs until `shutdown`: whenever the database is marked down, probes it every
/// [`PROBE_INTERVAL`] (each probe bounded by [`PROBE_TIMEOUT`]) and clears the mark
/// on the first success, logging how long the outage lasted as seen from here, and each new
/// reason a probe failed.
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
                let error = match probe(queue.pool()).await {
                    Ok(()) => None,
                    Err(sqlx::Error::PoolTimedOut) => {
                        Some(format!("no answer within {PROBE_TIMEOUT:?}"))
                    }
                    Err(e) => Some(e.to_string()),
                };
                let back = error.is_none();
                {
                    let mut last = availability
                        .last_probe_error
                        .lock()
                        .unwrap_or_else(|e| e.into_inner());
                    if !back && *last != error {
                        tracing::warn!(error = error.as_deref(), "database still unavailable");
                    }
                    *last = error;
                }
                if back {
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

/// One probe, through the pool (what requests need; a pool still holding connections answers
/// even when no new connection can be made, as at PostgreSQL's connection limit): the server
/// must accept writes, neither a standby nor read-only by `default_transaction_read_only` (else
/// every write would mark the outage again at once). A connection that finds it read-only is
/// closed, not returned. When the pool cannot answer within [`PROBE_TIMEOUT`], a connection of
/// its own says why (the pool retries a failing connection until its acquire timeout and then
/// reports only that).
async fn probe(pool: &sqlx::PgPool) -> Result<(), sqlx::Error> {
    let through_pool = async {
        let mut conn = pool.acquire().await?;
        let (read_only,): (bool,) = sqlx::query_as(
            "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::bool",
        )
        .fetch_one(&mut *conn)
        .await?;
        if read_only {
            let _ = sqlx::Connection::close(conn.detach()).await;
            return Err(standby_refused());
        }
        Ok(())
    };
    match tokio::time::timeout(PROBE_TIMEOUT, through_pool).await {
        Ok(result) => result,
        Err(_) => match tokio::time::timeout(PROBE_TIMEOUT, why_no_connection(pool)).await {
            Ok(Err(e)) => Err(e),
            _ => Err(sqlx::Error::PoolTimedOut),
        },
    }
}

/// A connection of its own with the pool's options: the error the pool would not name.
async fn why_no_connection(pool: &sqlx::PgPool) -> Result<(), sqlx::Error> {
    use sqlx::{ConnectOptions, Connection};
    let mut conn = pool.connect_options().connect().await?;
    let (standby,): (bool,) = sqlx::query_as("SELECT pg_is_in_recovery()")
        .fetch_one(&mut conn)
        .await?;
    let _ = conn.close().await;
    if standby {
        return Err(standby_refused());
    }
    Ok(())
}

/// The error a connection to a read-only server gets (issue #41): a standby
/// (`pg_is_in_recovery()`), which `serve::pool_options` refuses for every new connection so the
/// pool never holds one (after a failover the address in `DATABASE_URL`, a CloudNativePG `-rw`
/// Service or a DNS name, may lead to the demoted primary, now a replica, for a moment), or a
/// primary with `transaction_read_only` on, which the probe finds. An I/O error, so that
/// [`super::database_unavailable`] counts it as an outage (`503 database_unavailable`). sqlx
/// retries a connection its `after_connect` refused until the acquire timeout and then reports
/// `PoolTimedOut`, also an outage; the probe names this reason in `/readyz` and the log.
pub fn standby_refused() -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        "the database server is read-only (a standby: pg_is_in_recovery() is true, or \
         transaction_read_only is on); DATABASE_URL must lead to a primary that accepts writes",
    ))
}
