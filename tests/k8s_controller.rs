//! The WorkOrder / Executor controller against a real kube-apiserver (e2e/testenv) and a real
//! PostgreSQL. Each test reconciles its own namespace with its own database.

mod support;

#[path = "k8s_controller/executor_health.rs"]
mod executor_health;
#[path = "k8s_controller/leader.rs"]
mod leader;
#[path = "k8s_controller/replicas.rs"]
mod replicas;
#[path = "k8s_controller/scale.rs"]
mod scale;
#[path = "k8s_controller/schedulable.rs"]
mod schedulable;
#[path = "k8s_controller/verdicts.rs"]
mod verdicts;
#[path = "k8s_controller/workorder_health.rs"]
mod workorder_health;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event as KubeEvent;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::Reporter;
use kube::{Api, Client, ResourceExt};
use pullman::controller::{self, Context, ControllerConfig};
use pullman::crd::{Executor, WorkOrderPhase, WorkOrderResource};
use reqwest::Method;
use serde_json::{Value, json};
use support::kube::{client, drop_namespace, kubectl, namespace};
use support::{TestServer, eventually};
use tokio_util::sync::CancellationToken;

fn config(ns: &str, identity: &str) -> ControllerConfig {
    ControllerConfig {
        namespace: Some(ns.to_string()),
        lease_namespace: ns.to_string(),
        lease_name: "pullman-controller".into(),
        identity: identity.into(),
        executor_server_url: Some("http://pullman.example:8080".into()),
        resync: Duration::from_secs(30),
    }
}

/// Runs the controllers (no leader election) for `ns` until the token is cancelled.
fn start_controllers(k: &Client, s: &TestServer, ns: &str) -> CancellationToken {
    let stop = CancellationToken::new();
    let ctx = Arc::new(Context {
        client: k.clone(),
        queue: s.queue.clone(),
        events: controller::Events::start(
            k.clone(),
            Reporter {
                controller: "pullman-controller".into(),
                instance: Some("test".into()),
            },
        ),
        config: config(ns, "test"),
    });
    tokio::spawn(controller::run_controllers(
        ctx,
        s.notifications.clone(),
        stop.clone(),
    ));
    stop
}

fn work_order(name: &str, label: &str, yaml: &str) -> Value {
    json!({
        "apiVersion": "pullman.dev/v1alpha1",
        "kind": "WorkOrder",
        "metadata": {"name": name},
        "spec": {
            "workType": "custom",
            "yamlContent": yaml,
            "maxRetries": 2,
            "backoffSeconds": 1,
            "targeting": {"labels": [label]},
        },
    })
}

const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: demo\n";

async fn create_wo(api: &Api<WorkOrderResource>, body: Value) -> WorkOrderResource {
    let wo: WorkOrderResource = serde_json::from_value(body).unwrap();
    api.create(&PostParams::default(), &wo).await.unwrap()
}

