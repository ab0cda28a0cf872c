use super::*;
use serde_json::{Value, json};

fn pod(name: &str, node: Option<&str>, status: Value) -> Pod {
    let spec = match node {
        Some(n) => json!({"containers": [], "nodeName": n}),
        None => json!({"containers": []}),
    };
    serde_json::from_value(json!({
        "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": spec,
        "status": status,
    }))
    .unwrap()
}

fn running() -> Value {
    json!({"name": "main", "image": "", "imageID": "", "ready": true, "restartCount": 0,
           "state": {"running": {"startedAt": "2026-01-01T00:00:01Z"}}})
}

fn terminated(code: i32) -> Value {
    json!({"name": "main", "image": "", "imageID": "", "ready": false, "restartCount": 0,
           "state": {"terminated": {"exitCode": code}}})
}

fn evicted(reason: &str) -> Value {
    json!({"type": "DisruptionTarget", "status": "True", "reason": reason,
           "lastTransitionTime": "2026-01-01T00:06:00Z"})
}

fn node(ready: &str, taints: Value) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": "n1"},
        "spec": {"taints": taints},
        "status": {"conditions": [{"type": "Ready", "status": ready,
                                   "lastTransitionTime": "2026-01-01T00:01:00Z"}]},
    }))
    .unwrap()
}

fn at(s: &str) -> Option<DateTime<Utc>> {
    Some(s.parse().unwrap())
}

#[test]
fn a_node_is_ready_not_ready_stopped_or_unknown() {
    assert_eq!(
        node_state(Some(&node("True", json!([]))), true),
        NodeState::Ready
    );
    for status in ["False", "Unknown"] {
        assert_eq!(
            node_state(Some(&node(status, json!([]))), true),
            NodeState::NotReady {
                since: at("2026-01-01T00:01:00Z")
            }
        );
    }
    let oos =
        json!([{"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"}]);
    assert_eq!(
        node_state(Some(&node("Unknown", oos)), true),
        NodeState::Stopped
    );
    assert_eq!(node_state(None, true), NodeState::Stopped, "deleted");
    assert_eq!(
        node_state(None, false),
        NodeState::Unknown,
        "not listed yet"
    );
    let fresh: Node = serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap();
    assert_eq!(node_state(Some(&fresh), true), NodeState::Unknown);
}

#[test]
fn a_running_pod_on_a_node_that_does_not_report_holds_the_verdict() {
    let p = pod(
        "p",
        Some("n1"),
        json!({"phase": "Running", "containerStatuses": [running()]}),
    );
    let since = at("2026-01-01T00:01:00Z");
    assert_eq!(
        hold(&p, &NodeState::NotReady { since }),
        Some(Hold {
            pod: "p".into(),
            node: "n1".into(),
            unreachable: true,
            since
        })
    );
    assert_eq!(hold(&p, &NodeState::Ready), None);
    assert_eq!(hold(&p, &NodeState::Stopped), None);
    assert_eq!(
        hold(&p, &NodeState::Unknown),
        None,
        "no evidence of a lost node"
    );
    let unscheduled = pod("u", None, json!({"phase": "Pending"}));
    assert_eq!(hold(&unscheduled, &NodeState::NotReady { since }), None);
    // Bound to the node, which may have started it without reporting.
    let bound = pod("b", Some("n1"), json!({"phase": "Pending"}));
    assert!(hold(&bound, &NodeState::NotReady { since }).is_some());
}

