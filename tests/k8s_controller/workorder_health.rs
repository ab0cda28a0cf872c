//! WorkOrder conditions as kubectl, kstatus and Argo CD read them (docs/design.md §6), through every
//! phase, and `spec.ttlSecondsAfterFinished`.

use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::api::Api;
use pullman::crd::{WorkOrderPhase as Phase, WorkOrderResource};
use serde_json::json;

use super::verdicts::{assert_health, live, message};
use super::{CM, create_wo, phase_is, start_controllers, work_order};
use crate::support::TestServer;
use crate::support::kube::{client, drop_namespace, kubectl, namespace};

/// `kubectl wait --for=condition=<condition>` on a WorkOrder, started on its own thread so it
/// really waits while the test moves the order on; yields (succeeded, output, time taken).
fn wait_in_background(
    ns: &str,
    name: &str,
    condition: &str,
    timeout_secs: u32,
) -> std::thread::JoinHandle<(bool, String, Duration)> {
    let args = [
        "wait".to_string(),
        "-n".into(),
        ns.into(),
        format!("--for=condition={condition}"),
        format!("--timeout={timeout_secs}s"),
        format!("workorder/{name}"),
    ];
    std::thread::spawn(move || {
        let start = Instant::now();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, out, err) = kubectl(&args, None);
        (ok, format!("{out}{err}"), start.elapsed())
    })
}

/// `kubectl wait -n NS --for=condition=CONDITION --timeout=TIMEOUT workorder/NAME`: whether it
/// returned in time, and its stderr.
fn kubectl_wait(ns: &str, name: &str, condition: &str, timeout: &str) -> (bool, String) {
    let (ok, _, err) = kubectl(
        &[
            "wait",
            "-n",
            ns,
            &format!("--for=condition={condition}"),
            &format!("--timeout={timeout}"),
            &format!("workorder/{name}"),
        ],
        None,
    );
    (ok, err)
}

/// How a phase reads: its conditions (type, status) and its health (kstatus's, Argo CD's).
struct Reading {
    pattern: &'static [(&'static str, &'static str)],
    health: (&'static str, &'static str),
}

/// Pending, Claimed and RetryPending: still in progress.
#[rustfmt::skip]
const RUNNING: Reading = Reading {
    pattern: &[("Ready", "False"), ("Completed", "False"), ("Reconciling", "True")],
    health: ("InProgress", "Progressing"),
};

/// Failed, Cancelled and Rejected: ended, not well.
#[rustfmt::skip]
const ENDED: Reading = Reading {
    pattern: &[("Ready", "False"), ("Completed", "True"), ("Stalled", "True")],
    health: ("Failed", "Degraded"),
};

/// Succeeded.
#[rustfmt::skip]
const SUCCEEDED: Reading = Reading {
    pattern: &[("Ready", "True"), ("Completed", "True")],
    health: ("Current", "Healthy"),
};

fn rows<'a>(pattern: &[(&'a str, &'a str)], reason: &'a str) -> Vec<(&'a str, &'a str, &'a str)> {
    pattern.iter().map(|(t, s)| (*t, *s, reason)).collect()
}

