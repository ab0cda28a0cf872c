//! The in-cluster executor against the test control plane (real Job controller, kwok running
//! pods) and a real PostgreSQL: orders go through the real pull API.

mod support;

#[path = "k8s_executor/builds.rs"]
mod builds;
#[path = "k8s_executor/disruption.rs"]
mod disruption;
#[path = "k8s_executor/evicted.rs"]
mod evicted;
#[path = "k8s_executor/harness.rs"]
mod harness;
#[path = "k8s_executor/output.rs"]
mod output;
#[path = "k8s_executor/pod_watch.rs"]
mod pod_watch;

use std::time::Duration;

use harness::Executor;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use support::kube::{client, drop_namespace, kubectl, namespace};
use support::{TestServer, eventually};

fn job(name: &str, pod_annotations: Value) -> String {
    format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {name}\nspec:\n  backoffLimit: 0\n  template:\n    metadata:\n      annotations: {pod_annotations}\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: main\n        image: perl:5.34.0\n        command: [\"perl\", \"-Mbignum=bpi\", \"-wle\", \"print bpi(2000)\"]\n"
    )
}

fn order(label: &str, yaml: &str, claim_timeout: i64) -> Value {
    json!({
        "work_type": "custom",
        "yaml_content": yaml,
        "claim_timeout_seconds": claim_timeout,
        "max_retries": 2,
        "backoff_seconds": 1,
        "targeting": {"labels": [label]},
    })
}

struct Setup {
    k: Client,
    s: TestServer,
    ns: String,
    agent: String,
    token: String,
}

