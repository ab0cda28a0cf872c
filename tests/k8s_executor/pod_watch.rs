//! The executor's long-running requests to the API server do not grow with the number of running
//! Jobs (docs/design.md §4, §9): Jobs are waited on through one shared watch per namespace, and
//! the pods whose logs are each order's output through one shared watch of pods. Counted on the
//! executor's own client (`support::open_streams`), so other clients of the control plane do not
//! count. On kwok nodes every container's output is the one "no logs" line.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};

use super::{Executor, job, order, setup};
use crate::support::kube::{drop_namespace, kubectl};
use crate::support::open_streams::{OpenStreams, counted_client};
use crate::support::{TestServer, eventually};

/// The (stream, text) of every line of an order's output.
async fn output(s: &TestServer, id: &str) -> Vec<(String, String)> {
    let (status, v) = s
        .admin_get(&format!("/api/v1/work-orders/{id}/output"))
        .await;
    assert_eq!(status, 200, "{v}");
    let lines = v["lines"].as_array().unwrap();
    let field = |l: &Value, f: &str| l[f].as_str().unwrap().to_string();
    lines
        .iter()
        .map(|l| (field(l, "stream"), field(l, "text")))
        .collect()
}

/// The output is exactly one "no logs" line, for the main container of one pod of `job`.
fn assert_one_pod_followed(job: &str, lines: &[(String, String)]) {
    assert_eq!(lines.len(), 1, "{job}: {lines:?}");
    let (stream, text) = &lines[0];
    assert!(
        stream.starts_with(&format!("{job}-")) && stream.ends_with("/main"),
        "{job}: {lines:?}"
    );
    assert!(
        text.starts_with("[pullman] no logs from this container"),
        "{job}: {lines:?}"
    );
}

/// Once every order in `ids` has its pod followed (its output has a line): how many Jobs are
/// running and how many watches the executor holds open.
async fn count_when_followed(
    s: &TestServer,
    jobs: &Api<Job>,
    open: &OpenStreams,
    ids: &[String],
) -> (usize, usize) {
    eventually(120, "every order's pod followed", || async {
        for id in ids {
            if output(s, id).await.is_empty() {
                return None;
            }
        }
        Some(())
    })
    .await;
    // Whatever a follower opens, it has opened by now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let watches = open.watches();
    let list = jobs.list(&ListParams::default()).await.unwrap();
    let running = list
        .items
        .iter()
        .filter(|j| j.status.as_ref().and_then(|s| s.active).unwrap_or(0) > 0)
        .count();
    println!(
        "{running} Jobs running: {watches} watches open {:?}",
        open.by_path()
    );
    (running, watches)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_watches_do_not_grow_with_the_running_jobs() {
    const FEW: usize = 2;
    const MANY: usize = 20;
    let t = setup("podwatch").await;
    let (k, open) = counted_client().await;
    let (ex, carrier) = Executor::start_with(&t.s, &k, &t.agent, &t.token, &t.ns, 15, MANY, true);
    let jobs: Api<Job> = Api::namespaced(t.k.clone(), &t.ns);
    let mut ids = Vec::new();
    let mut few = (0, 0);
    for i in 0..MANY {
        if i == FEW {
            few = count_when_followed(&t.s, &jobs, &open, &ids).await;
        }
        // The first ones run longer, so that all of them run at once.
        let run = if i < FEW { "75s" } else { "40s" };
        let yaml = job(
            &format!("w-{i}"),
            json!({"pullman.dev/kwok-run-duration": run}),
        );
        ids.push(t.s.order(order(&t.ns, &yaml, 600)).await);
    }
    let many = count_when_followed(&t.s, &jobs, &open, &ids).await;
    assert_eq!(few.0, FEW, "counted while {FEW} Jobs ran");
    assert_eq!(many.0, MANY, "counted while {MANY} Jobs ran");
    assert!(
        many.1 <= few.1,
        "open watches grew with the running Jobs: {} with {FEW}, {} with {MANY}",
        few.1,
        many.1
    );
    assert_eq!(carrier.watches().open_watches(), 1, "one watch of Jobs");
    assert_eq!(carrier.pod_watches().open_watches(), 1, "one watch of pods");

    // Every order succeeded, with every line of its pod.
    for (i, id) in ids.iter().enumerate() {
        let v = t.s.log_entry(id, 150).await;
        assert_eq!(v["outcome"], "succeeded", "{v}");
        assert_eq!(v["message"], format!("Jobs succeeded: w-{i}"));
        assert_one_pod_followed(&format!("w-{i}"), &output(&t.s, id).await);
    }
    ex.stop().await;
    drop_namespace(&t.k, &t.ns).await;
}

/// A new claim on an order whose Job ended while no executor was there (the one that applied it
/// was killed): the Job's verdict is in at once, before the shared pod watch it opens has listed
/// the pods; their output is still sent before the order completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_ended_before_the_pod_watch_listed_still_gives_its_output() {
    let t = setup("ended").await;
    let yaml = job("early", json!({}));
    let (ok, _, err) = kubectl(&["create", "-n", &t.ns, "-f", "-"], Some(&yaml));
    assert!(ok, "{err}");
    crate::support::kube::job_complete(&t.k, &t.ns, "early", 60, "the Job Complete").await;
    let id = t.s.order(order(&t.ns, &yaml, 600)).await;
    let (ex, _) = Executor::start_with(&t.s, &t.k, &t.agent, &t.token, &t.ns, 15, 2, true);
    let v = t.s.log_entry(&id, 60).await;
    assert_eq!(v["outcome"], "succeeded", "{v}");
    assert_one_pod_followed("early", &output(&t.s, &id).await);
    ex.stop().await;
    drop_namespace(&t.k, &t.ns).await;
}

/// An executor whose Role has no right on pods (the sample executor's minimal rights): its pod
/// watch never lists, and an order still completes as soon as its Job's verdict is in, without
/// waiting out the log drain limit (10 s) for a list that cannot come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_rights_on_pods_an_order_completes_at_its_verdict() {
    let t = setup("nopods").await;
    let user = format!("{}-executor", t.ns);
    let rbac = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: jobs-only\n  namespace: {ns}\nrules:\n- apiGroups: [batch]\n  resources: [jobs]\n  verbs: [get, list, watch, create, patch, update, delete]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: jobs-only\n  namespace: {ns}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: jobs-only}}\nsubjects:\n- {{apiGroup: rbac.authorization.k8s.io, kind: User, name: {user}}}\n",
        ns = t.ns
    );
    let (ok, _, err) = kubectl(&["apply", "-f", "-"], Some(&rbac));
    assert!(ok, "{err}");
    let mut config = kube::Config::infer().await.unwrap();
    config.auth_info.impersonate = Some(user);
    let k = kube::Client::try_from(config).unwrap();
    let (ex, _) = Executor::start_with(&t.s, &k, &t.agent, &t.token, &t.ns, 15, 2, true);
    let id = t.s.order(order(&t.ns, &job("quick", json!({})), 600)).await;
    crate::support::kube::job_complete(&t.k, &t.ns, "quick", 60, "the Job Complete").await;
    let complete = std::time::Instant::now();
    let v = t.s.log_entry(&id, 60).await;
    let took = complete.elapsed();
    assert_eq!(v["outcome"], "succeeded", "{v}");
    assert!(
        took < Duration::from_secs(7),
        "the order completed {took:?} after its Job"
    );
    assert_eq!(output(&t.s, &id).await, [], "no pod seen, no line");
    ex.stop().await;
    drop_namespace(&t.k, &t.ns).await;
}
