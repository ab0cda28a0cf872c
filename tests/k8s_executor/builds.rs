//! Shipwright builds (docs/design.md §4 `build`): the executor applies the Build, creates a BuildRun
//! and reports its verdict. No Shipwright controller runs on this test control plane, so each test
//! writes the Build's and the BuildRun's status itself, as the controller would (kwok; the real
//! controllers build for real in `e2e/shipwright`).

use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use super::{Executor, setup};
use crate::support::eventually;
use crate::support::kube::drop_namespace;

const BUILD: &str = "apiVersion: shipwright.io/v1beta1\nkind: Build\nmetadata:\n  name: app\nspec:\n  source: {type: Git, git: {url: https://example.com/app.git}}\n  output: {image: registry.example.com/app}\n";

/// The BuildRuns of namespace `ns` (Shipwright's CRD, installed by the test control plane).
fn buildruns(k: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        k.clone(),
        ns,
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "shipwright.io",
            "v1beta1",
            "BuildRun",
        )),
    )
}

/// Writes Build `name`'s status, as Shipwright's Build controller would once it has validated it.
async fn register_build(k: &Client, ns: &str, name: &str, status: Value) {
    let api: Api<DynamicObject> = Api::namespaced_with(
        k.clone(),
        ns,
        &ApiResource::from_gvk(&GroupVersionKind::gvk("shipwright.io", "v1beta1", "Build")),
    );
    eventually(30, "the Build", || async { api.get_opt(name).await.ok()? }).await;
    write_status(&api, name, status).await;
}

/// Merges `status` into object `name`'s status, as its controller would.
async fn write_status(api: &Api<DynamicObject>, name: &str, status: Value) {
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": status})),
    )
    .await
    .unwrap();
}

async fn set_buildrun_status(k: &Client, ns: &str, status: Value) -> String {
    let api = buildruns(k, ns);
    let run = eventually(30, "a BuildRun", || async {
        let list = api.list(&ListParams::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|r| r.data.pointer("/status/conditions").is_none())
    })
    .await;
    assert_eq!(
        run.data.pointer("/spec/build/name"),
        Some(&json!("app")),
        "references the Build"
    );
    let name = run.name_any();
    write_status(&api, &name, status).await;
    name
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builds_report_the_digest_retry_failures_and_give_up_at_the_window() {
    let t = setup("build").await;
    let ex = Executor::start(&t, 15);
    let build_order = |timeout: i64| {
        json!({
            "work_type": "build", "yaml_content": BUILD, "claim_timeout_seconds": timeout,
            "max_retries": 1, "backoff_seconds": 1, "targeting": {"labels": [t.ns.clone()]},
        })
    };
    // Succeeds: the digest is the message. The BuildRun comes once the Build is registered.
    let ok = t.s.order(build_order(600)).await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert!(
        buildruns(&t.k, &t.ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "no BuildRun before Shipwright registered the Build"
    );
    register_build(
        &t.k,
        &t.ns,
        "app",
        json!({"registered": "True", "reason": "Succeeded"}),
    )
    .await;
    set_buildrun_status(&t.k, &t.ns, json!({"conditions": [{"type": "Succeeded", "status": "True", "reason": "Succeeded"}], "output": {"digest": "sha256:feedbeef"}})).await;
    let v = t.s.log_entry(&ok, 30).await;
    assert_eq!(v["outcome"], "succeeded", "{v}");
    assert_eq!(v["message"], "sha256:feedbeef");

    // Fails: a retry is scheduled (a new BuildRun on the next attempt), then succeeds.
    let flaky = t.s.order(build_order(600)).await;
    let first_run = set_buildrun_status(&t.k, &t.ns, json!({"conditions": [{"type": "Succeeded", "status": "False", "reason": "Failed", "message": "step-build failed"}]})).await;
    eventually(30, "RETRY_PENDING", || async {
        let (_, v) = t.s.admin_get(&format!("/api/v1/work-orders/{flaky}")).await;
        (v["retry_count"] == 1 && v["last_error"].as_str()?.contains("step-build failed"))
            .then_some(())
    })
    .await;
    let second_run = set_buildrun_status(&t.k, &t.ns, json!({"conditions": [{"type": "Succeeded", "status": "True"}], "output": {"digest": "sha256:second"}})).await;
    assert_ne!(first_run, second_run, "a retry starts a new BuildRun");
    let v = t.s.log_entry(&flaky, 30).await;
    assert_eq!(v["message"], "sha256:second");

    // A Build Shipwright refused still gets its BuildRun: `registered: False` may be the status of
    // an earlier spec, and Shipwright's BuildRun controller is the one to say
    // (BuildRegistrationFailed), which here the test does.
    let refused =
        t.s.order(json!({
            "work_type": "build", "claim_timeout_seconds": 600, "max_retries": 0,
            "yaml_content": BUILD.replace("name: app", "name: refused"),
            "targeting": {"labels": [t.ns.clone()]},
        }))
        .await;
    register_build(&t.k, &t.ns, "refused", json!({"registered": "False",
        "reason": "ClusterBuildStrategyNotFound", "message": "clusterBuildStrategy kaniko does not exist"})).await;
    let api = buildruns(&t.k, &t.ns);
    let selector = format!("pullman.dev/work-order={refused}");
    let run = eventually(30, "the refused Build's BuildRun", || async {
        let runs = api
            .list(&ListParams::default().labels(&selector))
            .await
            .ok()?;
        runs.items.into_iter().next()
    })
    .await;
    write_status(
        &api,
        &run.name_any(),
        json!({"conditions": [{"type": "Succeeded", "status": "False",
        "reason": "BuildRegistrationFailed", "message": "the Build is not registered correctly"}]}),
    )
    .await;
    let v = t.s.log_entry(&refused, 30).await;
    assert_eq!(v["outcome"], "failed", "{v}");
    assert!(
        crate::support::message(&v)
            .contains(": BuildRegistrationFailed: the Build is not registered correctly"),
        "{v}"
    );

    // Never finishes: terminal at the window (min(15 min, budget) = 60 s), BuildRun left alone.
    let stuck = t.s.order(build_order(120)).await;
    let api = buildruns(&t.k, &t.ns);
    let v = t.s.log_entry(&stuck, 100).await;
    assert_eq!(v["outcome"], "failed", "{v}");
    assert_eq!(v["retry_count"], 0);
    assert!(
        crate::support::message(&v).contains("build window of 60 s"),
        "{v}"
    );
    let runs = api
        .list(&ListParams::default().labels(&format!("pullman.dev/work-order={stuck}")))
        .await
        .unwrap();
    assert_eq!(runs.items.len(), 1);
    assert!(
        runs.items[0].metadata.deletion_timestamp.is_none(),
        "the BuildRun is not cancelled"
    );
    ex.stop().await;
    drop_namespace(&t.k, &t.ns).await;
}
