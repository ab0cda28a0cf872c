//! Jobs whose pods sit on a node that does not report (docs/design.md §12): the verdict the Job
//! controller gives on the taint manager's word alone is held, the order says `node_unreachable`
//! with the node, and the Job's verdict is taken, once, when the kubelet reports the pod stopped;
//! a pod force-deleted there still holds it, until the node is marked out-of-service. Either way
//! the attempt is `disrupted` (ended by the lost node, not by the work).
//!
//! The lost node is a Node object that no kubelet (and no kwok) reports for, so the real node
//! lifecycle controller keeps it not Ready; the test plays the parts of its kubelet (the pod's
//! status) and of the taint manager (a `DisruptionTarget` condition, then a graceful deletion that
//! no kubelet completes).

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::{Executor, Setup, order, setup};
use crate::support::kube::drop_namespace;
use crate::support::{TestServer, eventually};

/// The pod of Job `name`, once the Job controller created it.
async fn the_pod(pods: &Api<Pod>, name: &str) -> Pod {
    let selector = format!("batch.kubernetes.io/job-name={name}");
    eventually(60, "the Job's pod", || async {
        pods.list(&ListParams::default().labels(&selector))
            .await
            .ok()?
            .items
            .into_iter()
            .next()
    })
    .await
}

async fn set_pod_status(pods: &Api<Pod>, name: &str, status: Value) {
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .unwrap();
}

/// The order as `GET /work-orders/{id}` answers it.
async fn get(s: &TestServer, id: &str) -> Value {
    let (status, v) = s.admin_get(&format!("/api/v1/work-orders/{id}")).await;
    assert_eq!(status, 200, "{v}");
    v
}

