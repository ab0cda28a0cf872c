//! Shared watches (docs/design.md §4, issue #16): ONE watch per kind and namespace the executor waits
//! on (Jobs, BuildRuns), filtered by the `pullman.dev/work-order` label it puts on every object
//! it applies, feeding a reflector store. Each running order waits on that store for its own
//! object, woken by name when an event about it arrives, so API-server connections and memory
//! stay flat however many orders run at once.
//!
//! Watch errors are survived: the watcher's backoff resumes the watch and a re-list swaps the
//! store whole, so an object is only taken as deleted when the API server says so (gone from the
//! store after it was seen there). Objects in the store keep only what the verdict rules read
//! ([`super::verdict::keep_verdict_fields`]), so memory is a few hundred bytes per labelled object.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::apply::{Applied, WORK_ORDER_LABEL};
use super::verdict::{ObjectVerdict, keep_verdict_fields};

/// How a wait ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEnd {
    /// The object reached a terminal verdict.
    Verdict(ObjectVerdict),
    /// The object was deleted before a verdict.
    Deleted,
    /// The deadline passed with the object still running.
    DeadlineReached,
    /// The carrier was told to stop.
    Stopped,
}

/// How long an object may stay out of the store after it was applied before it is looked up
/// directly (it may have been deleted before the watch ever saw it).
const UNSEEN_CHECK: Duration = Duration::from_secs(10);

/// The shared watches of one executor, opened on first use per (kind, namespace).
pub struct Watches {
    client: Client,
    open: Mutex<HashMap<WatchKey, Arc<SharedWatch>>>,
}

/// `apiVersion`, kind, and namespace (None: cluster-scoped) of one shared watch.
type WatchKey = (String, String, Option<String>);

/// Waiters by object name: how many wait, and what wakes them.
type Waiters = Arc<Mutex<HashMap<String, (Arc<Notify>, usize)>>>;

/// One watch and its store.
struct SharedWatch {
    client: Client,
    store: Store<DynamicObject>,
    /// True once the first list is in the store.
    ready: tokio::sync::watch::Receiver<bool>,
    resource: ApiResource,
    namespace: Option<String>,
    waiters: Waiters,
    _task: AbortOnDropHandle<()>,
}

