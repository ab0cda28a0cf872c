//! The WorkOrder's `Schedulable` condition (docs/design.md §10): whether an agent can take the order,
//! and if not, why. The reason comes from the queue (`queue::Queue::waits`, the claim's own
//! eligibility rule); this module turns it into a condition, says when it becomes an Event, and
//! notices causes that change outside the order's row.
//!
//! A reconcile of a waiting order asks the queue and writes the condition with the rest of the
//! status. Its causes are mostly other rows (an agent registered, retired, gone stale, a retry
//! come due), which send the order no notification, so [`refreshes`] asks the queue about every
//! waiting WorkOrder in the cache every [`REFRESH_EVERY`] and requests a reconcile for those whose
//! condition no longer says what the queue says.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use kube::runtime::events::{Event as KubeEvent, EventType};
use kube::runtime::reflector::{ObjectRef, Store};
use uuid::Uuid;

use super::status::{self, condition};
use crate::crd::{Executor, WorkOrderPhase, WorkOrderResource, WorkOrderStatus};
use crate::queue::waiting::Wait;
use crate::queue::{Lookup, OrderStatus, Queue, WaitReason};

/// Type of the condition.
pub const SCHEDULABLE: &str = "Schedulable";

/// How often the waiting WorkOrders' conditions are checked against the queue: a cause that
/// appears or goes away shows on the resource within this plus one reconcile (the issue asks
/// for 10 s). Each check is one statement by primary key over the waiting WorkOrders and one
/// read of the live agents.
pub const REFRESH_EVERY: Duration = Duration::from_secs(5);

/// Reason of the Event recorded when an order becomes unschedulable.
pub const UNSCHEDULABLE_EVENT: &str = "Unschedulable";
/// Reason of the `Schedulable` condition, and of the Warning Event, of a claimed order whose pod
/// may still run on a node that does not report (docs/design.md §12).
pub const NODE_UNREACHABLE: &str = "NodeUnreachable";

/// Reason of the condition while the order waits for an Executor its autoscaler has scaled to
/// zero, or is starting (issue #35): normal for KEDA's scale from zero, so `True` and no Warning
/// Event.
pub const AWAITING_SCALE_UP: &str = "AwaitingScaleUp";

/// How long an autoscaled Executor scaled up from zero counts as starting, from the last change
/// of its `Ready` condition (the Deployment rolling out, then available): time for the image
/// pull, the pod's start and the agent's first call. Past it, an Executor whose agent still is
/// not in contact is a fault (`NoAgentConnected`, with its Event): a crash loop or an image that
/// cannot be pulled shows within this.
pub const STARTING_FOR: Duration = Duration::from_secs(120);

/// The Executors that wait for their autoscaler, by agent id (the Executor's uid), with their
/// `<namespace>/<name>`: `spec.deployment` set with `replicas` unset (an autoscaler owns the
/// count, `crd::ExecutorDeployment::replicas`), not `Stalled`, and either scaled to zero
/// (`status.replicas` 0) or starting (its `Ready` condition changed less than [`STARTING_FOR`]
/// ago). An Executor whose count the controller keeps is not one: no one will scale it up, so
/// its orders wait for a reason someone must fix.
#[derive(Debug, Default)]
pub struct ScaleUps(HashMap<Uuid, String>);

/// The Executor controllers' caches, one per watched namespace (`--watch-namespace`): an order
/// may wait for an Executor of any namespace this controller watches. Executors of namespaces it
/// does not watch are unknown here, and their orders say `NoAgentConnected`.
#[derive(Clone, Default)]
pub struct ExecutorCaches(pub Vec<Store<Executor>>);

impl ExecutorCaches {
    /// Every cached Executor.
    pub fn state(&self) -> Vec<Arc<Executor>> {
        self.0.iter().flat_map(Store::state).collect()
    }

    /// Waits until every cache has had its first listing, at most `limit`; whether they all did.
    pub async fn ready_within(&self, limit: Duration) -> bool {
        let all = futures::future::join_all(self.0.iter().map(Store::wait_until_ready));
        matches!(tokio::time::timeout(limit, all).await, Ok(r) if r.iter().all(Result::is_ok))
    }
}

impl ScaleUps {
    /// Those among `executors` (the controllers' caches), as of `now`.
    pub fn of(executors: &[Arc<Executor>], now: &Time) -> Self {
        let waiting = executors.iter().filter(|ex| {
            let autoscaled = ex
                .spec
                .deployment
                .as_ref()
                .is_some_and(|d| d.replicas.is_none());
            let Some(status) = ex.status.as_ref().filter(|_| autoscaled) else {
                return false;
            };
            let found = |type_: &str| status.conditions.iter().find(|c| c.type_ == type_);
            if found("Stalled").is_some_and(|c| c.status == "True") {
                return false;
            }
            let starting = found("Ready").is_some_and(|c| {
                let since = now.0.duration_since(c.last_transition_time.0);
                since.is_negative() || since.unsigned_abs() < STARTING_FOR
            });
            status.replicas == Some(0) || starting
        });
        Self(
            waiting
                .filter_map(|ex| {
                    let id = Uuid::parse_str(ex.metadata.uid.as_deref()?).ok()?;
                    Some((id, format!("{}/{}", ex.namespace()?, ex.name_any())))
                })
                .collect(),
        )
    }

