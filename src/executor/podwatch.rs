//! Shared pod watches (docs/design.md §4, §9): ONE watch of pods per namespace and pod label the
//! executor follows logs by (a Job's pods by [`super::logs::JOB_NAME_LABEL`], a BuildRun's by
//! [`super::logs::BUILDRUN_LABEL`]), selected by that label's presence and feeding a reflector
//! store. Every order's log follower subscribes to the pods of its own Job or BuildRun (the
//! label's value) and receives them from the store and from the watch's events, so the
//! executor's connections to the API server do not grow with the number of running Jobs: only the
//! log streams of running containers do, one each.
//!
//! A subscription sees every state the watch reports of its pods after it subscribed, and
//! [`PodSubscription::current`] gives the pods as the store holds them now: a subscriber that reads
//! both misses no pod. The Jobs' verdicts read the same store for pods on lost nodes
//! (`super::disruption`). Pods in the store keep only what those two read ([`keep_pod_fields`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodSpec};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::Store;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;

/// The shared pod watches of one executor, opened on first use per (namespace, label).
pub struct PodWatches {
    client: Client,
    open: Mutex<HashMap<(String, &'static str), Arc<PodWatch>>>,
}

/// How far a shared watch (of pods here, of nodes in `super::nodewatch`) is with its first list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Listing {
    /// Opened, nothing listed yet.
    Pending,
    /// Listed at least once: the store holds the objects.
    Listed,
    /// An error came before the first list (it is retried with backoff, and a later list makes
    /// it `Listed`).
    Failing,
}

impl Listing {
    /// A watch error: `Failing` if nothing was listed yet, so waiters stop waiting.
    pub(super) fn on_error(listing: &tokio::sync::watch::Sender<Listing>) {
        listing.send_if_modified(|l| {
            let first = *l == Listing::Pending;
            if first {
                *l = Listing::Failing;
            }
            first
        });
    }

    /// Waits until the watch has listed once or failed before it could.
    pub(super) async fn settled(mut listing: tokio::sync::watch::Receiver<Listing>) {
        let _ = listing.wait_for(|l| *l != Listing::Pending).await;
    }
}

/// Subscribers by label value: an id (to unsubscribe) and where their pods go.
type Subscribers = Arc<Mutex<HashMap<String, Vec<(u64, mpsc::UnboundedSender<Arc<Pod>>)>>>>;

/// One watch of the pods carrying a label in one namespace, and its store.
struct PodWatch {
    label: &'static str,
    store: Store<Pod>,
    /// Whether the pods have been listed, or the watch fails before it could list them.
    listing: tokio::sync::watch::Receiver<Listing>,
    subscribers: Subscribers,
    next_id: AtomicU64,
    _task: AbortOnDropHandle<()>,
}

impl PodWatches {
    /// No watch is opened before the first [`PodWatches::subscribe`].
    pub fn new(client: Client) -> Self {
        PodWatches {
            client,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// How many pod watches are open (one per namespace and label followed so far).
    pub fn open_watches(&self) -> usize {
        self.open.lock().unwrap().len()
    }

    /// Subscribes to the pods in `namespace` whose `label` is `value` (`label` is a `'static`
    /// label key: there is one watch per key, not per value).
    pub fn subscribe(&self, namespace: &str, label: &'static str, value: &str) -> PodSubscription {
        let watch = self
            .open
            .lock()
            .unwrap()
            .entry((namespace.to_string(), label))
            .or_insert_with(|| Arc::new(PodWatch::start(self.client.clone(), namespace, label)))
            .clone();
        let (tx, pods) = mpsc::unbounded_channel();
        let id = watch.next_id.fetch_add(1, Ordering::Relaxed);
        watch
            .subscribers
            .lock()
            .unwrap()
            .entry(value.to_string())
            .or_default()
            .push((id, tx));
        PodSubscription {
            watch,
            value: value.to_string(),
            id,
            pods,
        }
    }
}

impl PodWatch {
    fn start(client: Client, namespace: &str, label: &'static str) -> Self {
        let api: Api<Pod> = Api::namespaced(client, namespace);
        let writer = Writer::default();
        let store = writer.as_reader();
        let subscribers: Subscribers = Arc::default();
        let send_to = subscribers.clone();
        let (listing_tx, listing) = tokio::sync::watch::channel(Listing::Pending);
        let what = format!("pods with {label} in {namespace}");
        tracing::info!(watch = %what, "opening a shared pod watch");
        // The store is written before each event comes out of `reflect`, which is what makes a
        // subscription's `current()` and its events together complete.
        let events = watcher::watcher(api, watcher::Config::default().labels(label))
            .default_backoff()
            .modify(keep_pod_fields)
            .reflect(writer);
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                match event {
                    Ok(Event::Apply(pod) | Event::InitApply(pod)) => {
                        send(&send_to, label, Arc::new(pod))
                    }
                    Ok(Event::InitDone) => {
                        listing_tx.send_replace(Listing::Listed);
                    }
                    // A deleted pod's containers ended; their followers end with their logs.
                    Ok(Event::Delete(_) | Event::Init) => {}
                    Err(error) => {
                        tracing::debug!(%error, watch = %what, "pod watch error; it resumes");
                        Listing::on_error(&listing_tx);
                    }
                }
            }
        });
        PodWatch {
            label,
            store,
            listing,
            subscribers,
            next_id: AtomicU64::new(0),
            _task: AbortOnDropHandle::new(task),
        }
    }
}