impl Watches {
    pub fn new(client: Client) -> Self {
        Watches {
            client,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// The client the watches use, for one-off reads beside them (a failed Job's pods).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// How many watches are open (one per kind and namespace waited on).
    pub fn open_watches(&self) -> usize {
        self.open.lock().unwrap().len()
    }

    fn shared(&self, target: &Applied) -> Arc<SharedWatch> {
        let key = (
            target.resource.api_version.clone(),
            target.resource.kind.clone(),
            target.namespace.clone(),
        );
        let mut open = self.open.lock().unwrap();
        open.entry(key)
            .or_insert_with(|| {
                Arc::new(SharedWatch::start(
                    self.client.clone(),
                    target.resource.clone(),
                    target.namespace.clone(),
                ))
            })
            .clone()
    }

    /// Waits until `judge` gives `target` a terminal verdict, the object is deleted, `deadline`
    /// passes, or `stop` fires.
    pub async fn wait_for(
        &self,
        target: &Applied,
        deadline: Instant,
        stop: &CancellationToken,
        judge: impl Fn(&serde_json::Value) -> ObjectVerdict,
    ) -> WatchEnd {
        let shared = self.shared(target);
        let waiter = Waiter::register(&shared.waiters, &target.name);
        let deadline = tokio::time::Instant::from_std(deadline);
        // Not `Store::wait_until_ready`: its one-shot keeps a single waker, so of many orders
        // waiting for the first list only the last one polled would be woken.
        let mut ready = shared.ready.clone();
        tokio::select! {
            _ = stop.cancelled() => return WatchEnd::Stopped,
            _ = tokio::time::sleep_until(deadline) => return WatchEnd::DeadlineReached,
            r = ready.wait_for(|listed| *listed) => if r.is_err() { return WatchEnd::Stopped },
        }
        let key = {
            let key = ObjectRef::new_with(&target.name, shared.resource.clone());
            match &target.namespace {
                Some(ns) => key.within(ns),
                None => key,
            }
        };
        let mut seen = false;
        let mut unseen_since = tokio::time::Instant::now();
        loop {
            let notified = waiter.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match shared.store.get(&key) {
                Some(object) => {
                    seen = true;
                    // Being deleted: no verdict will come; wait for it to go.
                    if object.metadata.deletion_timestamp.is_none() {
                        let json = serde_json::to_value(object.as_ref()).unwrap_or_default();
                        match judge(&json) {
                            ObjectVerdict::Pending => {}
                            terminal => return WatchEnd::Verdict(terminal),
                        }
                    }
                }
                None if seen => return WatchEnd::Deleted,
                None if unseen_since.elapsed() >= UNSEEN_CHECK => {
                    if shared.confirmed_gone(&target.name).await {
                        return WatchEnd::Deleted;
                    }
                    unseen_since = tokio::time::Instant::now();
                }
                None => {}
            }
            let recheck = unseen_since + UNSEEN_CHECK;
            tokio::select! {
                _ = notified => {}
                _ = stop.cancelled() => return WatchEnd::Stopped,
                _ = tokio::time::sleep_until(deadline) => return WatchEnd::DeadlineReached,
                _ = tokio::time::sleep_until(recheck), if !seen => {}
            }
        }
    }
}

impl SharedWatch {
    fn start(client: Client, resource: ApiResource, namespace: Option<String>) -> Self {
        let api: Api<DynamicObject> = match &namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        let writer = Writer::new(resource.clone());
        let store = writer.as_reader();
        let waiters: Waiters = Arc::default();
        let wake = waiters.clone();
        let (ready_tx, ready) = tokio::sync::watch::channel(false);
        let what = format!(
            "{} in {}",
            resource.plural,
            namespace.as_deref().unwrap_or("all namespaces")
        );
        tracing::info!(watch = %what, "opening a shared watch");
        let events = watcher::watcher(api, watcher::Config::default().labels(WORK_ORDER_LABEL))
            .default_backoff()
            .modify(keep_verdict_fields)
            .reflect(writer);
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                match event {
                    Ok(Event::Apply(o) | Event::Delete(o)) => {
                        if let Some(name) = &o.metadata.name {
                            wake_one(&wake, name);
                        }
                    }
                    // A (re-)list was swapped into the store: anything may have changed.
                    Ok(Event::InitDone) => {
                        ready_tx.send_replace(true);
                        wake_all(&wake);
                    }
                    Ok(Event::Init | Event::InitApply(_)) => {}
                    // The backoff resumes the watch; a watch error is never a verdict.
                    Err(error) => tracing::warn!(%error, watch = %what, "watch error; resuming"),
                }
            }
        });
        SharedWatch {
            client,
            store,
            ready,
            resource,
            namespace,
            waiters,
            _task: AbortOnDropHandle::new(task),
        }
    }

    /// A direct look-up for an object the watch has not shown yet: gone only on a 404.
    async fn confirmed_gone(&self, name: &str) -> bool {
        let api: Api<DynamicObject> = match &self.namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &self.resource),
            None => Api::all_with(self.client.clone(), &self.resource),
        };
        matches!(api.get_opt(name).await, Ok(None))
    }
}

fn wake_one(waiters: &Waiters, name: &str) {
    if let Some((notify, _)) = waiters.lock().unwrap().get(name) {
        notify.notify_waiters();
    }
}

fn wake_all(waiters: &Waiters) {
    for (notify, _) in waiters.lock().unwrap().values() {
        notify.notify_waiters();
    }
}

/// One order's registration for wake-ups about an object name; removed when the last waiter
/// for that name goes.
struct Waiter {
    waiters: Waiters,
    name: String,
    notify: Arc<Notify>,
}

impl Waiter {
    fn register(waiters: &Waiters, name: &str) -> Self {
        let mut map = waiters.lock().unwrap();
        let entry = map
            .entry(name.to_string())
            .or_insert_with(|| (Arc::new(Notify::new()), 0));
        entry.1 += 1;
        Waiter {
            waiters: waiters.clone(),
            name: name.to_string(),
            notify: entry.0.clone(),
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut map = self.waiters.lock().unwrap();
        if let Some(entry) = map.get_mut(&self.name) {
            entry.1 -= 1;
            if entry.1 == 0 {
                map.remove(&self.name);
            }
        }
    }
}