async fn setup(prefix: &str) -> Setup {
    let k = client().await;
    let ns = namespace(&k, prefix).await;
    let s = TestServer::start_maintained().await;
    let (agent, token) = s
        .agent(json!({"name": format!("{ns}/executor"), "labels": [ns.clone()]}))
        .await;
    Setup {
        k,
        s,
        ns,
        agent,
        token,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_succeed_fail_and_unnamed_jobs_are_refused() {
    let t = setup("jobs").await;
    let ex = Executor::start(&t, 15);
    let ok = t.s.order(order(&t.ns, &job("pi", json!({})), 600)).await;
    let fail =
        t.s.order(order(
            &t.ns,
            &job(
                "doomed",
                json!({"pullman.dev/kwok-fail": "true", "pullman.dev/kwok-exit-code": "3"}),
            ),
            600,
        ))
        .await;
    let unnamed =
        t.s.order(order(
            &t.ns,
            &job("x", json!({})).replace("  name: x\n", "  generateName: x-\n"),
            600,
        ))
        .await;

    let v = t.s.log_entry(&ok, 60).await;
    assert_eq!(v["outcome"], "succeeded", "{v}");
    assert!(support::message(&v).contains("Jobs succeeded: pi"), "{v}");
    let jobs: Api<Job> = Api::namespaced(t.k.clone(), &t.ns);
    let pi = jobs.get("pi").await.unwrap();
    assert_eq!(
        pi.labels()["pullman.dev/work-order"],
        ok,
        "labelled with its work order"
    );
    assert!(
        pi.metadata
            .managed_fields
            .unwrap()
            .iter()
            .any(|m| m.manager.as_deref() == Some("pullman-executor"))
    );

    let v = t.s.log_entry(&fail, 60).await;
    assert_eq!(v["outcome"], "failed", "{v}");
    assert_eq!(
        v["retry_count"], 0,
        "a Job that ran and failed is not retried"
    );
    assert!(
        support::message(&v).contains(&format!("Job {}/doomed failed", t.ns)),
        "{v}"
    );
    // After the Job's condition, the pod and container that failed, with kwok's exit code.
    let message = v["message"].as_str().unwrap();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(t.k.clone(), &t.ns);
    let doomed = pods
        .list(&ListParams::default().labels("batch.kubernetes.io/job-name=doomed"))
        .await
        .unwrap();
    let pod = doomed.items[0].metadata.name.clone().unwrap();
    assert!(
        message.contains(&format!("pod {pod} container main exited with code 3")),
        "{v}"
    );

    let v = t.s.log_entry(&unnamed, 60).await;
    assert_eq!(v["outcome"], "failed");
    assert_eq!(v["retry_count"], 0);
    assert!(support::message(&v).contains("no metadata.name"), "{v}");
    let all = jobs
        .list(&ListParams::default().labels(&format!("pullman.dev/work-order={unnamed}")))
        .await
        .unwrap();
    assert!(all.items.is_empty(), "nothing created for the unnamed Job");
    ex.stop().await;
    drop_namespace(&t.k, &t.ns).await;
}

/// Issue #16: many orders at once wait on ONE shared watch of Jobs, not one watch each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_dozen_job_orders_at_once_share_one_watch() {
    const N: usize = 24;
    let t = setup("many").await;
    let (ex, carrier) = Executor::start_with(&t.s, &t.k, &t.agent, &t.token, &t.ns, 15, N, false);
    let mut ids = Vec::new();
    for i in 0..N {
        // Running for a few seconds, so all of them are watched at the same time.
        let yaml = job(
            &format!("many-{i}"),
            json!({"pullman.dev/kwok-run-duration": "4s"}),
        );
        ids.push(t.s.order(order(&t.ns, &yaml, 600)).await);
    }
    let jobs: Api<Job> = Api::namespaced(t.k.clone(), &t.ns);
    let running = eventually(120, "all Jobs running at once", || async {
        let list = jobs.list(&ListParams::default()).await.ok()?;
        let active = list
            .items
            .iter()
            .filter(|j| j.status.as_ref().and_then(|s| s.active).unwrap_or(0) > 0)
            .count();
        (active >= N / 2).then_some(active)
    })
    .await;
    println!("{running} Jobs active at once");
    for (i, id) in ids.iter().enumerate() {
        let v = t.s.log_entry(id, 120).await;
        assert_eq!(v["outcome"], "succeeded", "{v}");
        assert_eq!(v["message"], format!("Jobs succeeded: many-{i}"));
    }
    assert_eq!(
        carrier.watches().open_watches(),
        1,
        "one watch of Jobs in the target namespace served every order"
    );
    ex.stop().await;
    drop_namespace(&t.k, &t.ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_job_fails_and_a_job_past_its_budget_is_left_running() {
    let t = setup("budget").await;
    let ex = Executor::start(&t, 15);
    let slow = json!({"pullman.dev/kwok-run-duration": "1h"});
    let deleted =
        t.s.order(order(&t.ns, &job("gone", slow.clone()), 600))
            .await;
    // 120 s claim timeout: a 60 s watch budget, the least an order with a Job may have.
    let over = t.s.order(order(&t.ns, &job("slowpoke", slow), 120)).await;
    let jobs: Api<Job> = Api::namespaced(t.k.clone(), &t.ns);
    eventually(30, "Job gone to exist", || async {
        jobs.get_opt("gone").await.ok()?.map(|_| ())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    jobs.delete("gone", &DeleteParams::background())
        .await
        .unwrap();
    let v = t.s.log_entry(&deleted, 30).await;
    assert_eq!(v["outcome"], "failed");
    assert!(
        support::message(&v).contains("was deleted before it finished"),
        "{v}"
    );

    let v = t.s.log_entry(&over, 100).await;
    assert_eq!(v["outcome"], "failed", "{v}");
    assert_eq!(v["retry_count"], 0);
    assert!(support::message(&v).contains("watch budget of 60 s"), "{v}");
    let still = jobs.get("slowpoke").await.unwrap();
    assert!(
        still.metadata.deletion_timestamp.is_none(),
        "the Job is left running"
    );
    ex.stop().await;
    drop_namespace(&t.k, &t.ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_documents_cluster_scoped_objects_and_a_crd_with_its_resource() {
    let t = setup("mixed").await;
    let ex = Executor::start(&t, 15);
    let extra_ns = format!("{}-extra", t.ns);
    let group = format!("{}.example.com", t.ns);
    let yaml = format!(
        "# leading comment-only document\n---\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: {extra_ns}\ndata: {{a: b}}\n---\n\
# a document of comments only\n# nothing else\n---\n\
apiVersion: {group}/v1\nkind: Widget\nmetadata:\n  name: w1\nspec: {{size: 3}}\n---\n\
apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: 1\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n    metadata: {{labels: {{app: web}}}}\n    spec:\n      containers: [{{name: web, image: nginx}}]\n---\n\
apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: {ns}-reader\nrules: []\n---\n\
apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: widgets.{group}\nspec:\n  group: {group}\n  names: {{kind: Widget, plural: widgets, singular: widget}}\n  scope: Namespaced\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema:\n      openAPIV3Schema:\n        type: object\n        x-kubernetes-preserve-unknown-fields: true\n---\n\
apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: migrate\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers: [{{name: m, image: busybox}}]\n---\n\
apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {extra_ns}\n",
        ns = t.ns
    );
    let o = t.s.order(order(&t.ns, &yaml, 600)).await;
    let v = t.s.log_entry(&o, 90).await;
    assert_eq!(v["outcome"], "succeeded", "{v}");
    let message = v["message"].as_str().unwrap();
    assert!(message.contains("Jobs succeeded: migrate"), "{message}");
    for kind in [
        "Namespace",
        "CustomResourceDefinition",
        "ConfigMap",
        "Widget",
        "Deployment",
        "ClusterRole",
    ] {
        assert!(message.contains(kind), "{kind} named in {message}");
    }
    let cms: Api<ConfigMap> = Api::namespaced(t.k.clone(), &extra_ns);
    assert_eq!(
        cms.get("settings").await.unwrap().labels()["pullman.dev/work-order"],
        o
    );
    let widgets: Api<DynamicObject> = Api::namespaced_with(
        t.k.clone(),
        &t.ns,
        &ApiResource::from_gvk(&GroupVersionKind::gvk(&group, "v1", "Widget")),
    );
    assert!(
        widgets.get("w1").await.is_ok(),
        "custom resource defaulted into the target namespace"
    );
    let (ok, out, _) = kubectl(
        &[
            "get",
            "clusterrole",
            &format!("{}-reader", t.ns),
            "-o",
            "jsonpath={.metadata.namespace}",
        ],
        None,
    );
    assert!(
        ok && out.is_empty(),
        "a cluster-scoped object gets no namespace: {out:?}"
    );

    // Only empty documents: fails without retry rather than succeeding with nothing. The API
    // refuses such YAML, so the order is parked under a label nobody has, rewritten in the
    // database, and then targeted at the executor.
    let empty =
        t.s.order(order(
            "parked",
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
            600,
        ))
        .await;
    sqlx::query(
        "UPDATE work_orders SET yaml_content = '---\n# nothing\n---\n', target_labels = ARRAY[$2] \
         WHERE id = $1::uuid",
    )
    .bind(&empty)
    .bind(&t.ns)
    .execute(&t.s.pool)
    .await
    .unwrap();
    let v = t.s.log_entry(&empty, 30).await;
    assert_eq!(v["outcome"], "failed");
    assert_eq!(v["retry_count"], 0);
    assert!(support::message(&v).contains("nothing to apply"), "{v}");
    ex.stop().await;
    let _ = kubectl(
        &["delete", "crd", &format!("widgets.{group}"), "--wait=false"],
        None,
    );
    let _ = kubectl(
        &[
            "delete",
            "clusterrole",
            &format!("{}-reader", t.ns),
            "--wait=false",
        ],
        None,
    );
    let _ = kubectl(&["delete", "ns", &extra_ns, "--wait=false"], None);
    drop_namespace(&t.k, &t.ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_order_reattaches_to_its_job() {
    let t = setup("redeliver").await;
    let first = Executor::start(&t, 6);
    let o =
        t.s.order(order(
            &t.ns,
            &job("once", json!({"pullman.dev/kwok-run-duration": "20s"})),
            600,
        ))
        .await;
    let jobs: Api<Job> = Api::namespaced(t.k.clone(), &t.ns);
    let uid = eventually(30, "the Job", || async {
        jobs.get_opt("once").await.ok()??.metadata.uid
    })
    .await;
    first.kill();
    // The lease (6 s) runs out, the reaper requeues, a second executor picks it up.
    let second = Executor::start(&t, 6);
    let v = t.s.log_entry(&o, 90).await;
    assert_eq!(v["outcome"], "succeeded", "{v}");
    assert_eq!(v["reclaim_count"], 1, "{v}");
    let all = jobs.list(&ListParams::default()).await.unwrap();
    assert_eq!(all.items.len(), 1, "no second Job");
    assert_eq!(
        all.items[0].metadata.uid.as_ref(),
        Some(&uid),
        "the same Job"
    );
    second.stop().await;
    drop_namespace(&t.k, &t.ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_running_job_deletes_it() {
    let t = setup("cancel").await;
    let ex = Executor::start(&t, 6);
    let o =
        t.s.order(order(
            &t.ns,
            &job("long", json!({"pullman.dev/kwok-run-duration": "1h"})),
            600,
        ))
        .await;
    let jobs: Api<Job> = Api::namespaced(t.k.clone(), &t.ns);
    eventually(30, "the Job", || async {
        jobs.get_opt("long").await.ok()?.map(|_| ())
    })
    .await;
    let (code, v) = t.s.cancel(&o).await;
    assert_eq!(code, 200, "{v}");
    eventually(30, "the Job to be deleted", || async {
        jobs.get_opt("long").await.ok()?.is_none().then_some(())
    })
    .await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(t.k.clone(), &t.ns);
    eventually(30, "its pods to be deleted", || async {
        pods.list(&ListParams::default().labels("job-name=long"))
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    let v = t.s.log_entry(&o, 5).await;
    assert_eq!(
        v["outcome"], "cancelled",
        "the executor reported nothing over the cancellation"
    );
    ex.stop().await;
    drop_namespace(&t.k, &t.ns).await;
}

/// The whole system as a user runs it: `pullman serve` mirrors a WorkOrder applied with kubectl,
/// an Executor resource yields the token, `pullman executor` claims and applies the pi Job, kwok
/// runs its pod, the Job completes, and the WorkOrder's status says Succeeded with the result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_to_end_kubectl_apply_to_succeeded_with_the_binaries() {
    use k8s_openapi::api::core::v1::Secret;
    use pullman::crd::{WorkOrderPhase, WorkOrderResource};
    use std::process::{Command, Stdio};
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.0.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = self.0.wait();
        }
    }
    let k = client().await;
    let ns = namespace(&k, "e2e").await;
    let db = support::fresh_database_url().await;
    let port = support::free_port();
    let server = format!("http://127.0.0.1:{port}");
    let _serve = Killed(
        Command::new(support::pullman_bin())
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--controller",
                "on",
            ])
            .args(["--watch-namespace", &ns, "--leader-election-namespace", &ns])
            .env("DATABASE_URL", &db)
            .env("PULLMAN_ADMIN_TOKEN", support::ADMIN_TOKEN)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let executor = format!(
        "apiVersion: pullman.dev/v1alpha1\nkind: Executor\nmetadata:\n  name: cluster-a\n  namespace: {ns}\nspec:\n  labels: [e2e]\n  leaseSeconds: 15\n"
    );
    let (ok, _, err) = kubectl(&["apply", "-f", "-"], Some(&executor));
    assert!(ok, "{err}");
    let secrets: Api<Secret> = Api::namespaced(k.clone(), &ns);
    let token = eventually(60, "the executor's token Secret", || async {
        let s = secrets.get_opt("cluster-a-agent-token").await.ok()??;
        Some(String::from_utf8(s.data?.get("token")?.0.clone()).unwrap())
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, token).unwrap();
    let _executor = Killed(
        Command::new(support::pullman_bin())
            .args([
                "executor",
                "--server",
                &server,
                "--target-namespace",
                &ns,
                "--lease-seconds",
                "15",
                "--token-file",
            ])
            .arg(&token_file)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let sample = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/samples/workorder-pi-job.yaml"
    ))
    .unwrap()
    .replace("labels: [demo]", "labels: [e2e]");
    let (ok, _, err) = kubectl(&["apply", "-n", &ns, "-f", "-"], Some(&sample));
    assert!(ok, "{err}");
    let api: Api<WorkOrderResource> = Api::namespaced(k.clone(), &ns);
    let wo = eventually(90, "the pi WorkOrder to succeed", || async {
        let wo = api.get("pi").await.ok()?;
        (wo.status.as_ref()?.phase == Some(WorkOrderPhase::Succeeded)).then_some(wo)
    })
    .await;
    let st = wo.status.unwrap();
    assert!(
        st.message
            .as_deref()
            .unwrap_or("")
            .contains("Jobs succeeded: pi"),
        "{st:?}"
    );
    // The executor's verdict may come from `SuccessCriteriaMet`, which the Job controller sets
    // just before `Complete`: wait for `Complete` rather than expect it at once.
    support::kube::job_complete(&k, &ns, "pi", 30, "the pi Job to be Complete").await;
    let (ok, out, _) = kubectl(&["get", "-n", &ns, "wo", "pi"], None);
    assert!(ok && out.contains("Succeeded"), "{out}");
    drop_namespace(&k, &ns).await;
}
