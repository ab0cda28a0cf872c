//! `LISTEN/NOTIFY` fan-in (docs/design.md §5, §6): one listening connection per process turns the
//! database's notifications into in-process signals, so long-polling claimers and the controller
//! wake on changes instead of polling.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::Queue;
use super::wake::{Notice, WaitList};

/// Channel notified when an order becomes claimable (payload: JSON with its id, work type,
/// tenant and targeting; see [`Notice`]).
pub const CLAIMABLE_CHANNEL: &str = "pullman_claimable";
/// Channel notified on every state change of an order created from a `WorkOrder` resource
/// (payload: its id).
pub const CHANGED_CHANNEL: &str = "pullman_work_order_changed";
/// Channel notified when output of an order is stored (payload: its id; docs/design.md §9).
pub const OUTPUT_CHANNEL: &str = "pullman_output";

/// In-process view of the queue's notifications. Cheap to clone.
#[derive(Clone)]
pub struct Notifications {
    waits: Arc<WaitList>,
    changed: broadcast::Sender<Option<Uuid>>,
    /// Orders whose output grew; `None`: anything may have (the listener reconnected).
    output: broadcast::Sender<Option<Uuid>>,
    /// Cancelled when the server stops: held long-polls end at once (docs/design.md §7).
    draining: CancellationToken,
}

impl Default for Notifications {
    fn default() -> Self {
        Self::new()
    }
}

impl Notifications {
    /// Signals with no listener attached; [`spawn_listener`] feeds them.
    pub fn new() -> Self {
        Notifications {
            waits: Arc::new(WaitList::new()),
            changed: broadcast::channel(4096).0,
            output: broadcast::channel(4096).0,
            draining: CancellationToken::new(),
        }
    }

    /// Ends every held long-poll and every one that starts later (docs/design.md §7: held long-polls
    /// are answered at once when `serve` stops). Each ends after its current claim attempt, so
    /// no order is claimed without its answer reaching the agent.
    pub fn stop_waiting(&self) {
        self.draining.cancel();
    }

    /// Resolves once [`Self::stop_waiting`] was called.
    pub(crate) fn draining(&self) -> &CancellationToken {
        &self.draining
    }

    /// The long-polling claimers of this process, woken one per claimable order.
    pub(crate) fn waits(&self) -> &Arc<WaitList> {
        &self.waits
    }

    /// Ids of orders that changed; `None` means "anything may have changed" (the listener
    /// reconnected and notifications may have been lost).
    pub fn changed(&self) -> broadcast::Receiver<Option<Uuid>> {
        self.changed.subscribe()
    }

    /// Ids of orders whose output was stored (followers of that order read on); `None` means
    /// "anything may have changed". A receiver that lags has missed some: it reads anyway.
    pub fn output_stored(&self) -> broadcast::Receiver<Option<Uuid>> {
        self.output.subscribe()
    }

    fn wake_all(&self) {
        self.waits.wake_everyone();
        let _ = self.changed.send(None);
        let _ = self.output.send(None);
    }
}

/// Listens on the queue's channels until `shutdown`, reconnecting after failures. After any
/// interruption every waiter is woken, because notifications sent meanwhile are lost. A lost
/// connection is usually the first sign of a database outage, so it marks the database down
/// (see [`Queue::note_database_unavailable`]) until a probe finds it back.
pub fn spawn_listener(
    queue: &Queue,
    notifications: Notifications,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let queue = queue.clone();
    tokio::spawn(async move {
        let pool = queue.pool().clone();
        loop {
            let result = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = listen(&pool, &notifications) => r,
            };
            match result {
                Ok(()) => {
                    tracing::warn!("queue notification listener lost its connection; reconnecting");
                    queue.note_database_unavailable();
                }
                Err(error) => {
                    tracing::warn!(%error, "queue notification listener failed; reconnecting");
                    if super::database_unavailable(&error) {
                        queue.note_database_unavailable();
                    }
                }
            }
            notifications.wake_all();
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    })
}

