//! Kubernetes test support: a client for the test control plane (`KUBECONFIG`, set by
//! e2e/run-tests.sh), a namespace per test, and the CRDs installed once per process.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::sync::OnceCell;

/// Waits up to `secs` seconds (`what` naming the wait) for Job `name` in `ns` to have its
/// `Complete` condition true: the Job controller sets it a moment after the condition an
/// executor may already have acted on.
pub async fn job_complete(k: &Client, ns: &str, name: &str, secs: u64, what: &str) {
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(k.clone(), ns);
    super::eventually(secs, what, || async {
        let job = jobs.get_opt(name).await.ok()??;
        job.status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True")
            .then_some(())
    })
    .await;
}

/// A client for the test control plane; panics with what to do when it is not there.
pub async fn client() -> Client {
    assert!(
        std::env::var_os("KUBECONFIG").is_some(),
        "KUBECONFIG is not set: run the Kubernetes tests through e2e/run-tests.sh, or start the \
         test control plane with `eval \"$(e2e/testenv/up.sh)\"`"
    );
    let client = Client::try_default()
        .await
        .expect("building a client from KUBECONFIG");
    install_crds(&client).await;
    client
}

async fn install_crds(client: &Client) {
    static DONE: OnceCell<()> = OnceCell::const_new();
    DONE.get_or_init(|| async {
        let mut crds = pullman::crd::crds();
        let shipwright = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/e2e/crds/shipwright-minimal.yaml"
        ))
        .unwrap();
        for doc in serde_norway::Deserializer::from_str(&shipwright) {
            use serde::Deserialize;
            crds.push(CustomResourceDefinition::deserialize(doc).unwrap());
        }
        let api: Api<CustomResourceDefinition> = Api::all(client.clone());
        for crd in &crds {
            let name = crd.metadata.name.clone().unwrap();
            api.patch(
                &name,
                &PatchParams::apply("pullman-tests").force(),
                &Patch::Apply(crd),
            )
            .await
            .unwrap();
            super::eventually(30, &format!("CRD {name} Established"), || {
                let api = api.clone();
                let name = name.clone();
                async move {
                    let crd = api.get(&name).await.ok()?;
                    crd.status?
                        .conditions?
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                        .then_some(())
                }
            })
            .await;
        }
    })
    .await;
}

/// A fresh namespace `<prefix>-<random>`.
pub async fn namespace(client: &Client, prefix: &str) -> String {
    let name = format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    api.create(&PostParams::default(), &ns).await.unwrap();
    name
}

/// Deletes a namespace (best effort; the control plane is torn down after the run anyway).
pub async fn drop_namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let _ = api.delete(name, &DeleteParams::background()).await;
}

/// Runs `kubectl` with the test KUBECONFIG; returns (success, stdout, stderr).
pub fn kubectl(args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    use std::io::Write;
    let mut child = std::process::Command::new("kubectl")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl on PATH");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    } else {
        drop(child.stdin.take());
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

pub const SHORT: Duration = Duration::from_secs(30);