async fn phase_is(
    api: &Api<WorkOrderResource>,
    name: &str,
    phase: WorkOrderPhase,
) -> WorkOrderResource {
    eventually(
        30,
        &format!("WorkOrder {name} in phase {phase:?}"),
        || async {
            let wo = api.get(name).await.ok()?;
            (wo.status.as_ref()?.phase == Some(phase)).then_some(wo)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samples_apply_and_the_api_server_rejects_invalid_work_orders() {
    let k = client().await;
    let ns = namespace(&k, "samples").await;
    for sample in [
        "executor.yaml",
        "executor-deployed.yaml",
        "workorder-pi-job.yaml",
        "workorder-build.yaml",
    ] {
        let path = format!("{}/config/samples/{sample}", env!("CARGO_MANIFEST_DIR"));
        let (ok, out, err) = kubectl(&["apply", "-n", &ns, "-f", &path], None);
        assert!(ok, "kubectl apply {sample}: {out}{err}");
    }
    let invalid = [
        (
            "bad enum",
            r#"{"workType": "deploy", "yamlContent": "x", "targeting": {"labels": ["a"]}}"#,
            "Unsupported value: \"deploy\"",
        ),
        (
            "out of range",
            r#"{"workType": "custom", "yamlContent": "x", "maxRetries": 101, "targeting": {"labels": ["a"]}}"#,
            "spec.maxRetries",
        ),
        (
            "no targeting criterion",
            r#"{"workType": "custom", "yamlContent": "x", "targeting": {}}"#,
            "targeting needs at least one",
        ),
        (
            "missing yamlContent",
            r#"{"workType": "custom", "targeting": {"labels": ["a"]}}"#,
            "spec.yamlContent",
        ),
    ];
    for (what, spec, expect) in invalid {
        let manifest = format!(
            r#"{{"apiVersion": "pullman.dev/v1alpha1", "kind": "WorkOrder", "metadata": {{"name": "bad"}}, "spec": {spec}}}"#
        );
        let (ok, _, err) = kubectl(&["apply", "-n", &ns, "-f", "-"], Some(&manifest));
        assert!(!ok, "{what} must be rejected");
        assert!(err.contains(expect), "{what}: {err}");
    }
    // spec is immutable after creation (CEL).
    let (ok, _, err) = kubectl(
        &[
            "patch",
            "-n",
            &ns,
            "workorder",
            "pi",
            "--type=merge",
            "-p",
            r#"{"spec":{"maxRetries":2}}"#,
        ],
        None,
    );
    assert!(!ok);
    assert!(err.contains("spec is immutable"), "{err}");
    let (ok, out, _) = kubectl(&["get", "-n", &ns, "wo"], None);
    assert!(
        ok && out.contains("TYPE") && out.contains("PHASE") && out.contains("pi"),
        "{out}"
    );
    let (ok, out, _) = kubectl(&["explain", "workorder.spec.claimTimeoutSeconds"], None);
    assert!(
        ok && out.contains("watch budget"),
        "kubectl explain shows field docs: {out}"
    );
    drop_namespace(&k, &ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_work_order_resource_follows_its_queue_row() {
    let k = client().await;
    let ns = namespace(&k, "wo").await;
    let s = TestServer::start().await;
    let stop = start_controllers(&k, &s, &ns);
    let api: Api<WorkOrderResource> = Api::namespaced(k.clone(), &ns);
    let (agent, tok) = s.agent(json!({"name": "a", "labels": ["x"]})).await;
    let wo = create_wo(&api, work_order("demo", "x", CM)).await;
    let uid = wo.uid().unwrap();

    let wo = phase_is(&api, "demo", WorkOrderPhase::Pending).await;
    assert!(wo.finalizers().contains(&"pullman.dev/cancel".to_string()));
    let st = wo.status.unwrap();
    assert_eq!(
        st.work_order_id.as_deref(),
        Some(uid.as_str()),
        "queue row id = metadata.uid"
    );
    let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "Pending"),
        "Ready means succeeded (docs/design.md §6)"
    );

    let (code, claimed) = s.claim(&uid, &agent, &tok).await;
    assert_eq!(code, 200, "{claimed}");
    let wo = phase_is(&api, "demo", WorkOrderPhase::Claimed).await;
    assert_eq!(
        wo.status.unwrap().claimed_by.as_deref(),
        Some(agent.as_str())
    );

    let (code, _) = s
        .complete(
            &uid,
            &tok,
            json!({"agent_id": agent, "success": false, "message": "flaky"}),
        )
        .await;
    assert_eq!(code, 202);
    let wo = phase_is(&api, "demo", WorkOrderPhase::RetryPending).await;
    let st = wo.status.unwrap();
    assert!(st.next_retry_after.is_some());
    assert_eq!(st.last_error.as_deref(), Some("flaky"));
    assert_eq!(st.retry_count, Some(1));

    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (code, v) = s.claim(&uid, &agent, &tok).await;
    assert_eq!(code, 200, "{v}");
    let (code, _) = s
        .complete(
            &uid,
            &tok,
            json!({"agent_id": agent, "success": true, "message": "done at last"}),
        )
        .await;
    assert_eq!(code, 200);
    let wo = phase_is(&api, "demo", WorkOrderPhase::Succeeded).await;
    let st = wo.status.unwrap();
    assert_eq!(st.message.as_deref(), Some("done at last"));
    let completed = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Completed")
        .unwrap();
    assert_eq!(
        (completed.status.as_str(), completed.reason.as_str()),
        ("True", "Succeeded")
    );

    // Events were recorded for the claim and the outcome.
    let events: Api<KubeEvent> = Api::namespaced(k.clone(), &ns);
    let reasons: Vec<String> = eventually(10, "events", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        let r: Vec<String> = list.items.iter().filter_map(|e| e.reason.clone()).collect();
        (r.contains(&"Claimed".to_string()) && r.contains(&"Succeeded".to_string())).then_some(r)
    })
    .await;
    assert!(
        reasons.contains(&"AttemptFailed".to_string()),
        "{reasons:?}"
    );
    stop.cancel();
    drop_namespace(&k, &ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_claimed_work_order_cancels_it() {
    let k = client().await;
    let ns = namespace(&k, "del").await;
    let s = TestServer::start().await;
    let stop = start_controllers(&k, &s, &ns);
    let api: Api<WorkOrderResource> = Api::namespaced(k.clone(), &ns);
    let (agent, tok) = s.agent(json!({"name": "a", "labels": ["x"]})).await;
    let uid = create_wo(&api, work_order("doomed", "x", CM))
        .await
        .uid()
        .unwrap();
    phase_is(&api, "doomed", WorkOrderPhase::Pending).await;
    let (code, claim) = s
        .call(
            Method::POST,
            &format!("/api/v1/work-orders/{uid}/claim"),
            Some(&tok),
            Some(json!({"agent_id": agent, "lease_seconds": 30})),
        )
        .await;
    assert_eq!(code, 200);
    api.delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    eventually(30, "the WorkOrder to be gone", || async {
        api.get_opt("doomed").await.ok()?.is_none().then_some(())
    })
    .await;
    let (code, v) = s
        .heartbeat(
            &uid,
            &tok,
            json!({"agent_id": agent, "claim_id": claim["claim_id"]}),
        )
        .await;
    assert_eq!(code, 409, "{v}");
    assert_eq!(v["error"]["code"], "cancelled");
    stop.cancel();
    drop_namespace(&k, &ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_yields_a_token_secret_that_rotates_and_retires_with_it() {
    let k = client().await;
    let ns = namespace(&k, "ex").await;
    let s = TestServer::start().await;
    let stop = start_controllers(&k, &s, &ns);
    let executors: Api<Executor> = Api::namespaced(k.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(k.clone(), &ns);
    let ex: Executor = serde_json::from_value(json!({
        "apiVersion": "pullman.dev/v1alpha1", "kind": "Executor",
        "metadata": {"name": "runner"},
        "spec": {"labels": ["x"], "workTypes": ["custom"], "maxConcurrency": 2, "leaseSeconds": 30},
    }))
    .unwrap();
    let uid = executors
        .create(&PostParams::default(), &ex)
        .await
        .unwrap()
        .uid()
        .unwrap();
    let token_of =
        |secret: Secret| String::from_utf8(secret.data.unwrap()["token"].0.clone()).unwrap();
    let first = eventually(30, "the token Secret", || async {
        secrets
            .get_opt("runner-agent-token")
            .await
            .ok()?
            .map(token_of)
    })
    .await;
    let secret = secrets.get("runner-agent-token").await.unwrap();
    assert_eq!(
        secret.owner_references()[0].uid,
        uid,
        "owned by the Executor"
    );

    // The token works for that agent only.
    let (code, me) = s.get_as("/api/v1/whoami", &first).await;
    assert_eq!(code, 200);
    assert_eq!(me["agent_id"], json!(uid));
    assert_eq!(me["agent_name"], json!(format!("{ns}/runner")));
    let (other, _) = s.agent(json!({"name": "other", "labels": ["x"]})).await;
    let (code, _) = s
        .get_as(
            &format!("/api/v1/agents/{other}/work-orders/pending"),
            &first,
        )
        .await;
    assert_eq!(code, 403);
    let ex = eventually(30, "Executor status", || async {
        let ex = executors.get("runner").await.ok()?;
        (ex.status.as_ref()?.agent_id.as_deref() == Some(uid.as_str())).then_some(ex)
    })
    .await;
    let st = ex.status.unwrap();
    assert_eq!(st.health.as_deref(), Some("never_seen"));
    assert_eq!(st.token_secret_name.as_deref(), Some("runner-agent-token"));
    let agent = s.queue.get_agent(uid.parse().unwrap()).await.unwrap();
    assert_eq!(agent.max_concurrency, Some(2));
    assert_eq!(agent.labels, vec!["x".to_string()]);

    // Spec changes reach the agent.
    executors
        .patch(
            "runner",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"labels": ["x", "y"]}})),
        )
        .await
        .unwrap();
    eventually(30, "the agent's labels to follow the spec", || async {
        let a = s.queue.get_agent(uid.parse().unwrap()).await.ok()?;
        (a.labels == vec!["x".to_string(), "y".to_string()]).then_some(())
    })
    .await;

    // Deleting the Secret re-issues the token and revokes the old one.
    secrets
        .delete("runner-agent-token", &DeleteParams::default())
        .await
        .unwrap();
    let second = eventually(30, "a new token Secret", || async {
        let t = secrets.get_opt("runner-agent-token").await.ok()??;
        let t = token_of(t);
        (t != first).then_some(t)
    })
    .await;
    assert_eq!(s.get_as("/api/v1/whoami", &first).await.0, 401);
    assert_eq!(s.get_as("/api/v1/whoami", &second).await.0, 200);

    // A claim held by the executor's agent is freed when the Executor is deleted.
    let o = s
        .order(json!({"work_type": "custom", "yaml_content": CM, "targeting": {"labels": ["y"]}}))
        .await;
    let (code, _) = s.claim(&o, &uid, &second).await;
    assert_eq!(code, 200);
    executors
        .delete("runner", &DeleteParams::default())
        .await
        .unwrap();
    eventually(30, "the Executor to be gone", || async {
        executors
            .get_opt("runner")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    let agent = s.queue.get_agent(uid.parse().unwrap()).await.unwrap();
    assert!(agent.retired_at.is_some(), "agent retired");
    assert_eq!(s.get_as("/api/v1/whoami", &second).await.0, 401);
    let (_, v) = s.admin_get(&format!("/api/v1/work-orders/{o}")).await;
    assert_eq!(v["status"], "PENDING", "claims freed");
    stop.cancel();
    drop_namespace(&k, &ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_controller_neither_duplicates_rows_nor_loses_status() {
    let k = client().await;
    let ns = namespace(&k, "rs").await;
    let s = TestServer::start().await;
    let api: Api<WorkOrderResource> = Api::namespaced(k.clone(), &ns);
    let (agent, tok) = s.agent(json!({"name": "a", "labels": ["x"]})).await;
    let stop = start_controllers(&k, &s, &ns);
    let uid = create_wo(&api, work_order("steady", "x", CM))
        .await
        .uid()
        .unwrap();
    phase_is(&api, "steady", WorkOrderPhase::Pending).await;
    stop.cancel();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // While no controller runs, the order is claimed.
    let (code, _) = s.claim(&uid, &agent, &tok).await;
    assert_eq!(code, 200);
    let stop = start_controllers(&k, &s, &ns);
    let wo = phase_is(&api, "steady", WorkOrderPhase::Claimed).await;
    assert_eq!(
        wo.status.unwrap().claimed_by.as_deref(),
        Some(agent.as_str())
    );
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM work_orders")
        .fetch_one(&s.pool)
        .await
        .unwrap();
    assert_eq!(n, 1, "one queue row, not two");
    stop.cancel();
    drop_namespace(&k, &ns).await;
}
