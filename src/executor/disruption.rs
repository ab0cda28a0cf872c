//! Disruptions under in-cluster work (docs/design.md §12), as pure functions of the pods and nodes
//! the shared watches hold: whether one of a Job's pods may still be running where no kubelet
//! reports, so that the Job's verdict must wait.
//!
//! Only the kubelet knows that a container stopped. The API server's word is not enough while
//! the pod's node does not report: the taint manager (`DisruptionTarget` reason
//! `DeletionByTaintManager`) and the pod garbage collector (`DeletionByPodGC`) delete or fail pods
//! on lost nodes without stopping anything, and the Job controller counts such a pod as failed at
//! once (its `FailureTarget` follows), while the process may still run behind a network
//! partition. A pod is taken as stopped when the kubelet said so (every container terminated,
//! phase `Succeeded`, or `Failed` not set by those two), when its node is deleted or marked
//! `node.kubernetes.io/out-of-service` (the admin's word that the node is shut down), or when it
//! is gone from the API server and its node reports again (a graceful deletion ends only when the
//! kubelet confirms it). A pod force-deleted while its node does not report is still taken as
//! running ([`with_gone`]).

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::pods::{age, container_statuses};
use crate::wire::{ClaimWaiting, NodeWait, WaitReason};

/// The taint an admin puts on a node known to be shut down (Kubernetes' non-graceful node
/// shutdown): its pods are stopped, and PodGC deletes them.
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";

/// The `DisruptionTarget` reasons of controllers that act for a node that does not report; they
/// say nothing of whether the pod's containers stopped.
const NOT_FROM_KUBELET: [&str; 2] = ["DeletionByTaintManager", "DeletionByPodGC"];

/// What the executor knows of the node under a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeState {
    /// `Ready` is True: its kubelet reports, and what it reports of the pod is the truth.
    Ready,
    /// `Ready` is False or Unknown since `since`: the kubelet does not report (node lost,
    /// partitioned, kubelet or container runtime down), and the pod's processes may still run.
    NotReady { since: Option<DateTime<Utc>> },
    /// Deleted, or tainted out-of-service: its pods are taken as stopped (§12).
    Stopped,
    /// Not known: the nodes cannot be read (no `list`/`watch` on nodes) or are not listed yet.
    Unknown,
}

/// One pod whose verdict must wait: it may still run on `node`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// The pod's name (in the Job's namespace).
    pub pod: String,
    /// The node it was bound to.
    pub node: String,
    /// `true` when the node is known not Ready (or cannot be read and a taint-manager or PodGC
    /// condition says the node was lost): the order says `node_unreachable`. `false` when the node
    /// reports again and its kubelet has yet to stop the pod those controllers deleted.
    pub unreachable: bool,
    /// Since when the node is not Ready (or the pod was marked for deletion), when known.
    pub since: Option<DateTime<Utc>>,
}

impl Hold {
    /// `pod P may still run on node N, not Ready since T; …` for the order's waiting message and
    /// a failure at the end of the budget.
    pub fn describe(&self) -> String {
        let since = self
            .since
            .map(|t| format!(" since {}", t.format("%Y-%m-%dT%H:%M:%SZ")))
            .unwrap_or_default();
        if self.unreachable {
            format!(
                "pod {} may still run on node {}, which has not reported{since}; the Job's verdict waits for its kubelet",
                self.pod, self.node
            )
        } else {
            format!(
                "pod {} on node {} was deleted for a lost node{since}; the Job's verdict waits for its kubelet to stop it",
                self.pod, self.node
            )
        }
    }

    /// What the order's heartbeats say of it (`node_unreachable`), when the node does not report;
    /// `None` while the node reports again and its kubelet has yet to stop the pod.
    pub fn waiting(&self) -> Option<ClaimWaiting> {
        self.unreachable.then(|| ClaimWaiting {
            reason: WaitReason::NodeUnreachable,
            message: self.describe(),
            node: NodeWait {
                name: self.node.clone(),
                since: self.since,
            },
        })
    }
}

fn chrono_of(t: &Time) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(t.0.as_second(), t.0.subsec_nanosecond().max(0) as u32)
}

/// The state of the node named `name`, given the node as the watch holds it (`None`: not in
/// the store) and whether the watch has listed the nodes (so that a missing node was deleted).
pub fn node_state(node: Option<&Node>, listed: bool) -> NodeState {
    let Some(node) = node else {
        return if listed {
            NodeState::Stopped
        } else {
            NodeState::Unknown
        };
    };
    let out_of_service = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT));
    if out_of_service {
        return NodeState::Stopped;
    }
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    match ready {
        Some(c) if c.status == "True" => NodeState::Ready,
        Some(c) => NodeState::NotReady {
            since: c.last_transition_time.as_ref().and_then(chrono_of),
        },
        // A node that never reported yet.
        None => NodeState::Unknown,
    }
}

