//! Who owns an executor Deployment's `replicas` (docs/design.md §6, issue #25): with
//! `spec.deployment.replicas` unset the controller applies none, so an autoscaler (KEDA's HPA,
//! `kubectl scale`) keeps the count it set across reconciles; with it set, the controller keeps
//! its own value (the contrast shows the check would see a fight).

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use pullman::crd::Executor;
use serde_json::{Value, json};

use super::start_controllers;
use crate::support::kube::{client, drop_namespace, namespace};
use crate::support::{TestServer, eventually};

/// Sets the Deployment's scale as an autoscaler does: through the `scale` subresource, under its
/// own field manager.
pub(super) async fn scale_as_autoscaler(deployments: &Api<Deployment>, name: &str, replicas: i32) {
    deployments
        .patch_scale(
            name,
            &PatchParams {
                field_manager: Some("test-autoscaler".into()),
                ..Default::default()
            },
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .unwrap();
}

/// Changes the Executor's labels and waits until the controller has reconciled that generation
/// (its status carries it; the Deployment is applied before the status is written).
async fn reconcile_again(executors: &Api<Executor>, name: &str, labels: Value) {
    let patched = executors
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"labels": labels}})),
        )
        .await
        .unwrap();
    let generation = patched.metadata.generation;
    eventually(30, "the Executor's new generation reconciled", || async {
        let ex = executors.get(name).await.ok()?;
        (ex.status?.observed_generation == generation).then_some(())
    })
    .await;
}

async fn replicas(deployments: &Api<Deployment>, name: &str) -> Option<i32> {
    deployments.get(name).await.unwrap().spec.unwrap().replicas
}

/// Whether the controller's field manager owns `spec.replicas` of the Deployment.
async fn controller_owns_replicas(deployments: &Api<Deployment>, name: &str) -> bool {
    let d = deployments.get(name).await.unwrap();
    d.managed_fields().iter().any(|m| {
        m.manager.as_deref() == Some(pullman::controller::CONTROLLER_FIELD_MANAGER)
            && m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.pointer("/f:spec/f:replicas").is_some())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_autoscaled_executor_deployment_keeps_the_replicas_its_scaler_set() {
    let k: Client = client().await;
    let ns = namespace(&k, "exr").await;
    let s = TestServer::start().await;
    let stop = start_controllers(&k, &s, &ns);
    let executors: Api<Executor> = Api::namespaced(k.clone(), &ns);
    let deployments: Api<Deployment> = Api::namespaced(k.clone(), &ns);
    let ex: Executor = serde_json::from_value(json!({
        "apiVersion": "pullman.dev/v1alpha1", "kind": "Executor", "metadata": {"name": "scaled"},
        "spec": {"labels": ["x"], "deployment": {"image": "pullman:test"}},
    }))
    .unwrap();
    executors.create(&PostParams::default(), &ex).await.unwrap();
    let name = "scaled-executor";
    eventually(30, "Deployment scaled-executor created", || async {
        deployments.get_opt(name).await.ok().flatten()
    })
    .await;
    assert_eq!(
        replicas(&deployments, name).await,
        Some(1),
        "a new one starts with 1"
    );
    assert!(
        !controller_owns_replicas(&deployments, name).await,
        "replicas unset: the controller applies none"
    );

    // The autoscaler scales to 3 (and to 0); reconciles leave its count alone.
    scale_as_autoscaler(&deployments, name, 3).await;
    reconcile_again(&executors, "scaled", json!(["x", "y"])).await;
    assert_eq!(replicas(&deployments, name).await, Some(3));
    scale_as_autoscaler(&deployments, name, 0).await;
    reconcile_again(&executors, "scaled", json!(["x"])).await;
    assert_eq!(replicas(&deployments, name).await, Some(0));

    // Replicas set in the Executor: the controller keeps its value against any other writer.
    executors
        .patch(
            "scaled",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"deployment": {"replicas": 2}}})),
        )
        .await
        .unwrap();
    eventually(30, "replicas 2 applied", || async {
        (replicas(&deployments, name).await == Some(2)).then_some(())
    })
    .await;
    assert!(controller_owns_replicas(&deployments, name).await);
    scale_as_autoscaler(&deployments, name, 5).await;
    reconcile_again(&executors, "scaled", json!(["x", "z"])).await;
    assert_eq!(
        replicas(&deployments, name).await,
        Some(2),
        "the controller takes its replicas back"
    );
    // Deleted while the controller runs, which removes its finalizer: nothing is left behind.
    executors
        .delete("scaled", &Default::default())
        .await
        .unwrap();
    eventually(30, "Executor scaled deleted", || async {
        executors
            .get_opt("scaled")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    stop.cancel();
    drop_namespace(&k, &ns).await;
}
