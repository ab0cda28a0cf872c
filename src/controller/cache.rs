//! What the WorkOrder controller keeps of each resource (issue #16): its metadata, spec without
//! the payload, and status, so memory grows with the number of WorkOrders and not with the size
//! of their `yamlContent` (the queue row already holds the YAML; the reconciler reads the object
//! once when it must create that row). Plus an index from `metadata.uid` (= work-order id) to
//! the resource, so a queue change finds its resource in O(1) instead of scanning the cache.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures::{Stream, StreamExt, TryStreamExt};
use kube::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use uuid::Uuid;

use crate::crd::WorkOrderResource;

/// Annotation `kubectl apply` (client-side) writes: the whole applied object, payload included.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// Objects per page of the initial list: each page is decoded whole before it is stripped, so
/// this bounds the transient memory of a (re)list to `LIST_PAGE` × the largest WorkOrder (1 MiB).
const LIST_PAGE: u32 = 50;

/// Drops what the controller never reads back from its cache: `spec.yamlContent` (up to 1 MiB),
/// the last-applied annotation (a second copy of it) and `managedFields`. The object is then
/// only good for reading metadata, the rest of the spec and the status; anything that needs the
/// YAML reads the object from the API server.
pub fn strip(wo: &mut WorkOrderResource) {
    wo.spec.yaml_content = String::new();
    wo.metadata.managed_fields = None;
    if let Some(annotations) = wo.metadata.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

/// `metadata.uid` → the resource, kept by the watch stream (see [`watch`]).
#[derive(Clone, Default)]
pub struct UidIndex {
    inner: Arc<Mutex<IndexState>>,
}

#[derive(Default)]
struct IndexState {
    live: HashMap<Uuid, ObjectRef<WorkOrderResource>>,
    /// Filled during a (re)list, swapped in at its end so objects deleted meanwhile drop out.
    relisting: Option<HashMap<Uuid, ObjectRef<WorkOrderResource>>>,
}

fn uid(wo: &WorkOrderResource) -> Option<Uuid> {
    wo.metadata.uid.as_deref().and_then(|u| u.parse().ok())
}

impl UidIndex {
    /// The resource whose uid is `id`, if the controller sees it.
    pub fn get(&self, id: Uuid) -> Option<ObjectRef<WorkOrderResource>> {
        self.lock().live.get(&id).cloned()
    }

    /// Number of resources indexed.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().live.len()
    }

    /// True when no resource is indexed.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, IndexState> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn observe(&self, event: &watcher::Event<WorkOrderResource>) {
        let mut state = self.lock();
        match event {
            watcher::Event::Apply(wo) => {
                if let Some(id) = uid(wo) {
                    state.live.insert(id, ObjectRef::from_obj(wo));
                }
            }
            watcher::Event::Delete(wo) => {
                if let Some(id) = uid(wo) {
                    state.live.remove(&id);
                }
            }
            watcher::Event::Init => state.relisting = Some(HashMap::new()),
            watcher::Event::InitApply(wo) => {
                if let (Some(id), Some(buffer)) = (uid(wo), state.relisting.as_mut()) {
                    buffer.insert(id, ObjectRef::from_obj(wo));
                }
            }
            watcher::Event::InitDone => {
                if let Some(buffer) = state.relisting.take() {
                    state.live = buffer;
                }
            }
        }
    }
}

/// The WorkOrders of `api`, stripped (see [`strip`]) before they reach the cache: the stream of
/// changed objects for `Controller::for_stream`, the cache it reads, and the uid index.
pub fn watch(
    api: Api<WorkOrderResource>,
) -> (
    impl Stream<Item = Result<WorkOrderResource, watcher::Error>> + Send + 'static,
    Store<WorkOrderResource>,
    UidIndex,
) {
    let (reader, writer) = reflector::store();
    let index = UidIndex::default();
    let observer = index.clone();
    let stream = watcher(api, watcher::Config::default().page_size(LIST_PAGE))
        .default_backoff()
        .modify(strip)
        .inspect_ok(move |event| observer.observe(event))
        .reflect(writer)
        .applied_objects()
        .boxed();
    (stream, reader, index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{CrdWorkType, WorkOrderResourceSpec, WorkOrderTargeting};

    fn resource(name: &str, uid: Uuid) -> WorkOrderResource {
        let mut wo = WorkOrderResource::new(
            name,
            WorkOrderResourceSpec {
                work_type: CrdWorkType::Custom,
                yaml_content: "x".repeat(900 * 1024),
                max_retries: 3,
                backoff_seconds: 60,
                claim_timeout_seconds: 3600,
                max_reclaims: 5,
                tenant: None,
                targeting: WorkOrderTargeting {
                    labels: vec!["a".into()],
                    ..Default::default()
                },
                ttl_seconds_after_finished: Some(5),
            },
        );
        wo.metadata.namespace = Some("ns".into());
        wo.metadata.uid = Some(uid.to_string());
        wo.metadata.annotations = Some(
            [
                (LAST_APPLIED.to_string(), "y".repeat(900 * 1024)),
                ("keep".to_string(), "me".to_string()),
            ]
            .into(),
        );
        wo
    }

    #[test]
    fn stripping_drops_the_payload_and_keeps_the_rest() {
        let mut wo = resource("a", Uuid::from_u128(1));
        strip(&mut wo);
        assert!(wo.spec.yaml_content.is_empty());
        let annotations = wo.metadata.annotations.as_ref().unwrap();
        assert!(!annotations.contains_key(LAST_APPLIED));
        assert_eq!(annotations.get("keep").map(String::as_str), Some("me"));
        assert_eq!(wo.spec.ttl_seconds_after_finished, Some(5));
        assert_eq!(wo.spec.targeting.labels, vec!["a".to_string()]);
    }

    #[test]
    fn the_index_follows_applies_deletes_and_relists() {
        let index = UidIndex::default();
        let (a, b, c) = (Uuid::from_u128(1), Uuid::from_u128(2), Uuid::from_u128(3));
        index.observe(&watcher::Event::Init);
        index.observe(&watcher::Event::InitApply(resource("a", a)));
        index.observe(&watcher::Event::InitApply(resource("b", b)));
        assert!(index.is_empty(), "a list in progress is not yet the truth");
        index.observe(&watcher::Event::InitDone);
        assert_eq!(index.get(a).unwrap().name, "a");
        assert_eq!(index.get(b).unwrap().namespace.as_deref(), Some("ns"));
        index.observe(&watcher::Event::Apply(resource("c", c)));
        index.observe(&watcher::Event::Delete(resource("a", a)));
        assert!(index.get(a).is_none());
        assert_eq!(index.get(c).unwrap().name, "c");
        // A relist that no longer sees b (deleted while the watch was down) drops it.
        index.observe(&watcher::Event::Init);
        index.observe(&watcher::Event::InitApply(resource("c", c)));
        index.observe(&watcher::Event::InitDone);
        assert!(index.get(b).is_none());
        assert_eq!(index.len(), 1);
    }
}
