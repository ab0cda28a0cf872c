use super::*;
use crate::controller::status::tests::{active, finished};
use crate::queue::Outcome;

fn now() -> Time {
    status::now()
}

fn wait(reason: WaitReason) -> Wait {
    Wait {
        reason,
        message: format!("because {reason}"),
        matching: vec![],
    }
}

fn with(c: Option<Condition>) -> WorkOrderStatus {
    WorkOrderStatus {
        conditions: c.into_iter().collect(),
        ..Default::default()
    }
}

/// The condition of WorkOrder `wo` at `at` for `lookup` and `wait`, after `prev`, with no
/// scale-ups awaited and no generation.
fn condition_at(
    lookup: &Lookup,
    wait: Option<&Wait>,
    prev: Option<&WorkOrderStatus>,
    at: &Time,
) -> Option<Condition> {
    condition_of("wo", lookup, wait, &ScaleUps::default(), prev, None, at)
}

/// [`condition_at`] of a pending order waiting for `reason`.
fn pending_condition(
    reason: WaitReason,
    prev: Option<&WorkOrderStatus>,
    at: &Time,
) -> Option<Condition> {
    let pending = Lookup::Active(Box::new(active(OrderStatus::Pending)));
    condition_at(&pending, Some(&wait(reason)), prev, at)
}

#[test]
fn false_only_when_no_agent_can_take_it() {
    let pending = Lookup::Active(Box::new(active(OrderStatus::Pending)));
    let row = |r| {
        let c = condition_of(
            "wo",
            &pending,
            Some(&wait(r)),
            &ScaleUps::default(),
            None,
            Some(1),
            &now(),
        )
        .unwrap();
        (c.status, c.reason, c.message)
    };
    let s = |x: &str| x.to_string();
    assert_eq!(
        row(WaitReason::NoMatchingAgent),
        (
            s("False"),
            s("NoMatchingAgent"),
            s("because no_matching_agent")
        )
    );
    assert_eq!(row(WaitReason::NoAgentConnected).0, "False");
    assert_eq!(row(WaitReason::BackingOff).0, "True");
    assert_eq!(row(WaitReason::AgentsBusy).1, "Matched");
    assert_eq!(row(WaitReason::Queued).1, "Matched");
}

/// An Executor `ns/name` with agent id `uid`: its Deployment's count set by `spec` (by an
/// autoscaler when `None`) and at `replicas` as last seen, its `Ready` condition changed
/// `ready_since` seconds ago, and `Stalled` or not.
fn executor(
    name: &str,
    uid: u128,
    spec: Option<i32>,
    replicas: i32,
    ready_since: i64,
    stalled: bool,
) -> Arc<Executor> {
    let mut deployment = serde_json::json!({"image": "pullman:test"});
    if let Some(r) = spec {
        deployment["replicas"] = r.into();
    }
    let at = |secs: i64| {
        let t = k8s_openapi::jiff::Timestamp::now()
            - k8s_openapi::jiff::SignedDuration::from_secs(secs);
        serde_json::json!(t.to_string())
    };
    let mut conditions = vec![serde_json::json!({"type": "Ready", "status": "True",
        "reason": "Ready", "message": "", "lastTransitionTime": at(ready_since)})];
    if stalled {
        conditions.push(serde_json::json!({"type": "Stalled", "status": "True",
            "reason": "SecretNotOwned", "message": "", "lastTransitionTime": at(600)}));
    }
    Arc::new(
        serde_json::from_value(serde_json::json!({
            "apiVersion": "pullman.dev/v1alpha1", "kind": "Executor",
            "metadata": {"name": name, "namespace": "ns", "uid": Uuid::from_u128(uid).to_string()},
            "spec": {"labels": ["x"], "deployment": deployment},
            "status": {"replicas": replicas, "conditions": conditions},
        }))
        .unwrap(),
    )
}