/// Waits for WorkOrder `name` to reach `phase`, then holds what kubectl, kstatus and Argo CD read
/// of it (`health`: kstatus's, Argo CD's) against its conditions, `pattern` with `reason`; returns
/// the live object.
async fn reads(
    (api, ns): (&Api<WorkOrderResource>, &str),
    name: &str,
    phase: Phase,
    reason: &str,
    reading: Reading,
) -> serde_json::Value {
    phase_is(api, name, phase).await;
    let obj = live(ns, "workorder", name);
    let (kstatus, argo) = reading.health;
    assert_health(&obj, reason, &rows(reading.pattern, reason), kstatus, argo);
    obj
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_work_order_phase_reads_right_to_kubectl_kstatus_and_argocd() {
    let k = client().await;
    let ns = namespace(&k, "woh").await;
    let s = TestServer::start().await;
    let stop = start_controllers(&k, &s, &ns);
    let api: Api<WorkOrderResource> = Api::namespaced(k.clone(), &ns);
    let at = (&api, ns.as_str());
    let (agent, tok) = s.agent(json!({"name": "a", "labels": ["x"]})).await;
    let claim = |uid: String| {
        let (s, agent, tok) = (&s, agent.clone(), tok.clone());
        async move {
            let (code, v) = s.claim(&uid, &agent, &tok).await;
            assert_eq!(code, 200, "{v}");
        }
    };
    let complete = |uid: String, body: serde_json::Value, want: u16| {
        let (s, agent, tok) = (&s, agent.clone(), tok.clone());
        async move {
            let mut body = body;
            body["agent_id"] = json!(agent);
            let (code, v) = s.complete(&uid, &tok, body).await;
            assert_eq!(code, want, "{v}");
        }
    };

    // Pending → Claimed → RetryPending → Succeeded, with kubectl wait running all along.
    let uid = create_wo(&api, work_order("good", "x", CM))
        .await
        .uid()
        .unwrap();
    let obj = reads(at, "good", Phase::Pending, "Pending", RUNNING).await;
    assert_eq!(
        message(&obj, "Ready"),
        "WorkOrder good is waiting in the queue for an agent to claim it."
    );
    let ready_wait = wait_in_background(&ns, "good", "Ready", 60);
    let completed_wait = wait_in_background(&ns, "good", "Completed", 60);

    claim(uid.clone()).await;
    let obj = reads(at, "good", Phase::Claimed, "Claimed", RUNNING).await;
    assert!(message(&obj, "Ready").contains(&format!("claimed by agent {agent}")));

    complete(
        uid.clone(),
        json!({"success": false, "message": "flaky"}),
        202,
    )
    .await;
    let obj = reads(at, "good", Phase::RetryPending, "RetryPending", RUNNING).await;
    assert!(
        message(&obj, "Ready").ends_with(": flaky"),
        "{}",
        message(&obj, "Ready")
    );
    assert!(
        !ready_wait.is_finished() && !completed_wait.is_finished(),
        "kubectl wait returned before the end"
    );

    tokio::time::sleep(Duration::from_millis(1100)).await;
    claim(uid.clone()).await;
    complete(
        uid.clone(),
        json!({"success": true, "message": "done at last"}),
        200,
    )
    .await;
    let finished_at = Instant::now();
    let obj = reads(at, "good", Phase::Succeeded, "Succeeded", SUCCEEDED).await;
    assert_eq!(
        message(&obj, "Ready"),
        "WorkOrder good succeeded: done at last"
    );
    for (what, wait) in [("Ready", ready_wait), ("Completed", completed_wait)] {
        let (ok, out, took) = tokio::task::spawn_blocking(move || wait.join().unwrap())
            .await
            .unwrap();
        assert!(
            ok,
            "kubectl wait --for=condition={what} on a succeeded order: {out}"
        );
        assert!(
            took > Duration::from_secs(1),
            "{what}: it waited ({took:?})"
        );
        assert!(finished_at.elapsed() < Duration::from_secs(15));
    }

    // Failed: Ready never comes, Completed does, kstatus says Failed at once.
    let uid = create_wo(&api, work_order("bad", "x", CM))
        .await
        .uid()
        .unwrap();
    phase_is(&api, "bad", Phase::Pending).await;
    claim(uid.clone()).await;
    complete(
        uid.clone(),
        json!({"success": false, "retryable": false, "message": "the Job pi failed"}),
        200,
    )
    .await;
    let obj = reads(at, "bad", Phase::Failed, "Failed", ENDED).await;
    assert_eq!(
        message(&obj, "Stalled"),
        "WorkOrder bad failed: the Job pi failed"
    );
    let (ok, err) = kubectl_wait(&ns, "bad", "Ready", "3s");
    assert!(
        !ok && err.contains("timed out"),
        "kubectl wait Ready on a failed order must time out: {err}"
    );
    let (ok, err) = kubectl_wait(&ns, "bad", "Completed", "10s");
    assert!(
        ok,
        "kubectl wait Completed returns on a failed order: {err}"
    );

    // Cancelled through the REST API.
    let uid = create_wo(&api, work_order("dropped", "x", CM))
        .await
        .uid()
        .unwrap();
    phase_is(&api, "dropped", Phase::Pending).await;
    let (code, v) = s.cancel(&uid).await;
    assert_eq!(code, 200, "{v}");
    let obj = reads(at, "dropped", Phase::Cancelled, "Cancelled", ENDED).await;
    assert!(message(&obj, "Stalled").starts_with("WorkOrder dropped was cancelled"));

    // Rejected: YAML the schema cannot check and the queue refuses.
    create_wo(&api, work_order("broken", "x", "kind: [unclosed")).await;
    let obj = reads(at, "broken", Phase::Failed, "Rejected", ENDED).await;
    assert!(
        message(&obj, "Stalled").starts_with("WorkOrder broken was rejected by the queue: "),
        "{}",
        message(&obj, "Stalled")
    );
    let (ok, err) = kubectl_wait(&ns, "broken", "Completed", "10s");
    assert!(ok, "{err}");
    stop.cancel();
    drop_namespace(&k, &ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_work_order_with_a_ttl_is_deleted_and_the_log_keeps_it() {
    let k = client().await;
    let ns = namespace(&k, "ttl").await;
    let s = TestServer::start().await;
    let stop = start_controllers(&k, &s, &ns);
    let api: Api<WorkOrderResource> = Api::namespaced(k.clone(), &ns);
    let (agent, tok) = s.agent(json!({"name": "a", "labels": ["x"]})).await;
    let mut body = work_order("brief", "x", CM);
    body["spec"]["ttlSecondsAfterFinished"] = json!(5);
    let brief = create_wo(&api, body).await.uid().unwrap();
    let kept = create_wo(&api, work_order("kept", "x", CM))
        .await
        .uid()
        .unwrap();
    for (name, uid) in [("brief", &brief), ("kept", &kept)] {
        phase_is(&api, name, Phase::Pending).await;
        let (code, _) = s.claim(uid, &agent, &tok).await;
        assert_eq!(code, 200);
    }
    for uid in [&kept, &brief] {
        let (code, _) = s
            .complete(uid, &tok, json!({"agent_id": agent, "success": true}))
            .await;
        assert_eq!(code, 200);
    }
    let finished = Instant::now();
    phase_is(&api, "brief", Phase::Succeeded).await;
    let gone = crate::support::eventually(20, "the WorkOrder with a TTL to be deleted", || async {
        api.get_opt("brief")
            .await
            .ok()?
            .is_none()
            .then(|| finished.elapsed())
    })
    .await;
    println!("ttlSecondsAfterFinished: 5 -> deleted {gone:?} after it finished");
    // completedAt has whole seconds, so the deadline can fall up to 1 s before the exact 5 s.
    assert!(
        gone >= Duration::from_secs(4),
        "deleted too early: {gone:?}"
    );
    assert!(gone <= Duration::from_secs(9), "deleted too late: {gone:?}");
    let entry = s.log_entry(&brief, 5).await;
    assert_eq!(entry["outcome"], "succeeded", "the log keeps the record");
    let kept_wo = api
        .get("kept")
        .await
        .expect("a WorkOrder without a TTL stays");
    assert_eq!(kept_wo.status.unwrap().phase, Some(Phase::Succeeded));
    stop.cancel();
    drop_namespace(&k, &ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_work_order_the_server_rejects_fails_with_a_reason() {
    let k = client().await;
    let ns = namespace(&k, "rej").await;
    let s = TestServer::start().await;
    let stop = start_controllers(&k, &s, &ns);
    let api: Api<WorkOrderResource> = Api::namespaced(k.clone(), &ns);
    create_wo(&api, work_order("broken", "x", "kind: [unclosed")).await;
    let wo = phase_is(&api, "broken", Phase::Failed).await;
    let st = wo.status.unwrap();
    let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "Rejected")
    );
    assert!(
        ready.message.contains("does not parse"),
        "{}",
        ready.message
    );
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM work_orders")
        .fetch_one(&s.pool)
        .await
        .unwrap();
    assert_eq!(n, 0, "nothing queued");
    stop.cancel();
    drop_namespace(&k, &ns).await;
}