/// Runs Job `name` on node `lost` through an order, plays its kubelet (the pod runs) and the
/// taint manager (a `DisruptionTarget` condition, then a deletion no kubelet completes), and
/// waits until the order says `node_unreachable` and the Job controller has given its
/// `FailureTarget`. Returns the order's id and the pod's name.
async fn held_job(t: &Setup, lost: &str, name: &str) -> (String, String) {
    let yaml = format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {name}\nspec:\n  backoffLimit: 0\n  template:\n    spec:\n      restartPolicy: Never\n      nodeName: {lost}\n      containers:\n      - name: main\n        image: busybox\n        command: [sleep, \"3600\"]\n"
    );
    let id = t.s.order(order(&t.ns, &yaml, 600)).await;
    let pods: Api<Pod> = Api::namespaced(t.k.clone(), &t.ns);
    let pod = the_pod(&pods, name).await;
    let pod_name = pod.metadata.name.clone().unwrap();
    // What its kubelet said last, before the node went away.
    set_pod_status(
        &pods,
        &pod_name,
        json!({"phase": "Running", "containerStatuses": [{
            "name": "main", "image": "busybox", "imageID": "", "ready": true, "restartCount": 0,
            "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}),
    )
    .await;

    // The order says so, naming the node, while claimed.
    let waiting = eventually(30, "the order to say node_unreachable", || async {
        let v = get(&t.s, &id).await;
        (v["waiting"]["reason"] == "node_unreachable").then_some(v)
    })
    .await;
    assert_eq!(waiting["status"], "CLAIMED", "{waiting}");
    assert_eq!(waiting["waiting"]["node"]["name"], lost, "{waiting}");
    assert_eq!(
        waiting["waiting"]["node"]["since"], "2026-01-01T00:00:00Z",
        "{waiting}"
    );
    let message = waiting["waiting"]["message"].as_str().unwrap();
    assert!(
        message.contains(&pod_name) && message.contains(lost),
        "{waiting}"
    );
    let (status, explained) =
        t.s.admin_get(&format!("/api/v1/work-orders/{id}/explain"))
            .await;
    assert_eq!(status, 200, "{explained}");
    assert_eq!(explained["reason"], "node_unreachable", "{explained}");

    // The taint manager evicts the pod: a condition, then a deletion no kubelet completes. The
    // Job controller counts the pod as failed at once.
    set_pod_status(
        &pods,
        &pod_name,
        json!({"conditions": [{"type": "DisruptionTarget", "status": "True",
            "reason": "DeletionByTaintManager",
            "message": "Taint manager: deleting due to NoExecute taint",
            "lastTransitionTime": "2026-01-01T00:05:00Z"}]}),
    )
    .await;
    pods.delete(&pod_name, &DeleteParams::default())
        .await
        .unwrap();
    let jobs: Api<Job> = Api::namespaced(t.k.clone(), &t.ns);
    eventually(60, "the Job controller's FailureTarget", || async {
        let job = jobs.get(name).await.ok()?;
        let conditions = job.status?.conditions?;
        conditions
            .iter()
            .any(|c| c.type_ == "FailureTarget" && c.status == "True")
            .then_some(())
    })
    .await;
    (id, pod_name)
}

/// The order is still claimed, saying `node_unreachable`: its Job's verdict is held.
async fn still_held(s: &TestServer, id: &str, why: &str) {
    let v = get(s, id).await;
    assert_eq!(v["status"], "CLAIMED", "{why}: {v}");
    assert_eq!(v["waiting"]["reason"], "node_unreachable", "{why}: {v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verdict_on_the_taint_managers_word_waits_for_the_kubelet() {
    let t = setup("lostnode").await;
    let nodes: Api<Node> = Api::all(t.k.clone());
    let lost = format!("{}-lost", t.ns);
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": lost}})).unwrap(),
        )
        .await
        .unwrap();
    nodes
        .patch_status(
            &lost,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{
                "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                "message": "Kubelet stopped posting node status.",
                "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})),
        )
        .await
        .unwrap();
    let ex = Executor::start(&t, 15);
    let ((reported, reported_pod), (forced, forced_pod)) = tokio::join!(
        held_job(&t, &lost, "reported"),
        held_job(&t, &lost, "forced")
    );
    // Both Jobs have their verdict; neither order takes it while its pod may still run.
    tokio::time::sleep(Duration::from_secs(5)).await;
    still_held(
        &t.s,
        &reported,
        "a verdict on the taint manager's word alone",
    )
    .await;
    still_held(&t.s, &forced, "a verdict on the taint manager's word alone").await;

    // The kubelet reports the container stopped: the Job's verdict is taken, once.
    let pods: Api<Pod> = Api::namespaced(t.k.clone(), &t.ns);
    set_pod_status(
        &pods,
        &reported_pod,
        json!({"phase": "Failed", "containerStatuses": [{
            "name": "main", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 137, "reason": "Error"}}}]}),
    )
    .await;
    let entry = t.s.log_entry(&reported, 60).await;
    assert_eq!(entry["outcome"], "failed", "{entry}");
    assert_eq!(entry["retry_count"], 0, "{entry}");
    let message = entry["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("Job {}/reported failed", t.ns))
            && message.contains("exited with code 137"),
        "{entry}"
    );
    // Ended by a lost node, not by the work (the order's default is never to run again).
    assert_eq!(entry["attempts"][0]["result"], "disrupted", "{entry}");
    assert_eq!(
        entry["attempts"].as_array().map(Vec::len),
        Some(1),
        "one attempt: {entry}"
    );

    // Force-deleted while its node does not report: it may still run, so still held, past the
    // executor's 10 s look for pods that went.
    pods.delete(&forced_pod, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(12)).await;
    still_held(
        &t.s,
        &forced,
        "a pod force-deleted on a node that does not report",
    )
    .await;
    // The node marked out-of-service (the admin's word that it is shut down): the verdict.
    nodes
        .patch(
            &lost,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": [{
                "key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown",
                "effect": "NoExecute"}]}})),
        )
        .await
        .unwrap();
    let entry = t.s.log_entry(&forced, 60).await;
    assert_eq!(entry["outcome"], "failed", "{entry}");
    assert!(
        crate::support::message(&entry).contains(&format!("Job {}/forced failed", t.ns)),
        "{entry}"
    );
    assert_eq!(entry["attempts"][0]["result"], "disrupted", "{entry}");

    ex.stop().await;
    // No kubelet will finish the deletion.
    let _ = pods
        .delete(&reported_pod, &DeleteParams::default().grace_period(0))
        .await;
    let _ = nodes.delete(&lost, &DeleteParams::default()).await;
    drop_namespace(&t.k, &t.ns).await;
}