/// Issue #35: an order that an autoscaled Executor at zero replicas (or starting from zero)
/// may take waits for it normally (True, no Event). One whose Executor's count the
/// controller keeps, that is stalled, or whose replica has been up for longer than
/// [`STARTING_FOR`] without calling in, is not schedulable (False, an Event).
#[test]
fn an_executor_scaled_to_zero_is_awaited_not_unschedulable() {
    let pending = Lookup::Active(Box::new(active(OrderStatus::Pending)));
    let long_ago = 10 * STARTING_FOR.as_secs() as i64;
    let scale_ups = ScaleUps::of(
        &[
            executor("elastic", 1, None, 0, long_ago, false),
            executor("pinned", 2, Some(0), 0, long_ago, false),
            executor("up", 3, None, 1, long_ago, false),
            executor("starting", 4, None, 1, 30, false),
            executor("stuck", 5, None, 0, long_ago, true),
        ],
        &now(),
    );
    let of = |reason, agents: &[u128]| {
        let wait = Wait {
            matching: agents.iter().map(|a| Uuid::from_u128(*a)).collect(),
            ..wait(reason)
        };
        let c = condition_of("wo", &pending, Some(&wait), &scale_ups, None, None, &now());
        with(c)
    };
    let awaited = of(WaitReason::NoAgentConnected, &[2, 1]);
    let c = &awaited.conditions[0];
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", AWAITING_SCALE_UP)
    );
    assert!(
        c.message
            .starts_with("Executor ns/elastic may take this order"),
        "{}",
        c.message
    );
    assert!(unschedulable_event(None, &awaited).is_none());
    let starting = &of(WaitReason::NoAgentConnected, &[4]).conditions[0];
    assert_eq!(starting.reason, AWAITING_SCALE_UP);
    for agents in [&[2][..], &[3], &[5], &[9]] {
        let c = &of(WaitReason::NoAgentConnected, agents).conditions[0];
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "NoAgentConnected")
        );
    }
    // An agent in contact decides: the scaled-to-zero one is not what the order waits for.
    let c = &of(WaitReason::Queued, &[1]).conditions[0];
    assert_eq!(c.reason, "Matched");
}

#[test]
fn claimed_is_true_finished_keeps_the_last_and_unknown_has_none() {
    let claimed = Lookup::Active(Box::new(active(OrderStatus::Claimed)));
    let c = condition_at(&claimed, None, None, &now()).unwrap();
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Claimed"));
    assert!(c.message.starts_with("WorkOrder wo was claimed by agent "));

    let pending = Lookup::Active(Box::new(active(OrderStatus::Pending)));
    let unschedulable = with(pending_condition(WaitReason::NoMatchingAgent, None, &now()));
    let finished = finished(Outcome::Cancelled, None);
    let kept = condition_at(&finished, None, Some(&unschedulable), &now());
    assert_eq!(kept.as_ref(), unschedulable.conditions.first());
    // Unknown reason now: the last one stays rather than vanishing.
    let kept = condition_at(&pending, None, Some(&unschedulable), &now());
    assert_eq!(kept.as_ref(), unschedulable.conditions.first());
    assert!(condition_at(&Lookup::Unknown, None, None, &now()).is_none());
    assert!(waits(&pending) && !waits(&claimed) && !waits(&finished));
}

#[test]
fn the_event_comes_once_when_it_becomes_unschedulable() {
    let of = |r, prev: Option<&WorkOrderStatus>| with(pending_condition(r, prev, &now()));
    let none = of(WaitReason::NoMatchingAgent, None);
    let e = unschedulable_event(None, &none).expect("an Event on the first False");
    assert_eq!(e.reason, UNSCHEDULABLE_EVENT);
    assert_eq!(e.type_, EventType::Warning);
    assert_eq!(
        e.note.as_deref(),
        Some("NoMatchingAgent: because no_matching_agent")
    );
    // Still False, for the same or another reason: no second Event.
    assert!(unschedulable_event(Some(&none), &none).is_none());
    let stale = of(WaitReason::NoAgentConnected, Some(&none));
    assert!(unschedulable_event(Some(&none), &stale).is_none());
    // True, then False again: a new Event.
    let matched = of(WaitReason::Queued, Some(&stale));
    assert!(unschedulable_event(Some(&stale), &matched).is_none());
    assert!(unschedulable_event(Some(&matched), &none).is_some());
    // No condition at all (claimed before the first write): no Event.
    assert!(unschedulable_event(None, &WorkOrderStatus::default()).is_none());
}

#[test]
fn the_transition_time_moves_with_the_status_only() {
    let early = Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap());
    let first = with(pending_condition(WaitReason::NoMatchingAgent, None, &early));
    let later = pending_condition(WaitReason::NoAgentConnected, Some(&first), &now()).unwrap();
    assert_eq!(later.last_transition_time, early, "still False");
    let matched = pending_condition(WaitReason::Queued, Some(&first), &now()).unwrap();
    assert_ne!(matched.last_transition_time, early, "False to True");
}
