//! Heartbeats of one claimed order (docs/design.md §2, §5): every lease/3 while the order is carried
//! out. A refusal is handed to the order's state machine as the reason to abandon it.

use std::time::Duration;

use tokio::sync::oneshot;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;
use uuid::Uuid;

use super::Abandon;
use crate::client::Client;

/// The heartbeat interval of docs/design.md §4: a third of the lease (`lease_seconds`), at
/// least 1 s.
pub fn lease_third(lease_seconds: u32) -> Duration {
    Duration::from_secs(u64::from(lease_seconds.max(3)) / 3)
}

/// The running heartbeats of one order; they stop when this is dropped, so an abandoned order's
/// lease can lapse.
pub struct Heartbeats {
    _task: AbortOnDropHandle<()>,
    refused: Option<oneshot::Receiver<Abandon>>,
}

impl Heartbeats {
    /// Starts heartbeating `order_id` under `claim_id` every `every` (the first one an interval
    /// after the claim).
    pub fn start(
        client: Client,
        agent_id: Uuid,
        order_id: Uuid,
        claim_id: Option<Uuid>,
        every: Duration,
    ) -> Self {
        let (tx, rx) = oneshot::channel();
        let task = async move {
            let mut tick = tokio::time::interval(every);
            // A heartbeat that hung is not followed by a burst of them.
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            let mut failing: u32 = 0;
            loop {
                tick.tick().await;
                match client.heartbeat(order_id, agent_id, claim_id).await {
                    Ok(_) => {
                        if failing > 0 {
                            tracing::info!(failed = failing, "heartbeat delivered again");
                            failing = 0;
                        }
                    }
                    Err(e) if e.is_conflict() => {
                        tracing::warn!(error = %e, "heartbeat refused; stopping work on the order");
                        let why = if e.code() == Some("cancelled") {
                            Abandon::Cancelled
                        } else {
                            Abandon::Reclaimed
                        };
                        let _ = tx.send(why);
                        return;
                    }
                    Err(e) if e.is_unauthorized() => {
                        tracing::error!(error = %e, "heartbeat refused the token; stopping work on the order");
                        let _ = tx.send(Abandon::Unauthorized);
                        return;
                    }
                    // Said once per outage, not at every check-in (the worker's is a second).
                    Err(e) => {
                        failing += 1;
                        if failing == 1 {
                            tracing::warn!(error = %e, "heartbeat failed; retrying at each interval");
                        } else {
                            tracing::debug!(error = %e, failing, "heartbeat failed again");
                        }
                    }
                }
            }
        };
        Heartbeats {
            _task: AbortOnDropHandle::new(tokio::spawn(task.in_current_span())),
            refused: Some(rx),
        }
    }

    /// Resolves when a heartbeat was refused, with the reason; never resolves otherwise.
    pub async fn refused(&mut self) -> Abandon {
        match self.refused.as_mut() {
            Some(rx) => match rx.await {
                Ok(why) => why,
                Err(_) => {
                    self.refused = None;
                    std::future::pending().await
                }
            },
            None => std::future::pending().await,
        }
    }

    /// The refusal if one came already.
    pub fn refused_now(&mut self) -> Option<Abandon> {
        self.refused.as_mut()?.try_recv().ok()
    }
}
