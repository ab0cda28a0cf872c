//! Executor conditions as kstatus and Argo CD read them (docs/design.md §6): Ready without and with a
//! Deployment, Stalled on a Secret Pullman does not own or an agent name taken, and `Connected`
//! following a real executor's contact within seconds. Work run by that executor fails with
//! sentences.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use pullman::client::Client as PullClient;
use pullman::crd::{Executor, WorkOrderPhase, WorkOrderResource};
use pullman::executor::KubeCarrier;
use pullman::pull::{self, LoopConfig, Shutdown};
use serde_json::{Value, json};

use super::verdicts::{argocd, assert_health, conditions, flux, kstatus, live, message};
use super::{create_wo, phase_is, start_controllers};
use crate::support::kube::{client, drop_namespace, namespace};
use crate::support::{TestServer, eventually};

/// Creates Executor `name` in `ns` with `spec`; returns its uid.
pub(super) async fn create_executor(k: &Client, ns: &str, name: &str, spec: Value) -> String {
    let api: Api<Executor> = Api::namespaced(k.clone(), ns);
    let ex: Executor = serde_json::from_value(json!({
        "apiVersion": "pullman.dev/v1alpha1", "kind": "Executor",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap();
    api.create(&PostParams::default(), &ex)
        .await
        .unwrap()
        .uid()
        .unwrap()
}

/// The live Executor once `check` holds for its conditions.
async fn executor_when(ns: &str, name: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    eventually(30, what, || async {
        let (ok, out, _) =
            crate::support::kube::kubectl(&["get", "-n", ns, "executor", name, "-o", "json"], None);
        let obj: Value = serde_json::from_str(&out).ok().filter(|_| ok)?;
        check(&obj).then_some(obj)
    })
    .await
}

fn is(obj: &Value, type_: &str, status: &str) -> bool {
    conditions(obj).get(type_).map(|(s, _)| s.as_str()) == Some(status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_is_ready_apart_from_its_agents_contact_which_follows_within_seconds() {
    let k = client().await;
    let ns = namespace(&k, "exh").await;
    let s = TestServer::start().await;
    let stop = start_controllers(&k, &s, &ns);
    let uid = create_executor(
        &k,
        &ns,
        "runner",
        json!({"labels": ["x"], "leaseSeconds": 5}),
    )
    .await;
    let obj = executor_when(&ns, "runner", "Executor runner Ready", |o| {
        is(o, "Ready", "True")
    })
    .await;
    assert_health(
        &obj,
        "registered, never seen",
        &[
            ("Ready", "True", "Ready"),
            ("Connected", "False", "NeverSeen"),
        ],
        "Current",
        "Healthy",
    );
    assert_eq!(obj["status"]["health"], "never_seen");

    // A real executor with the token from the Secret: contact turns Connected within seconds.
    let secrets: Api<Secret> = Api::namespaced(k.clone(), &ns);
    let token = String::from_utf8(
        secrets
            .get("runner-agent-token")
            .await
            .unwrap()
            .data
            .unwrap()["token"]
            .0
            .clone(),
    )
    .unwrap();
    let shutdown = Shutdown::default();
    let config = LoopConfig {
        agent_id: uid.parse().unwrap(),
        work_types: vec![],
        lease_seconds: 5,
        concurrency: 2,
        max_wait_seconds: 5,
        heartbeat_every: None,
    };
    let started = Instant::now();
    let task = tokio::spawn(pull::run(
        PullClient::new(&s.base, &token).unwrap(),
        config,
        Arc::new(KubeCarrier::new(k.clone(), ns.clone())),
        shutdown.clone(),
    ));
    let obj = executor_when(&ns, "runner", "Connected=True", |o| {
        is(o, "Connected", "True")
    })
    .await;
    let took = started.elapsed();
    println!("agent's first contact -> Connected=True in {took:?}");
    assert!(
        took < Duration::from_secs(5),
        "Connected followed contact in {took:?}"
    );
    assert_health(
        &obj,
        "connected",
        &[("Ready", "True", "Ready"), ("Connected", "True", "Active")],
        "Current",
        "Healthy",
    );
    assert_eq!(obj["status"]["health"], "active");

    // Work through that executor: results are sentences naming what was wrong.
    let orders: Api<WorkOrderResource> = Api::namespaced(k.clone(), &ns);
    let target = json!({"agentNames": [format!("{ns}/runner")]});
    let body = |name: &str, yaml: &str| {
        json!({
            "apiVersion": "pullman.dev/v1alpha1", "kind": "WorkOrder", "metadata": {"name": name},
            "spec": {"workType": "custom", "yamlContent": yaml, "maxRetries": 0, "targeting": target},
        })
    };
    create_wo(
        &orders,
        body(
            "frob",
            "apiVersion: v1\nkind: Frobnicator\nmetadata:\n  name: f\n",
        ),
    )
    .await;
    create_wo(&orders, body("cm", super::CM)).await;
    phase_is(&orders, "frob", WorkOrderPhase::Failed).await;
    phase_is(&orders, "cm", WorkOrderPhase::Succeeded).await;
    let frob = live(&ns, "workorder", "frob");
    let why = message(&frob, "Stalled");
    assert!(why.starts_with("WorkOrder frob failed: "), "{why}");
    assert!(
        why.contains("the cluster does not serve kind Frobnicator in v1"),
        "{why}"
    );
    assert!(
        !why.contains("GroupVersionKind") && !why.contains('{'),
        "no Rust debug text: {why}"
    );

    // The executor goes away: Connected turns False within seconds of the agent turning stale
    // (3 × its 5 s lease after its last contact), and Ready stays True: no red application.
    shutdown.drain.cancel();
    shutdown.abandon.cancel();
    let _ = task.await;
    let agent = s.queue.get_agent(uid.parse().unwrap()).await.unwrap();
    let stale_at = agent.last_seen_at.unwrap() + chrono::Duration::seconds(15);
    let obj = executor_when(&ns, "runner", "Connected=False (stale)", |o| {
        is(o, "Connected", "False")
    })
    .await;
    let lag = chrono::Utc::now() - stale_at;
    println!(
        "agent stale -> Connected=False after {} ms",
        lag.num_milliseconds()
    );
    // Health counts whole seconds (stale once more than 15 s have passed), so up to 1 s of this
    // is the rule itself; the rest is the 2 s contact poll and the reconcile.
    assert!(lag < chrono::Duration::seconds(6), "{lag}");
    assert_health(
        &obj,
        "stale",
        &[("Ready", "True", "Ready"), ("Connected", "False", "Stale")],
        "Current",
        "Healthy",
    );
    stop.cancel();
    drop_namespace(&k, &ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_with_a_deployment_reconciles_until_it_is_available() {
    let k = client().await;
    let ns = namespace(&k, "exd").await;
    let s = TestServer::start().await;
    // Every version of the Executor the API server hands out, from before it exists.
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let dynamic: Api<DynamicObject> =
        Api::namespaced_with(k.clone(), &ns, &ApiResource::erase::<Executor>(&()));
    let recorder = {
        let seen = seen.clone();
        tokio::spawn(async move {
            let mut events = watcher(dynamic, watcher::Config::default()).boxed();
            while let Some(Ok(event)) = events.next().await {
                if let watcher::Event::Apply(o) | watcher::Event::InitApply(o) = event {
                    let mut v = serde_json::to_value(o).unwrap();
                    v["apiVersion"] = json!("pullman.dev/v1alpha1");
                    v["kind"] = json!("Executor");
                    seen.lock().unwrap().push(v);
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stop = start_controllers(&k, &s, &ns);
    create_executor(
        &k,
        &ns,
        "deployed",
        json!({"labels": ["x"], "deployment": {"image": "pullman:test", "replicas": 2}}),
    )
    .await;
    let obj = executor_when(&ns, "deployed", "Executor deployed Ready", |o| {
        is(o, "Ready", "True")
    })
    .await;
    assert_health(
        &obj,
        "Deployment available",
        &[
            ("Ready", "True", "Ready"),
            ("Connected", "False", "NeverSeen"),
        ],
        "Current",
        "Healthy",
    );
    recorder.abort();
    let history = seen.lock().unwrap().clone();
    let rolling = history
        .iter()
        .find(|o| is(o, "Reconciling", "True"))
        .unwrap_or_else(|| panic!("no version with Reconciling=True among {history:#?}"));
    assert_eq!(
        conditions(rolling)["Ready"],
        ("False".to_string(), "DeploymentProgressing".to_string())
    );
    assert!(
        message(rolling, "Reconciling").starts_with("Deployment deployed-executor "),
        "{}",
        message(rolling, "Reconciling")
    );
    assert_eq!(
        kstatus(rolling).0,
        "InProgress",
        "kstatus while the Deployment rolls out"
    );
    assert_eq!(
        argocd(rolling).0,
        "Progressing",
        "Argo CD while the Deployment rolls out"
    );
    assert_eq!(
        flux(rolling).0,
        "InProgress",
        "Flux healthCheckExprs while the Deployment rolls out"
    );
    stop.cancel();
    drop_namespace(&k, &ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_blocked_by_a_secret_it_does_not_own_is_stalled() {
    let k = client().await;
    let ns = namespace(&k, "exs").await;
    let s = TestServer::start().await;
    let secrets: Api<Secret> = Api::namespaced(k.clone(), &ns);
    let foreign: Secret = serde_json::from_value(json!({
        "metadata": {"name": "blocked-agent-token"},
        "stringData": {"token": "somebody else's"},
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let stop = start_controllers(&k, &s, &ns);
    let uid = create_executor(&k, &ns, "blocked", json!({"labels": ["x"]})).await;
    let obj = executor_when(&ns, "blocked", "Executor blocked Stalled", |o| {
        is(o, "Stalled", "True")
    })
    .await;
    assert_health(
        &obj,
        "Secret not owned",
        &[
            ("Ready", "False", "SecretNotOwned"),
            ("Stalled", "True", "SecretNotOwned"),
            ("Connected", "False", "NotRegistered"),
        ],
        "Failed",
        "Degraded",
    );
    assert!(
        message(&obj, "Stalled").contains(&format!(
            "Secret {ns}/blocked-agent-token exists and is not owned by this Executor"
        )),
        "{}",
        message(&obj, "Stalled")
    );
    let kept = secrets.get("blocked-agent-token").await.unwrap();
    assert_eq!(
        kept.data.unwrap()["token"].0,
        b"somebody else's",
        "the Secret was left alone"
    );
    assert!(
        s.queue.get_agent(uid.parse().unwrap()).await.is_err(),
        "no agent registered"
    );
    stop.cancel();
    drop_namespace(&k, &ns).await;
}

/// An Executor whose agent name (`<namespace>/<name>`) a live agent already has is Stalled with
/// `AgentNameTaken`, naming it, and registers nothing; once that agent is retired, the next
/// reconcile (here a touch of the Executor; else within a minute) registers it: Ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_whose_agent_name_is_taken_is_stalled_until_it_is_free() {
    let k = client().await;
    let ns = namespace(&k, "exn").await;
    let s = TestServer::start().await;
    let (other, _) = s
        .agent(json!({"name": format!("{ns}/taken"), "labels": ["x"]}))
        .await;
    let stop = start_controllers(&k, &s, &ns);
    let uid = create_executor(&k, &ns, "taken", json!({"labels": ["x"]})).await;
    let obj = executor_when(&ns, "taken", "Executor taken Stalled", |o| {
        is(o, "Stalled", "True")
    })
    .await;
    assert_eq!(
        conditions(&obj)["Stalled"],
        ("True".to_string(), "AgentNameTaken".to_string())
    );
    let said = message(&obj, "Stalled");
    assert!(
        said.contains(&format!("cannot register agent {ns}/taken")),
        "{said}"
    );
    assert!(
        s.queue.get_agent(uid.parse().unwrap()).await.is_err(),
        "no agent registered"
    );
    let (code, v) = s.retire(&other).await;
    assert!(code == 200 || code == 204, "retire: {code} {v}");
    let executors: Api<Executor> = Api::namespaced(k.clone(), &ns);
    executors
        .patch(
            "taken",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"annotations": {"touched": "1"}}})),
        )
        .await
        .unwrap();
    executor_when(&ns, "taken", "Executor taken Ready", |o| {
        is(o, "Ready", "True")
    })
    .await;
    assert!(s.queue.get_agent(uid.parse().unwrap()).await.is_ok());
    stop.cancel();
    drop_namespace(&k, &ns).await;
}
