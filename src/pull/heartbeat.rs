//! Heartbeats of one claimed order (docs/design.md §2, §5): every lease/3 while the order is carried
//! out, each saying what holds the order up ([`Progress`], §12). A refusal is handed to the
//! order's state machine as the reason to abandon it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;
use uuid::Uuid;

use super::Abandon;
use crate::client::Client;
use crate::wire::ClaimWaiting;

/// What holds a claimed order up, as its carrier says it (docs/design.md §12: a pod that may
/// still run on a node that does not report). Every heartbeat carries it, and a change goes out
/// at once rather than at the next interval.
#[derive(Clone, Debug, Default)]
pub struct Progress(Arc<watch::Sender<Option<ClaimWaiting>>>);

impl Progress {
    /// Says what holds the order up now (`None`: nothing); saying the same again sends nothing.
    pub fn set(&self, waiting: Option<ClaimWaiting>) {
        self.0.send_if_modified(|now| {
            let changed = *now != waiting;
            if changed {
                *now = waiting;
            }
            changed
        });
    }

    /// What was said last.
    pub fn current(&self) -> Option<ClaimWaiting> {
        self.0.borrow().clone()
    }
}

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
    /// after the claim), and at once whenever `progress` changes.
    pub fn start(
        client: Client,
        agent_id: Uuid,
        order_id: Uuid,
        claim_id: Option<Uuid>,
        every: Duration,
        progress: &Progress,
    ) -> Self {
        let (tx, rx) = oneshot::channel();
        let mut said = progress.0.subscribe();
        let task = async move {
            let mut tick = tokio::time::interval(every);
            // A heartbeat that hung is not followed by a burst of them.
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            let mut failing: u32 = 0;
            // A server older than docs/design.md §12 refuses the field (422), and one that finds
            // it out of bounds says 400: the lease matters more than the news, so heartbeats go
            // on without it until there is news again (in a rolling upgrade the next one may
            // reach a newer replica).
            let mut may_say = true;
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    Ok(()) = said.changed() => may_say = true,
                }
                let waiting = said.borrow_and_update().clone().filter(|_| may_say);
                let sent = client
                    .heartbeat(order_id, agent_id, claim_id, waiting.as_ref())
                    .await;
                let sent = match sent {
                    Err(e) if waiting.is_some() && e.is_refused_body() => {
                        tracing::warn!(error = %e, "the server refused what holds the order up \
                            (older than docs/design.md §12, or out of bounds); heartbeats go on \
                            without it");
                        may_say = false;
                        client.heartbeat(order_id, agent_id, claim_id, None).await
                    }
                    other => other,
                };
                match sent {
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use axum::Json;
    use axum::extract::State;
    use axum::http::StatusCode;
    use axum::routing::post;
    use serde_json::{Value, json};

    use super::*;
    use crate::wire::{NodeWait, WaitReason};

    /// A server older than docs/design.md §12: `waiting` is an unknown field (422).
    async fn old_server(
        State(seen): State<Arc<Mutex<Vec<Value>>>>,
        Json(body): Json<Value>,
    ) -> (StatusCode, Json<Value>) {
        let known = body.get("waiting").is_none();
        seen.lock().unwrap().push(body);
        if known {
            (
                StatusCode::OK,
                Json(json!({"lease_expires_at": null, "claim_expires_at": "2030-01-01T00:00:00Z"})),
            )
        } else {
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                Json(
                    json!({"error": {"code": "invalid_body", "message": "unknown field `waiting`"}}),
                ),
            )
        }
    }

    #[tokio::test]
    async fn a_change_goes_out_at_once_and_a_server_that_refuses_it_still_gets_heartbeats() {
        let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
        let app = axum::Router::new()
            .route("/api/v1/work-orders/{id}/heartbeat", post(old_server))
            .with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let client = Client::new(&base, "t").unwrap();
        let progress = Progress::default();
        let mut beats = Heartbeats::start(
            client,
            Uuid::new_v4(),
            Uuid::new_v4(),
            None,
            Duration::from_secs(3600),
            &progress,
        );
        progress.set(Some(ClaimWaiting {
            reason: WaitReason::NodeUnreachable,
            message: "pod p may still run on node n1".into(),
            node: NodeWait {
                name: "n1".into(),
                since: None,
            },
        }));
        // Long before the hour's interval: the change itself sends one, refused, then one without.
        tokio::time::timeout(Duration::from_secs(10), async {
            while seen.lock().unwrap().len() < 2 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("a heartbeat at the change");
        let bodies = seen.lock().unwrap().clone();
        assert_eq!(bodies[0]["waiting"]["node"]["name"], "n1", "{bodies:?}");
        assert!(bodies[1].get("waiting").is_none(), "{bodies:?}");
        assert!(
            beats.refused_now().is_none(),
            "a refused field is not a refused claim"
        );
        // Saying the same again is no news: nothing more goes out.
        progress.set(progress.current());
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(seen.lock().unwrap().len(), 2);
    }
}
