//! The executor's one watch of Nodes (docs/design.md §12): whether the node under a Job's pod
//! reports, for every order at once, so API connections do not grow with running Jobs. Opened on
//! first use; nodes in its store keep only their name, taints and `Ready` condition.
//!
//! Reading nodes needs `list` and `watch` on them cluster-wide (the chart's per-executor
//! ClusterRole). Without them (asked once, with `SelfSubjectAccessReview`s) no watch is opened,
//! the log says so once, and every node is [`NodeState::Unknown`]: verdicts then wait only on what
//! the pods themselves say (`super::disruption`).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use futures::StreamExt;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, Taint};
use kube::api::PostParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

use super::disruption::{NodeState, node_state};
use super::podwatch::Listing;

/// The executor's watch of Nodes, opened by the first [`NodeWatch::state`] or
/// [`NodeWatch::changes`].
pub struct NodeWatch {
    client: Client,
    open: OnceLock<Arc<Open>>,
}

struct Open {
    store: Store<Node>,
    /// Bumped after every change of what [`node_state`] reads.
    changes: watch::Receiver<u64>,
    /// Listed once (a node missing from the store was deleted), or failing before it could.
    listing: watch::Receiver<Listing>,
    _task: AbortOnDropHandle<()>,
}

impl NodeWatch {
    /// No watch is opened before the first question about a node.
    pub fn new(client: Client) -> Self {
        NodeWatch {
            client,
            open: OnceLock::new(),
        }
    }

    fn open(&self) -> &Arc<Open> {
        self.open
            .get_or_init(|| Arc::new(Open::start(self.client.clone())))
    }

    /// The state of the node `name` as the store holds it now.
    pub fn state(&self, name: &str) -> NodeState {
        let open = self.open();
        let listed = *open.listing.borrow() == Listing::Listed;
        let node = open.store.get(&ObjectRef::new(name));
        node_state(node.as_deref(), listed)
    }

    /// A receiver that changes whenever a node's readiness or taints change, a node is deleted,
    /// or the nodes are listed again.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.open().changes.clone()
    }

    /// Waits until the nodes are listed, or the watch failed before it could (then every node
    /// stays [`NodeState::Unknown`] and nothing is gained by waiting).
    pub async fn listed(&self) {
        Listing::settled(self.open().listing.clone()).await;
    }
}

impl Open {
    fn start(client: Client) -> Self {
        let api: Api<Node> = Api::all(client.clone());
        let writer = Writer::default();
        let store = writer.as_reader();
        let (tx, changes) = watch::channel(0u64);
        let (listing_tx, listing) = watch::channel(Listing::Pending);
        let events = watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(keep_state_fields)
            .reflect(writer);
        let task = tokio::spawn(async move {
            // Asked first, so that an executor without the right (namespaced installs) says so
            // once instead of a refused list at every backoff step.
            if !may_watch_nodes(&client).await {
                tracing::info!(
                    "no list and watch on nodes for this executor: a pod's verdict \
                    waits only on what the pod says of a lost node (the chart's \
                    rbac.executorsReadNodes grants them; docs/design.md §12)"
                );
                listing_tx.send_replace(Listing::Failing);
                return;
            }
            tracing::info!("opening the watch of nodes (docs/design.md §12)");
            let mut events = std::pin::pin!(events);
            let mut failing = false;
            // What `node_state` reads of each node: only a change of it wakes the orders, not
            // the other status updates every node makes.
            let mut seen: HashMap<String, String> = HashMap::new();
            while let Some(event) = events.next().await {
                match event {
                    Ok(Event::Apply(node)) => {
                        let name = node.metadata.name.clone().unwrap_or_default();
                        let now = state_key(&node);
                        if seen.insert(name, now.clone()).as_ref() != Some(&now) {
                            tx.send_modify(|n| *n += 1);
                        }
                    }
                    Ok(Event::InitApply(node)) => {
                        seen.insert(
                            node.metadata.name.clone().unwrap_or_default(),
                            state_key(&node),
                        );
                    }
                    Ok(Event::Delete(node)) => {
                        seen.remove(node.metadata.name.as_deref().unwrap_or_default());
                        tx.send_modify(|n| *n += 1);
                    }
                    Ok(Event::InitDone) => {
                        failing = false;
                        listing_tx.send_replace(Listing::Listed);
                        tx.send_modify(|n| *n += 1);
                    }
                    Ok(Event::Init) => seen.clear(),
                    Err(error) if !failing => {
                        failing = true;
                        Listing::on_error(&listing_tx);
                        tracing::warn!(%error, "cannot watch nodes; a pod's verdict waits only on \
                            what the pod says of a lost node (grant list and watch on nodes, \
                            docs/design.md §12); retrying");
                    }
                    Err(error) => tracing::debug!(%error, "node watch error; it resumes"),
                }
            }
        });
        Open {
            store,
            changes,
            listing,
            _task: AbortOnDropHandle::new(task),
        }
    }
}

/// Whether this executor may list and watch nodes (two `SelfSubjectAccessReview`s, which every
/// authenticated client may make). A review that cannot be made counts as yes: the watch then
/// says what goes wrong.
async fn may_watch_nodes(client: &Client) -> bool {
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    for verb in ["list", "watch"] {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.into()),
                    resource: Some("nodes".into()),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        match reviews.create(&PostParams::default(), &review).await {
            Ok(answer) if !answer.status.as_ref().is_some_and(|s| s.allowed) => return false,
            Ok(_) => {}
            Err(error) => {
                tracing::debug!(%error, "cannot ask whether nodes may be watched; trying");
                return true;
            }
        }
    }
    true
}

/// What [`node_state`] reads of a node, as one comparable text: the `Ready` status and when it
/// last changed, and the taints' keys and effects.
fn state_key(node: &Node) -> String {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map(|c| format!("{} {:?}", c.status, c.last_transition_time))
        .unwrap_or_default();
    let taints: Vec<String> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| {
            t.iter()
                .map(|t| format!("{}:{}", t.key, t.effect))
                .collect()
        })
        .unwrap_or_default();
    format!("{ready} {taints:?}")
}

/// Keeps of a node what [`node_state`] reads: name, taints and the `Ready` condition.
pub fn keep_state_fields(node: &mut Node) {
    let meta = &mut node.metadata;
    meta.annotations = None;
    meta.labels = None;
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.finalizers = None;
    let taints: Option<Vec<Taint>> = node.spec.take().and_then(|s| s.taints);
    node.spec = Some(NodeSpec {
        taints,
        ..NodeSpec::default()
    });
    let ready: Option<Vec<NodeCondition>> = node.status.take().and_then(|s| {
        s.conditions
            .map(|c| c.into_iter().filter(|c| c.type_ == "Ready").collect())
    });
    node.status = Some(NodeStatus {
        conditions: ready,
        ..NodeStatus::default()
    });
}