/// The `DisruptionTarget` condition of `pod` when it is True: its reason and since when.
fn disruption(pod: &Pod) -> Option<(&str, Option<DateTime<Utc>>)> {
    let c = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")?;
    Some((
        c.reason.as_deref().unwrap_or(""),
        c.last_transition_time.as_ref().and_then(chrono_of),
    ))
}

/// Whether the kubelet itself reported that `pod` stopped: phase `Succeeded`, every container
/// terminated, or phase `Failed` set by anyone but the taint manager or PodGC.
pub fn stopped_by_kubelet(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if phase == Some("Succeeded") {
        return true;
    }
    let mut statuses = container_statuses(pod).peekable();
    let any = statuses.peek().is_some();
    if any
        && statuses.all(|c| {
            c.state
                .as_ref()
                .is_some_and(|s| s.terminated.is_some() && s.running.is_none())
        })
    {
        return true;
    }
    let by_controller = disruption(pod).is_some_and(|(r, _)| NOT_FROM_KUBELET.contains(&r));
    phase == Some("Failed") && !by_controller
}

/// Whether `pod` may still run where no kubelet reports, given the state of its node: `None`
/// when it never reached a node, the kubelet reported it stopped, or its node is Ready with no
/// deletion by the taint manager or PodGC pending, or is stopped.
pub fn hold(pod: &Pod, node: &NodeState) -> Option<Hold> {
    let node_name = pod.spec.as_ref()?.node_name.clone()?;
    if stopped_by_kubelet(pod) {
        return None;
    }
    let lost = disruption(pod).filter(|(r, _)| NOT_FROM_KUBELET.contains(r));
    let (unreachable, since) = match (node, lost) {
        (NodeState::Stopped, _) => return None,
        (NodeState::NotReady { since }, _) => (true, *since),
        (NodeState::Unknown, Some((_, since))) => (true, since),
        (NodeState::Ready, Some((_, since))) => (false, since),
        (NodeState::Ready | NodeState::Unknown, None) => return None,
    };
    Some(Hold {
        pod: pod.metadata.name.clone().unwrap_or_default(),
        node: node_name,
        unreachable,
        since,
    })
}

/// Every one of `pods` whose verdict must wait, oldest first, with `node` telling the state of
/// the node by name.
pub fn holds<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    node: impl Fn(&str) -> NodeState,
) -> Vec<Hold> {
    let mut pods: Vec<&Pod> = pods.into_iter().collect();
    pods.sort_by(|a, b| age(a).cmp(&age(b)));
    pods.into_iter()
        .filter_map(|pod| {
            let state = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .map(&node)
                .unwrap_or(NodeState::Unknown);
            hold(pod, &state)
        })
        .collect()
}

/// The hold the order says: the oldest on a node that does not report, else the oldest.
pub fn pick(holds: Vec<Hold>) -> Option<Hold> {
    let first_unreachable = holds.iter().position(|h| h.unreachable);
    holds.into_iter().nth(first_unreachable.unwrap_or(0))
}

/// The pods that held a verdict, by name, with their node: kept after they are gone from the API
/// server while their node still does not report, since a pod force-deleted there (`kubectl
/// delete --force`, the usual way to unstick a Job) may still run (§12 takes a gone pod as
/// stopped only with its node deleted or out-of-service).
pub type Gone = std::collections::BTreeMap<String, String>;

/// `held` (this look's holds of the pods present, named in `present`) with a hold for each pod of
/// `gone` that is no longer present and whose node is still not Ready; and the pods to remember
/// for the next look: those held now, and those gone on a node still not Ready.
pub fn with_gone(
    mut held: Vec<Hold>,
    present: &std::collections::BTreeSet<String>,
    gone: &Gone,
    node: impl Fn(&str) -> NodeState,
) -> (Vec<Hold>, Gone) {
    let mut remember: Gone = held
        .iter()
        .map(|h| (h.pod.clone(), h.node.clone()))
        .collect();
    for (pod, name) in gone {
        if present.contains(pod) {
            continue;
        }
        if let NodeState::NotReady { since } = node(name) {
            remember.insert(pod.clone(), name.clone());
            held.push(Hold {
                pod: pod.clone(),
                node: name.clone(),
                unreachable: true,
                since,
            });
        }
    }
    (held, remember)
}

#[cfg(test)]
#[path = "disruption_tests.rs"]
mod tests;