    /// The first of the agents that may take the order (`wait.matching`) that is an Executor
    /// waiting for its autoscaler, when no agent that may take it is in contact.
    fn awaited<'a>(&'a self, wait: &Wait) -> Option<&'a str> {
        if wait.reason != WaitReason::NoAgentConnected {
            return None;
        }
        wait.matching
            .iter()
            .find_map(|id| self.0.get(id))
            .map(String::as_str)
    }
}

/// `(status, reason, message)` of the condition of an order that waits for the reason `wait`
/// gives: `False` when no agent can take it (`NoMatchingAgent`, `NoAgentConnected`), `True` when
/// one will (`AwaitingScaleUp` while none is in contact but an Executor among them waits for its
/// autoscaler, [`ScaleUps`]; `BackingOff` until its retry is due; `ConcurrencyLimited` until its
/// concurrency key has a free slot; `Matched` while matching agents in contact take
/// orders in turn). `agents_busy` and `queued` are both `Matched`: they trade places whenever an
/// agent takes or finishes a claim, and a condition that followed them would rewrite every
/// waiting WorkOrder each time; `pullman work-orders explain` tells them apart.
pub fn parts(wait: &Wait, scale_ups: &ScaleUps) -> (bool, &'static str, String) {
    if let Some(executor) = scale_ups.awaited(wait) {
        return (
            true,
            AWAITING_SCALE_UP,
            format!(
                "Executor {executor} may take this order and has no replica in contact yet: \
                 its autoscaler starts one for waiting orders (docs/keda.md)."
            ),
        );
    }
    let (status, reason) = match wait.reason {
        WaitReason::NoMatchingAgent => (false, "NoMatchingAgent"),
        WaitReason::NoAgentConnected => (false, "NoAgentConnected"),
        WaitReason::BackingOff => (true, "BackingOff"),
        WaitReason::ConcurrencyLimited => (true, "ConcurrencyLimited"),
        WaitReason::AgentsBusy | WaitReason::Queued => (true, "Matched"),
        WaitReason::NodeUnreachable => (true, NODE_UNREACHABLE),
    };
    (status, reason, wait.message.clone())
}

/// The condition of WorkOrder `name` whose queue row is `lookup`. A waiting order's comes from
/// `wait`; a claimed order's is `True` (`Claimed`); a finished order keeps the one it had, so a
/// cancelled order that never ran still says why. `None` before the order is queued, and for a
/// waiting order whose `wait` is unknown (the queue could not say) that had none: the next
/// refresh fills it in.
pub fn condition_of(
    name: &str,
    lookup: &Lookup,
    wait: Option<&Wait>,
    scale_ups: &ScaleUps,
    prev: Option<&WorkOrderStatus>,
    generation: Option<i64>,
    now: &Time,
) -> Option<Condition> {
    let prev = prev.map(|p| p.conditions.as_slice()).unwrap_or_default();
    let make = |status, reason, message: &str| {
        condition(prev, SCHEDULABLE, status, reason, message, generation, now)
    };
    match (lookup, wait) {
        // Its agent says a pod of it may still run on a node that does not report (§12).
        (Lookup::Active(o), Some(wait))
            if o.status == OrderStatus::Claimed && wait.reason == WaitReason::NodeUnreachable =>
        {
            Some(make(true, NODE_UNREACHABLE, &wait.message))
        }
        (Lookup::Active(o), _) if o.status == OrderStatus::Claimed => {
            let by = o
                .claimed_by
                .map_or("(unknown)".to_string(), |a| a.to_string());
            Some(make(
                true,
                "Claimed",
                &format!("WorkOrder {name} was claimed by agent {by}."),
            ))
        }
        (Lookup::Active(_), Some(wait)) => {
            let (status, reason, message) = parts(wait, scale_ups);
            Some(make(status, reason, &message))
        }
        (Lookup::Active(_) | Lookup::Finished(_), _) => {
            prev.iter().find(|c| c.type_ == SCHEDULABLE).cloned()
        }
        (Lookup::Unknown, _) => None,
    }
}

/// Whether an order needs the queue's reason for its condition: it is in the queue, unclaimed.
pub fn waits(lookup: &Lookup) -> bool {
    matches!(lookup, Lookup::Active(o) if o.status != OrderStatus::Claimed)
}

/// Puts back in `new` the `Schedulable` condition `prev` had, when the queue could not say why
/// the order waits: a claimed order's `NodeUnreachable` must not turn into `Claimed` (and back,
/// with a second Event) for a failed read.
pub fn keep_condition(new: &mut WorkOrderStatus, prev: Option<&WorkOrderStatus>) {
    let Some(had) = prev.and_then(|p| p.conditions.iter().find(|c| c.type_ == SCHEDULABLE)) else {
        return;
    };
    new.conditions.retain(|c| c.type_ != SCHEDULABLE);
    new.conditions.push(had.clone());
}