async fn listen(pool: &PgPool, n: &Notifications) -> Result<(), sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    // Report a lost connection at once instead of first reconnecting through the pool (which
    // waits out its acquire timeout while the database is down): the loss is how an outage
    // becomes known, and the caller reconnects.
    listener.eager_reconnect(false);
    listener
        .listen_all([CLAIMABLE_CHANNEL, CHANGED_CHANNEL, OUTPUT_CHANNEL])
        .await?;
    // Anything that happened before LISTEN took effect is unseen: wake everyone once.
    n.wake_all();
    loop {
        // try_recv reports a lost connection as Ok(None) instead of silently reconnecting.
        match listener.try_recv().await? {
            Some(msg) if msg.channel() == CLAIMABLE_CHANNEL => match Notice::parse(msg.payload()) {
                Some(notice) => n.waits.notify(notice),
                None => n.waits.wake_everyone(),
            },
            Some(msg) if msg.channel() == OUTPUT_CHANNEL => {
                let _ = n.output.send(Uuid::parse_str(msg.payload()).ok());
            }
            Some(msg) => {
                let _ = n.changed.send(Uuid::parse_str(msg.payload()).ok());
            }
            None => return Ok(()),
        }
    }
}

/// How long [`check_delivery`] waits for its own notification.
pub const DELIVERY_CHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest [`check_delivery`] takes in all (connecting, LISTEN, NOTIFY and the wait): a NOTIFY
/// commits, and a commit that waits for a synchronous standby that is not there waits for ever.
pub const DELIVERY_CHECK_LIMIT: Duration = Duration::from_secs(30);

/// Checks at start that notifications reach a listening session (issue #41): `LISTEN` on a
/// connection of its own, `NOTIFY` from a pooled one, the notification within
/// [`DELIVERY_CHECK_TIMEOUT`]. Through a transaction-mode pooler (PgBouncer's `pool_mode =
/// transaction`, a CloudNativePG `Pooler` with `poolMode: transaction`) the listening session's
/// server connection goes back to the pooler after each statement: the notification never
/// arrives, or comes back on the connection that sent it. Claim wake-ups, the controller's
/// wake-ups and live output followers would silently stall, so `serve` refuses to start instead.
///
/// # Errors
/// The notification did not arrive or came back (the message names the likely cause and the
/// fix); the database failed (its error, not a guess); the whole check took longer than
/// [`DELIVERY_CHECK_LIMIT`].
pub async fn check_delivery(pool: &PgPool) -> Result<(), String> {
    tokio::time::timeout(DELIVERY_CHECK_LIMIT, delivery(pool))
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "the database did not complete LISTEN and NOTIFY within {DELIVERY_CHECK_LIMIT:?} \
                 (a commit waiting for a synchronous standby that is not there?)"
            ))
        })
}

async fn delivery(pool: &PgPool) -> Result<(), String> {
    let pooled = |what: &str| {
        format!(
            "{what}: Pullman needs session connections for LISTEN (claim wake-ups, the \
             controller, live output). DATABASE_URL seems to lead through a transaction-mode \
             pooler (PgBouncer pool_mode = transaction, a CloudNativePG Pooler with poolMode: \
             transaction); point it at the database itself (CloudNativePG: the <cluster>-rw \
             Service, the <cluster>-app Secret's uri) or at a session-mode pooler"
        )
    };
    let channel = format!("pullman_delivery_check_{}", Uuid::new_v4().simple());
    let mut listener = PgListener::connect_with(pool)
        .await
        .map_err(|e| format!("connecting to LISTEN: {e}"))?;
    listener
        .listen(&channel)
        .await
        .map_err(|e| format!("LISTEN: {e}"))?;
    // The simple protocol, as LISTEN's: a transaction-mode pooler gets this far (a prepared
    // statement may not survive to its execution there). The channel is ours, a bare identifier.
    match sqlx::raw_sql(&format!("NOTIFY {channel}"))
        .execute(pool)
        .await
    {
        Ok(_) => {}
        // The pooler ran the NOTIFY on the server connection the LISTEN had run on, so the
        // notification came back to the pooled connection that sent it.
        Err(sqlx::Error::Protocol(m)) if m.contains("NotificationResponse") => {
            return Err(pooled(
                "a notification came back on the connection that sent it, not the listening one",
            ));
        }
        Err(e) => return Err(format!("NOTIFY: {e}")),
    }
    let received = tokio::time::timeout(DELIVERY_CHECK_TIMEOUT, async {
        loop {
            match listener.try_recv().await {
                Ok(Some(n)) if n.channel() == channel => return Ok(()),
                Ok(Some(_)) => continue,
                Ok(None) => return Err("the listening connection was lost".to_string()),
                Err(e) => return Err(format!("waiting for the notification: {e}")),
            }
        }
    })
    .await;
    match received {
        // The listener's connection goes back to the pool when dropped (after its UNLISTEN).
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(pooled(&format!(
            "a notification did not reach the listening session within {DELIVERY_CHECK_TIMEOUT:?}"
        ))),
    }
}
