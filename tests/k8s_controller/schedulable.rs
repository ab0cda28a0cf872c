//! The WorkOrder `Schedulable` condition (docs/design.md §10) against a real kube-apiserver: why an
//! order waits, updated within 10 s when an agent is registered or retired (causes outside the
//! order's row), one Event when it becomes unschedulable, a claimed order whose agent says its
//! node does not report (docs/design.md §12), and waiting read as progress by kstatus, Flux and
//! Argo CD.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event as KubeEvent;
use kube::Client;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use pullman::crd::{Executor, WorkOrderPhase, WorkOrderResource};
use serde_json::{Value, json};

use super::executor_health::create_executor;
use super::replicas::scale_as_autoscaler;
use super::verdicts::{assert_health, live, message};
use super::{CM, create_wo, phase_is, start_controllers, work_order};
use crate::support::kube::{client, drop_namespace, namespace};
use crate::support::{TestServer, eventually};

/// The conditions of a waiting order, with `Schedulable` as given.
fn waiting(
    phase: &'static str,
    status: &'static str,
    reason: &'static str,
) -> [(&'static str, &'static str, &'static str); 4] {
    [
        ("Ready", "False", phase),
        ("Completed", "False", phase),
        ("Reconciling", "True", phase),
        ("Schedulable", status, reason),
    ]
}

/// Waits up to `secs` for WorkOrder `name`'s `Schedulable` condition to have `reason`; returns
/// the object as kubectl reads it.
async fn schedulable_is(ns: &str, name: &str, reason: &str, secs: u64) -> Value {
    eventually(secs, &format!("{name}: Schedulable {reason}"), || async {
        let obj = live(ns, "workorder", name);
        let found = obj["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Schedulable" && c["reason"] == reason);
        found.then_some(obj)
    })
    .await
}

/// `Unschedulable` Events on WorkOrder `name`, counting repeats of one Event (its series).
async fn unschedulable_events(events: &Api<KubeEvent>, name: &str) -> i32 {
    let list = events.list(&ListParams::default()).await.unwrap();
    list.items
        .iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter(|e| e.reason.as_deref() == Some("Unschedulable"))
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_order_says_why_and_follows_its_agents() {
    let k = client().await;
    let ns = namespace(&k, "sched").await;
    let s = TestServer::start().await;
    let stop = start_controllers(&k, &s, &ns);
    let api: Api<WorkOrderResource> = Api::namespaced(k.clone(), &ns);
    let events: Api<KubeEvent> = Api::namespaced(k.clone(), &ns);

    // No agent carries the label: unschedulable from the first status, progress to GitOps tools.
    let uid = create_wo(&api, work_order("lonely", "gpu", CM))
        .await
        .uid()
        .unwrap();
    phase_is(&api, "lonely", WorkOrderPhase::Pending).await;
    let obj = schedulable_is(&ns, "lonely", "NoMatchingAgent", 10).await;
    assert_health(
        &obj,
        "no matching agent",
        &waiting("Pending", "False", "NoMatchingAgent"),
        "InProgress",
        "Progressing",
    );
    assert!(
        message(&obj, "Schedulable").contains("No live agent may take work order"),
        "{}",
        message(&obj, "Schedulable")
    );
    eventually(10, "the Unschedulable Event", || async {
        (unschedulable_events(&events, "lonely").await == 1).then_some(())
    })
    .await;

    // A matching agent registered that has never called: still False, for the new reason,
    // within 10 s although the order's row did not change.
    let (agent, tok) = s.agent(json!({"name": "gpu-1", "labels": ["gpu"]})).await;
    let obj = schedulable_is(&ns, "lonely", "NoAgentConnected", 10).await;
    assert_health(
        &obj,
        "no agent connected",
        &waiting("Pending", "False", "NoAgentConnected"),
        "InProgress",
        "Progressing",
    );
    // Agents are named by `explain`, not in the condition: agents coming and going do not
    // rewrite every waiting WorkOrder's status.
    let said = message(&obj, "Schedulable");
    assert!(said.contains("none of them is in contact"), "{said}");
    assert!(!said.contains("gpu-1"), "{said}");
    // Two refreshes later, still one Event: it was not unschedulable twice.
    tokio::time::sleep(2 * pullman::controller::schedulable::REFRESH_EVERY).await;
    assert_eq!(unschedulable_events(&events, "lonely").await, 1);

    // The agent calls and takes it: the order runs.
    let (code, v) = s.claim_next(&agent, &tok, None).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["id"], json!(uid), "{v}");
    phase_is(&api, "lonely", WorkOrderPhase::Claimed).await;
    let obj = schedulable_is(&ns, "lonely", "Claimed", 10).await;
    assert!(message(&obj, "Schedulable").contains(&agent));

    // Its agent says a pod of it may still run on a node that does not report (§12): the
    // condition says so within seconds (the heartbeat notifies the controller), with one Warning
    // Event, and goes back to Claimed when the agent says nothing holds it up any more.
    let lost = json!({"reason": "node_unreachable", "message": "pod p may still run on node n1",
                      "node": {"name": "n1"}});
    let (code, v) = s
        .heartbeat(&uid, &tok, json!({"agent_id": agent, "waiting": lost}))
        .await;
    assert_eq!(code, 200, "{v}");
    let obj = schedulable_is(&ns, "lonely", "NodeUnreachable", 5).await;
    assert_eq!(
        message(&obj, "Schedulable"),
        "pod p may still run on node n1"
    );
    let node_events = || async {
        let list = events.list(&ListParams::default()).await.unwrap();
        list.items
            .iter()
            .filter(|e| e.reason.as_deref() == Some("NodeUnreachable"))
            .map(|e| e.series.as_ref().map_or(1, |s| s.count))
            .sum::<i32>()
    };
    eventually(10, "the NodeUnreachable Event", || async {
        (node_events().await == 1).then_some(())
    })
    .await;
    let (code, v) = s
        .heartbeat(&uid, &tok, json!({"agent_id": agent, "waiting": lost}))
        .await;
    assert_eq!(code, 200, "{v}");
    let (code, v) = s.heartbeat(&uid, &tok, json!({"agent_id": agent})).await;
    assert_eq!(code, 200, "{v}");
    schedulable_is(&ns, "lonely", "Claimed", 5).await;
    assert_eq!(node_events().await, 1, "said once");
    let (code, v) = s
        .complete(&uid, &tok, json!({"agent_id": agent, "success": true}))
        .await;
    assert_eq!(code, 200, "{v}");
    let done = phase_is(&api, "lonely", WorkOrderPhase::Succeeded).await;
    let kept = done
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Schedulable")
        .expect("a finished order keeps its last Schedulable");
    assert_eq!(
        (kept.status.as_str(), kept.reason.as_str()),
        ("True", "Claimed")
    );

    // The agent is in contact now: a new order for it is schedulable at once.
    create_wo(&api, work_order("second", "gpu", CM)).await;
    let obj = schedulable_is(&ns, "second", "Matched", 10).await;
    assert_health(
        &obj,
        "matched",
        &waiting("Pending", "True", "Matched"),
        "InProgress",
        "Progressing",
    );
    assert_eq!(unschedulable_events(&events, "second").await, 0);

    // Retiring the only matching agent makes it unschedulable again within 10 s, with its Event.
    let (code, v) = s.retire(&agent).await;
    assert!(code == 200 || code == 204, "retire: {code} {v}");
    let obj = schedulable_is(&ns, "second", "NoMatchingAgent", 10).await;
    assert_health(
        &obj,
        "agent retired",
        &waiting("Pending", "False", "NoMatchingAgent"),
        "InProgress",
        "Progressing",
    );
    eventually(10, "the second order's Unschedulable Event", || async {
        (unschedulable_events(&events, "second").await == 1).then_some(())
    })
    .await;

    stop.cancel();
    drop_namespace(&k, &ns).await;
}

/// Waits until Executor `name` reports that its Deployment asks for `replicas`.
async fn replicas_are(executors: &Api<Executor>, name: &str, replicas: i32) {
    eventually(
        60,
        &format!("{name}: status.replicas {replicas}"),
        || async {
            let ex = executors.get(name).await.ok()?;
            (ex.status?.replicas == Some(replicas)).then_some(())
        },
    )
    .await;
}

/// Creates Executor `name` taking orders labelled `name`, with a Deployment whose count is
/// `replicas` (an autoscaler's when `None`).
async fn create_scaled_executor(k: &Client, ns: &str, name: &str, replicas: Option<i32>) {
    let mut deployment = json!({"image": "pullman:test"});
    if let Some(r) = replicas {
        deployment["replicas"] = json!(r);
    }
    let spec = json!({"labels": [name], "deployment": deployment});
    create_executor(k, ns, name, spec).await;
}

/// Issue #35: an Executor that KEDA (or any autoscaler) has scaled to zero is waited for, not
/// reported: the orders waiting for it are `Schedulable=True AwaitingScaleUp`, with no Warning
/// Event. An Executor whose count the controller keeps, with a replica that never calls in, is
/// `NoAgentConnected` with its Event, so the check tells the two apart. (The start-up grace,
/// `schedulable::STARTING_FOR`, and a stalled Executor are covered by the unit tests.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_for_an_executor_scaled_to_zero_awaits_its_scale_up() {
    let k = client().await;
    let ns = namespace(&k, "scaleup").await;
    let s = TestServer::start().await;
    let stop = start_controllers(&k, &s, &ns);
    let api: Api<WorkOrderResource> = Api::namespaced(k.clone(), &ns);
    let events: Api<KubeEvent> = Api::namespaced(k.clone(), &ns);
    let executors: Api<Executor> = Api::namespaced(k.clone(), &ns);
    let deployments: Api<Deployment> = Api::namespaced(k.clone(), &ns);
    create_scaled_executor(&k, &ns, "elastic", None).await;
    create_scaled_executor(&k, &ns, "pinned", Some(1)).await;
    // A new Deployment starts with 1; the autoscaler takes it to 0.
    replicas_are(&executors, "elastic", 1).await;
    scale_as_autoscaler(&deployments, "elastic-executor", 0).await;
    replicas_are(&executors, "elastic", 0).await;

    create_wo(&api, work_order("elastic-order", "elastic", CM)).await;
    create_wo(&api, work_order("pinned-order", "pinned", CM)).await;
    let obj = schedulable_is(&ns, "elastic-order", "AwaitingScaleUp", 10).await;
    assert_health(
        &obj,
        "awaiting scale-up",
        &waiting("Pending", "True", "AwaitingScaleUp"),
        "InProgress",
        "Progressing",
    );
    let said = message(&obj, "Schedulable");
    assert!(
        said.contains(&format!("Executor {ns}/elastic may take this order")),
        "{said}"
    );
    schedulable_is(&ns, "pinned-order", "NoAgentConnected", 10).await;
    eventually(10, "pinned-order's Unschedulable Event", || async {
        (unschedulable_events(&events, "pinned-order").await == 1).then_some(())
    })
    .await;
    // Two refreshes later, the order for the scaled-to-zero Executor has had no Event.
    tokio::time::sleep(2 * pullman::controller::schedulable::REFRESH_EVERY).await;
    assert_eq!(unschedulable_events(&events, "elastic-order").await, 0);
    phase_is(&api, "elastic-order", WorkOrderPhase::Pending).await;

    stop.cancel();
    drop_namespace(&k, &ns).await;
}
