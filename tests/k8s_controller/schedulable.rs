//! The WorkOrder `Schedulable` condition (docs/design.md §10) against a real kube-apiserver: why an
//! order waits, updated within 10 s when an agent is registered or retired (causes outside the
//! order's row), one Event when it becomes unschedulable, and waiting read as progress by
//! kstatus, Flux and Argo CD.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event as KubeEvent;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use pullman::crd::{Executor, WorkOrderPhase, WorkOrderResource};
use reqwest::Method;
use serde_json::{Value, json};

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
    let (code, v) = s
        .call(
            Method::POST,
            &format!("/api/v1/agents/{agent}/claim"),
            Some(&tok),
            None,
        )
        .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["id"], json!(uid), "{v}");
    phase_is(&api, "lonely", WorkOrderPhase::Claimed).await;
    let obj = schedulable_is(&ns, "lonely", "Claimed", 10).await;
    assert!(message(&obj, "Schedulable").contains(&agent));
    let (code, v) = s
        .call(
            Method::POST,
            &format!("/api/v1/work-orders/{uid}/complete"),
            Some(&tok),
            Some(json!({"agent_id": agent, "success": true})),
        )
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
    let (code, v) = s
        .admin(Method::DELETE, &format!("/api/v1/agents/{agent}"), None)
        .await;
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

/// Waits until Executor `name` reports `available` replicas of its Deployment.
async fn available_is(executors: &Api<Executor>, name: &str, available: i32) {
    eventually(
        60,
        &format!("{name}: {available} replicas available"),
        || async {
            let ex = executors.get(name).await.ok()?;
            (ex.status?.available_replicas == Some(available)).then_some(())
        },
    )
    .await;
}

/// Issue #35: an Executor that KEDA (or any autoscaler) has scaled to zero is waited for, not
/// reported: the orders only it may take are `Schedulable=True AwaitingScaleUp` with no Warning
/// Event. The same Executor with a replica up that does not call in is `NoAgentConnected`, with
/// its Event, so the check can tell the two apart.
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
    // `replicas` unset: the count is the autoscaler's; a new Deployment starts with 1.
    let ex: Executor = serde_json::from_value(json!({
        "apiVersion": "pullman.dev/v1alpha1", "kind": "Executor", "metadata": {"name": "elastic"},
        "spec": {"labels": ["elastic"], "deployment": {"image": "pullman:test"}},
    }))
    .unwrap();
    executors.create(&PostParams::default(), &ex).await.unwrap();
    available_is(&executors, "elastic", 1).await;

    // A replica is up but its agent never calls: that is for someone to fix.
    create_wo(&api, work_order("early", "elastic", CM)).await;
    schedulable_is(&ns, "early", "NoAgentConnected", 10).await;
    eventually(10, "early's Unschedulable Event", || async {
        (unschedulable_events(&events, "early").await == 1).then_some(())
    })
    .await;

    // Scaled to zero: the waiting order says it awaits the scale-up, within a refresh.
    scale_as_autoscaler(&deployments, "elastic-executor", 0).await;
    available_is(&executors, "elastic", 0).await;
    let obj = schedulable_is(&ns, "early", "AwaitingScaleUp", 15).await;
    assert_health(
        &obj,
        "awaiting scale-up",
        &waiting("Pending", "True", "AwaitingScaleUp"),
        "InProgress",
        "Progressing",
    );
    let said = message(&obj, "Schedulable");
    assert!(said.contains(&format!("Executor {ns}/elastic")), "{said}");

    // An order created while it is at zero: True from its first condition, and no Event.
    create_wo(&api, work_order("later", "elastic", CM)).await;
    phase_is(&api, "later", WorkOrderPhase::Pending).await;
    schedulable_is(&ns, "later", "AwaitingScaleUp", 10).await;
    tokio::time::sleep(2 * pullman::controller::schedulable::REFRESH_EVERY).await;
    assert_eq!(unschedulable_events(&events, "later").await, 0);
    assert_eq!(unschedulable_events(&events, "early").await, 1);

    stop.cancel();
    drop_namespace(&k, &ns).await;
}
