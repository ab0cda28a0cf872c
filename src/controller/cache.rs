//! What the WorkOrder controller keeps of each resource (issue #16): its metadata, spec without
//! the payload, and status, so memory grows with the number of WorkOrders and not with the size
//! of their `yamlContent` (the queue row already holds the YAML). Plus an index from
//! `metadata.uid` (= work-order id) to the resource, so a queue change finds its resource in O(1)
//! instead of scanning the cache.
//!
//! The reconciler needs a WorkOrder's YAML once, to create its queue row. The watch already
//! delivered it, so the payloads of WorkOrders not yet queued are set aside ([`Payloads`], within
//! [`PAYLOAD_BUDGET`] bytes) until that reconcile takes them; saving each new WorkOrder a read
//! from the API server. One that did not fit is read once from the API server instead.

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
/// Most bytes of `yamlContent` set aside for WorkOrders waiting to be queued (see [`Payloads`]).
pub const PAYLOAD_BUDGET: usize = 8 * 1024 * 1024;

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

/// The `yamlContent` of WorkOrders not yet queued, by uid, as the watch delivered it (a
/// WorkOrder's spec is immutable, so it cannot go stale), within [`PAYLOAD_BUDGET`] bytes.
/// Taken by the reconcile that queues the order; dropped when the WorkOrder gets a phase or is
/// deleted.
#[derive(Clone, Default)]
pub struct Payloads {
    inner: Arc<Mutex<PayloadState>>,
}

#[derive(Default)]
struct PayloadState {
    by_uid: HashMap<Uuid, String>,
    bytes: usize,
}

impl Payloads {
    /// The payload of WorkOrder `id`, removed from the set; `None` when it was not set aside
    /// (over budget, or the watch restarted): then read the object.
    pub fn take(&self, id: Uuid) -> Option<String> {
        let mut state = self.lock();
        let yaml = state.by_uid.remove(&id)?;
        state.bytes -= yaml.len();
        Some(yaml)
    }

    /// Bytes set aside now.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.lock().bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PayloadState> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets aside the payload of `wo` if it waits to be queued (no phase yet) and fits; forgets
    /// it once the WorkOrder has a phase.
    fn keep(&self, wo: &mut WorkOrderResource) {
        let Some(id) = uid(wo) else { return };
        let mut state = self.lock();
        if let Some(old) = state.by_uid.remove(&id) {
            state.bytes -= old.len();
        }
        let waiting = wo.status.as_ref().is_none_or(|s| s.phase.is_none());
        let size = wo.spec.yaml_content.len();
        if waiting && size > 0 && state.bytes + size <= PAYLOAD_BUDGET {
            state.bytes += size;
            state
                .by_uid
                .insert(id, std::mem::take(&mut wo.spec.yaml_content));
        }
    }