#[test]
fn taint_manager_and_pod_gc_are_not_the_kubelet() {
    for reason in ["DeletionByTaintManager", "DeletionByPodGC"] {
        // PodGC also sets the phase to Failed; the containers still say running.
        let p = pod(
            "p",
            Some("n1"),
            json!({"phase": "Failed", "conditions": [evicted(reason)], "containerStatuses": [running()]}),
        );
        assert!(!stopped_by_kubelet(&p), "{reason}");
        let h = hold(&p, &NodeState::Unknown).expect(reason);
        assert!(
            h.unreachable && h.since == at("2026-01-01T00:06:00Z"),
            "{h:?}"
        );
        let h = hold(&p, &NodeState::Ready).expect(reason);
        assert!(
            !h.unreachable,
            "the node is back, its kubelet has yet to stop the pod"
        );
        assert_eq!(hold(&p, &NodeState::Stopped), None, "{reason}");
    }
    // The kubelet's own eviction and termination are its word.
    let by_kubelet = pod(
        "k",
        Some("n1"),
        json!({"phase": "Failed", "conditions": [evicted("TerminationByKubelet")]}),
    );
    assert!(stopped_by_kubelet(&by_kubelet));
    let ended = pod(
        "e",
        Some("n1"),
        json!({"phase": "Running", "conditions": [evicted("DeletionByTaintManager")], "containerStatuses": [terminated(137)]}),
    );
    assert!(stopped_by_kubelet(&ended));
    assert_eq!(hold(&ended, &NodeState::NotReady { since: None }), None);
    let done = pod("d", Some("n1"), json!({"phase": "Succeeded"}));
    assert_eq!(hold(&done, &NodeState::NotReady { since: None }), None);
}

#[test]
fn the_oldest_held_pod_is_named() {
    let mut older = pod(
        "older",
        Some("n1"),
        json!({"phase": "Running", "containerStatuses": [running()]}),
    );
    let newer = pod(
        "newer",
        Some("n2"),
        json!({"phase": "Running", "containerStatuses": [running()]}),
    );
    older.metadata.creation_timestamp =
        serde_json::from_value(json!("2025-12-31T23:59:00Z")).unwrap();
    let lost = |n: &str| {
        if n == "n1" || n == "n2" {
            NodeState::NotReady { since: None }
        } else {
            NodeState::Ready
        }
    };
    let both = holds([&newer, &older], lost);
    assert_eq!(both.len(), 2);
    assert_eq!(pick(both).unwrap().pod, "older");
    assert_eq!(pick(holds([&newer, &older], |_| NodeState::Ready)), None);
    let h = pick(holds([&newer], |_| NodeState::NotReady {
        since: at("2026-01-01T00:01:00Z"),
    }))
    .unwrap();
    assert!(h.describe().contains("node n2") && h.describe().contains("2026-01-01T00:01:00Z"));
}

#[test]
fn a_hold_on_a_lost_node_is_said_before_an_older_one_on_a_node_back() {
    let back = Hold {
        pod: "old".into(),
        node: "n1".into(),
        unreachable: false,
        since: None,
    };
    let lost = Hold {
        pod: "new".into(),
        node: "n2".into(),
        unreachable: true,
        since: None,
    };
    assert_eq!(pick(vec![back.clone(), lost.clone()]), Some(lost));
    assert_eq!(pick(vec![back.clone()]), Some(back));
    assert_eq!(pick(vec![]), None);
}

#[test]
fn a_pod_force_deleted_on_a_lost_node_holds_until_its_node_reports_or_is_stopped() {
    let held = Hold {
        pod: "p".into(),
        node: "n1".into(),
        unreachable: true,
        since: at("2026-01-01T00:01:00Z"),
    };
    let present: std::collections::BTreeSet<String> = ["p".to_string()].into();
    let (now, gone) = with_gone(vec![held.clone()], &present, &Gone::new(), |_| {
        NodeState::NotReady { since: None }
    });
    assert_eq!(now, vec![held.clone()]);
    assert_eq!(gone, Gone::from([("p".into(), "n1".into())]));
    // Gone from the API server while its node still does not report: still held.
    let nobody = std::collections::BTreeSet::new();
    let since = at("2026-01-01T00:01:00Z");
    let (now, kept) = with_gone(vec![], &nobody, &gone, |_| NodeState::NotReady { since });
    assert_eq!(now, vec![held]);
    assert_eq!(kept, gone);
    // Its node reports again, or is stopped: the pod stopped.
    for state in [NodeState::Ready, NodeState::Stopped, NodeState::Unknown] {
        let (now, kept) = with_gone(vec![], &nobody, &gone, |_| state.clone());
        assert!(now.is_empty() && kept.is_empty(), "{state:?}");
    }
    // A pod present and no longer held (its kubelet reported) is forgotten.
    let (now, kept) = with_gone(vec![], &present, &gone, |_| NodeState::NotReady { since });
    assert!(now.is_empty() && kept.is_empty());
}
