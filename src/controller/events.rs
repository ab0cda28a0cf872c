//! Kubernetes Events the controller records (docs/design.md §6: a WorkOrder's phase changes, an
//! Executor's agent registered, rotated, retired), off the reconcile path and at flat cost.
//!
//! Off the reconcile path: the status is what `kubectl wait` and GitOps tools read; an Event is
//! for people. A reconcile hands its Event to a bounded queue that a few tasks drain, so a burst
//! of transitions (a thousand orders finishing at once) neither holds reconcile slots for Event
//! round trips nor piles up without bound: with the queue full the Event is dropped, logged at
//! debug and counted (`pullman_controller_events_dropped_total`), as the API server itself drops
//! Events under load (issue #16).
//!
//! At flat cost: kube-runtime's `Recorder` keeps each Event it published for six minutes, to
//! fold a repeat into a series, and sweeps that whole cache on every publish under one lock: with
//! thousands of WorkOrders changing phase, memory and work per Event grow with the Events of the
//! last six minutes. Ours are each a transition of one object, with little to fold, so each is
//! published by a `Recorder` of its own: kube's Event shape (reporting controller and instance,
//! `regarding`, series), without the shared cache.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, Recorder, Reporter};
use tokio::sync::mpsc;

/// Events waiting to be recorded before new ones are dropped.
pub const EVENT_QUEUE: usize = 1024;

/// Events recorded at once (each is one request to the API server).
pub const EVENT_WORKERS: usize = 4;

/// Longest Event note, in bytes: the API server refuses a longer one (events.k8s.io/v1 `note`),
/// and the Event would be lost.
const MAX_NOTE_BYTES: usize = 1024;

/// `note` cut at a character boundary to at most [`MAX_NOTE_BYTES`].
fn cut(mut note: String) -> String {
    note.truncate(note.floor_char_boundary(MAX_NOTE_BYTES));
    note
}

/// Hands Events to the tasks that record them; cheap to clone. The tasks end once every clone
/// is dropped and the queue is drained.
#[derive(Clone)]
pub struct Events {
    queue: mpsc::Sender<(Event, ObjectReference)>,
}

impl Events {
    /// Starts the recording tasks on the current Tokio runtime; `reporter` names the controller
    /// and this replica in every Event.
    pub fn start(client: Client, reporter: Reporter) -> Self {
        let (queue, pending) = mpsc::channel::<(Event, ObjectReference)>(EVENT_QUEUE);
        let reporter = Arc::new(reporter);
        let pending = futures::stream::unfold(pending, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        tokio::spawn(pending.for_each_concurrent(EVENT_WORKERS, move |(event, regarding)| {
            let recorder = Recorder::new(client.clone(), (*reporter).clone());
            async move {
                if let Err(error) = recorder.publish(&event, &regarding).await {
                    tracing::debug!(%error, reason = %event.reason, "could not record an event");
                }
            }
        }));
        Events { queue }
    }

    /// Queues `event` about `regarding`; never waits. Its note is cut to what the API server
    /// takes ([`MAX_NOTE_BYTES`]). Dropped (and counted) when the queue is full.
    pub fn record(&self, mut event: Event, regarding: ObjectReference) {
        event.note = event.note.map(cut);
        if let Err(mpsc::error::TrySendError::Full((event, _))) =
            self.queue.try_send((event, regarding))
        {
            crate::telemetry::controller_metrics().events_dropped.inc();
            tracing::debug!(reason = %event.reason, "event queue full; event dropped");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_notes_are_cut_to_what_the_api_server_takes() {
        let note = cut(format!("a{}", "é".repeat(5000)));
        // 1 byte, then two-byte characters: 1023 bytes is the last boundary within the limit.
        assert_eq!(note.len(), MAX_NOTE_BYTES - 1);
        assert!(note.ends_with('é'));
        assert_eq!(cut("short".into()), "short");
    }
}