/// Hands `pod` to the subscribers of its label value; drops the ones that went away.
fn send(subscribers: &Subscribers, label: &str, pod: Arc<Pod>) {
    let Some(value) = pod.metadata.labels.as_ref().and_then(|l| l.get(label)) else {
        return;
    };
    if let Some(subs) = subscribers.lock().unwrap().get_mut(value) {
        subs.retain(|(_, tx)| tx.send(pod.clone()).is_ok());
    }
}

/// One follower's view of the pods of its Job or BuildRun; unsubscribes when dropped.
pub struct PodSubscription {
    watch: Arc<PodWatch>,
    value: String,
    id: u64,
    pods: mpsc::UnboundedReceiver<Arc<Pod>>,
}

impl PodSubscription {
    /// The next state of one of the pods, as the watch reports it. Never `None` while the
    /// subscription lives (the watch resumes on its own after errors).
    pub async fn next(&mut self) -> Option<Arc<Pod>> {
        self.pods.recv().await
    }

    /// A state already reported and not yet taken with [`PodSubscription::next`], if any.
    pub fn try_next(&mut self) -> Option<Arc<Pod>> {
        self.pods.try_recv().ok()
    }

    /// Waits until the watch has listed the pods once (a pod that ended before the watch was
    /// opened is then in [`PodSubscription::current`]), or has failed before it could (no right
    /// to list pods, API server away): then nothing more is to be had by waiting.
    pub async fn listed(&self) {
        Listing::settled(self.watch.listing.clone()).await;
    }

    /// The pods as the store holds them now (empty before the first list).
    pub fn current(&self) -> Vec<Arc<Pod>> {
        let (label, value) = (self.watch.label, self.value.as_str());
        self.watch.store.state_filter(|pod| {
            pod.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(label))
                .is_some_and(|v| v == value)
        })
    }
}

impl Drop for PodSubscription {
    fn drop(&mut self) {
        let mut subscribers = self.watch.subscribers.lock().unwrap();
        if let Some(subs) = subscribers.get_mut(&self.value) {
            subs.retain(|(id, _)| *id != self.id);
            if subs.is_empty() {
                subscribers.remove(&self.value);
            }
        }
    }
}

/// Keeps of a pod only what log following and the disruption rules (`super::disruption`) read:
/// its name, namespace, labels, creation and deletion times, node, phase, `DisruptionTarget`
/// condition, and per container its name, restart count and state; everything else (the rest of
/// the spec, annotations, managed fields, other conditions, images) is dropped, so memory is a few
/// hundred bytes per pod.
pub fn keep_pod_fields(pod: &mut Pod) {
    let meta = &mut pod.metadata;
    meta.annotations = None;
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.finalizers = None;
    let node_name = pod.spec.take().and_then(|s| s.node_name);
    pod.spec = node_name.map(|node_name| PodSpec {
        node_name: Some(node_name),
        ..PodSpec::default()
    });
    let Some(status) = pod.status.take() else {
        return;
    };
    let slim = |statuses: Option<Vec<ContainerStatus>>| {
        statuses.map(|all| {
            all.into_iter()
                .map(|c| ContainerStatus {
                    name: c.name,
                    restart_count: c.restart_count,
                    state: c.state,
                    ..ContainerStatus::default()
                })
                .collect()
        })
    };
    let disruption = status.conditions.and_then(|c| {
        let kept: Vec<_> = c
            .into_iter()
            .filter(|c| c.type_ == "DisruptionTarget")
            .collect();
        (!kept.is_empty()).then_some(kept)
    });
    pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
        phase: status.phase,
        conditions: disruption,
        init_container_statuses: slim(status.init_container_statuses),
        container_statuses: slim(status.container_statuses),
        ..Default::default()
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_stored_pod_keeps_what_logs_and_disruption_rules_read() {
        let mut pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "labels": {"batch.kubernetes.io/job-name": "j"},
                         "annotations": {"a": "b"}, "managedFields": [{"manager": "m"}]},
            "spec": {"containers": [{"name": "main", "image": "busybox"}], "nodeName": "n1"},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"},
                                                          {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}],
                       "containerStatuses": [{"name": "main", "image": "busybox", "imageID": "x",
                                              "ready": true, "restartCount": 2,
                                              "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]},
        }))
        .unwrap();
        keep_pod_fields(&mut pod);
        assert_eq!(
            serde_json::to_value(&pod).unwrap(),
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "namespace": "ns",
                             "labels": {"batch.kubernetes.io/job-name": "j"}},
                "spec": {"containers": [], "nodeName": "n1"},
                "status": {"phase": "Running",
                           "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}],
                           "containerStatuses": [{"name": "main", "image": "", "imageID": "",
                                                  "ready": false, "restartCount": 2,
                                                  "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]},
            })
        );
    }
}