    /// Drops the payload of a deleted WorkOrder, and every payload when the watch relists (the
    /// list sets aside again those still waiting; one deleted while the watch was down is gone).
    fn follow(&self, event: &watcher::Event<WorkOrderResource>) {
        match event {
            watcher::Event::Delete(wo) => {
                if let Some(id) = uid(wo) {
                    let mut state = self.lock();
                    if let Some(old) = state.by_uid.remove(&id) {
                        state.bytes -= old.len();
                    }
                }
            }
            watcher::Event::Init => *self.lock() = PayloadState::default(),
            _ => {}
        }
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

    /// Follows one watch event (done by [`watch`]'s stream; open to the controller's tests).
    pub(in crate::controller) fn observe(&self, event: &watcher::Event<WorkOrderResource>) {
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

/// What [`watch`] gives the WorkOrder controller.
pub struct Watched<S> {
    /// Changed objects, stripped (see [`strip`]), for `Controller::for_stream`.
    pub objects: S,
    /// The cache `objects` fills.
    pub store: Store<WorkOrderResource>,
    pub index: UidIndex,
    pub payloads: Payloads,
}

/// Watches the WorkOrders of `api`; each is stripped (see [`strip`]) before it reaches the
/// cache, its payload set aside first when it waits to be queued.
pub fn watch(
    api: Api<WorkOrderResource>,
) -> Watched<impl Stream<Item = Result<WorkOrderResource, watcher::Error>> + Send + 'static> {
    let (store, writer) = reflector::store();
    let index = UidIndex::default();
    let payloads = Payloads::default();
    let (observer, keeper, forgetter) = (index.clone(), payloads.clone(), payloads.clone());
    let objects = watcher(api, watcher::Config::default().page_size(LIST_PAGE))
        .default_backoff()
        .modify(move |wo| {
            keeper.keep(wo);
            strip(wo);
        })
        .inspect_ok(move |event| {
            forgetter.follow(event);
            observer.observe(event);
        })
        .reflect(writer)
        .applied_objects()
        .boxed();
    Watched {
        objects,
        store,
        index,
        payloads,
    }
}

#[cfg(test)]
pub(in crate::controller) mod tests {
    use super::*;
    use crate::crd::{CrdWorkType, WorkOrderResourceSpec, WorkOrderTargeting};

    /// A WorkOrder in namespace `ns` with a 900 KiB payload.
    pub(in crate::controller) fn resource(name: &str, uid: Uuid) -> WorkOrderResource {
        let mut wo = WorkOrderResource::new(
            name,
            WorkOrderResourceSpec {
                work_type: CrdWorkType::Custom,
                yaml_content: "x".repeat(900 * 1024),
                max_retries: 3,
                backoff_seconds: 60,
                claim_timeout_seconds: 3600,
                max_reclaims: 5,
                priority: 0,
                concurrency: None,
                tenant: None,
                targeting: WorkOrderTargeting {
                    labels: vec!["a".into()],
                    ..Default::default()
                },
                retry_on_disruption: Default::default(),
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

    fn small(name: &str, id: Uuid, kib: usize) -> WorkOrderResource {
        let mut wo = resource(name, id);
        wo.spec.yaml_content = "y".repeat(kib * 1024);
        wo
    }

    #[test]
    fn payloads_wait_within_the_budget_until_taken_or_the_order_moves_on() {
        let payloads = Payloads::default();
        let (a, b, c) = (Uuid::from_u128(1), Uuid::from_u128(2), Uuid::from_u128(3));
        let mut wo = small("a", a, 4);
        payloads.keep(&mut wo);
        assert!(wo.spec.yaml_content.is_empty(), "moved out, not copied");
        assert_eq!(payloads.bytes(), 4096);
        // Seen again before it is queued (the finalizer added): still one copy.
        payloads.keep(&mut small("a", a, 4));
        assert_eq!(payloads.bytes(), 4096);
        // Over the budget: not kept (the reconcile reads the object instead).
        let budget_kib = PAYLOAD_BUDGET / 1024;
        payloads.keep(&mut small("b", b, budget_kib));
        assert_eq!(payloads.take(b), None);
        assert_eq!(payloads.take(a).map(|y| y.len()), Some(4096));
        assert_eq!((payloads.take(a), payloads.bytes()), (None, 0));
        // Once it has a phase, its payload is forgotten.
        payloads.keep(&mut small("c", c, 1));
        let mut queued = small("c", c, 1);
        queued.status = Some(crate::crd::WorkOrderStatus {
            phase: Some(crate::crd::WorkOrderPhase::Pending),
            ..Default::default()
        });
        payloads.keep(&mut queued);
        assert_eq!((payloads.take(c), payloads.bytes()), (None, 0));
        // Deleted, or the watch relisting: forgotten too.
        payloads.keep(&mut small("c", c, 1));
        payloads.follow(&watcher::Event::Delete(small("c", c, 0)));
        assert_eq!(payloads.bytes(), 0);
        payloads.keep(&mut small("a", a, 1));
        payloads.follow(&watcher::Event::Init);
        assert_eq!((payloads.take(a), payloads.bytes()), (None, 0));
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