/// Whether an order is claimed: its condition then asks what its agent says holds it up.
pub fn claimed(lookup: &Lookup) -> bool {
    matches!(lookup, Lookup::Active(o) if o.status == OrderStatus::Claimed)
}

/// The Warning Event to record when `new` says a pod of the claimed order may still run on a
/// node that does not report and `prev` did not: once each time (docs/design.md §12).
pub fn node_unreachable_event(
    prev: Option<&WorkOrderStatus>,
    new: &WorkOrderStatus,
) -> Option<KubeEvent> {
    let now = became(prev, new, |c| c.reason == NODE_UNREACHABLE)?;
    Some(KubeEvent {
        type_: EventType::Warning,
        reason: NODE_UNREACHABLE.into(),
        note: Some(now.message),
        action: "Run".into(),
        secondary: None,
    })
}

/// The Warning Event to record when `new` says the order cannot be scheduled and `prev` did not:
/// once per time it becomes unschedulable, not per reconcile (docs/design.md §10).
pub fn unschedulable_event(
    prev: Option<&WorkOrderStatus>,
    new: &WorkOrderStatus,
) -> Option<KubeEvent> {
    let now = became(prev, new, |c| c.status == "False")?;
    Some(KubeEvent {
        type_: EventType::Warning,
        reason: UNSCHEDULABLE_EVENT.into(),
        note: Some(format!("{}: {}", now.reason, now.message)),
        action: "Schedule".into(),
        secondary: None,
    })
}

/// `new`'s `Schedulable` condition when it is `such` and `prev`'s was not: what an Event says
/// once per time, not per reconcile.
fn became(
    prev: Option<&WorkOrderStatus>,
    new: &WorkOrderStatus,
    such: impl Fn(&Condition) -> bool,
) -> Option<Condition> {
    let find = |s: &WorkOrderStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == SCHEDULABLE)
            .filter(|c| such(c))
            .cloned()
    };
    let now = find(new)?;
    prev.and_then(find).is_none().then_some(now)
}

/// Whether `wo`'s condition says what `wait` says.
fn shows(wo: &WorkOrderResource, wait: &Wait, scale_ups: &ScaleUps) -> bool {
    let (status, reason, message) = parts(wait, scale_ups);
    let want = condition(
        &[],
        SCHEDULABLE,
        status,
        reason,
        &message,
        None,
        &status::now(),
    );
    wo.status.iter().flat_map(|s| &s.conditions).any(|c| {
        c.type_ == SCHEDULABLE
            && c.status == want.status
            && c.reason == want.reason
            && c.message == want.message
    })
}

/// The WorkOrders whose condition the queue now contradicts, for [`refreshes`]. A WorkOrder
/// the queue does not report as waiting (claimed or finished meanwhile) is left to the
/// notification its change sent.
async fn contradicted(
    queue: &Queue,
    store: &Store<WorkOrderResource>,
    executors: &ExecutorCaches,
) -> Vec<ObjectRef<WorkOrderResource>> {
    let waiting: Vec<(Uuid, Arc<WorkOrderResource>)> = store
        .state()
        .into_iter()
        .filter(|wo| {
            let phase = wo.status.as_ref().and_then(|s| s.phase);
            matches!(
                phase,
                Some(WorkOrderPhase::Pending | WorkOrderPhase::RetryPending)
            )
        })
        .filter_map(|wo| Some((Uuid::parse_str(&wo.uid()?).ok()?, wo)))
        .collect();
    if waiting.is_empty() {
        return vec![];
    }
    let ids: Vec<Uuid> = waiting.iter().map(|(id, _)| *id).collect();
    let waits = match queue.waits(&ids).await {
        Ok(waits) => waits,
        Err(error) => {
            tracing::debug!(%error, "could not check the Schedulable conditions; next time");
            return vec![];
        }
    };
    let scale_ups = ScaleUps::of(&executors.state(), &status::now());
    waiting
        .into_iter()
        .filter(|(id, wo)| {
            waits
                .get(id)
                .is_some_and(|wait| !shows(wo, wait, &scale_ups))
        })
        .map(|(_, wo)| ObjectRef::from_obj(wo.as_ref()))
        .collect()
}

/// Every [`REFRESH_EVERY`], the waiting WorkOrders in `store` whose `Schedulable` condition the
/// queue (or an Executor's scale, `executors`) contradicts, to reconcile. Ends never; the
/// controller stops polling it when it stops.
pub(super) fn refreshes(
    queue: Queue,
    store: Store<WorkOrderResource>,
    executors: ExecutorCaches,
) -> impl futures::Stream<Item = ObjectRef<WorkOrderResource>> {
    use futures::StreamExt;
    let state = (queue, store, executors);
    futures::stream::unfold(state, |(queue, store, executors)| async move {
        tokio::time::sleep(REFRESH_EVERY).await;
        let stale = contradicted(&queue, &store, &executors).await;
        if !stale.is_empty() {
            tracing::debug!(count = stale.len(), "Schedulable conditions to refresh");
        }
        Some((futures::stream::iter(stale), (queue, store, executors)))
    })
    .flatten()
}

#[cfg(test)]
#[path = "schedulable_tests.rs"]
mod tests;
