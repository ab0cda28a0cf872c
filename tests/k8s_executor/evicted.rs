//! An attempt ended by a disruption (docs/design.md §12): a Job whose pod is evicted (the Eviction
//! API, as `kubectl drain` uses it) fails, and the executor reports the attempt `disrupted`, not as
//! the work's failure. With `retryOnDisruption: never` (the default) the order fails and the Job is
//! left as it is; with `safe` the executor waits for the pod to stop, deletes the Job, and the
//! order runs again at once, with no moment where pods of both runs exist.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{EvictParams, ListParams};
use serde_json::{Value, json};

use super::{Executor, job, order, setup};
use crate::support::eventually;
use crate::support::kube::drop_namespace;

/// The running pod of Job `name` (kwok reports it running).
async fn running_pod(pods: &Api<Pod>, name: &str) -> String {
    let selector = format!("batch.kubernetes.io/job-name={name}");
    eventually(60, "the Job's pod running", || async {
        pods.list(&ListParams::default().labels(&selector))
            .await
            .ok()?
            .items
            .into_iter()
            .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .and_then(|p| p.metadata.name)
    })
    .await
}

fn results(entry: &Value) -> Vec<String> {
    entry["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["result"].as_str().unwrap_or("").to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_pod_is_a_disrupted_attempt_run_again_only_when_safe() {
    let t = setup("evicted").await;
    let ex = Executor::start(&t, 15);
    let pods: Api<Pod> = Api::namespaced(t.k.clone(), &t.ns);
    let jobs: Api<Job> = Api::namespaced(t.k.clone(), &t.ns);

    let mut safe = order(
        &t.ns,
        &job("safe", json!({"pullman.dev/kwok-run-duration": "8s"})),
        600,
    );
    safe["retry_on_disruption"] = json!("safe");
    let safe = t.s.order(safe).await;
    let never =
        t.s.order(order(
            &t.ns,
            &job("never", json!({"pullman.dev/kwok-run-duration": "1h"})),
            600,
        ))
        .await;

    // Every pod of the safe order's Jobs, by the Job that owns it, as often as they can be
    // listed: two runs must never be seen at once.
    let seen: Arc<Mutex<Vec<BTreeSet<String>>>> = Arc::default();
    let poller = {
        let (pods, seen) = (pods.clone(), seen.clone());
        tokio::spawn(async move {
            let selector = "batch.kubernetes.io/job-name=safe";
            loop {
                if let Ok(list) = pods.list(&ListParams::default().labels(selector)).await {
                    let owners = list
                        .items
                        .iter()
                        .filter_map(|p| {
                            p.metadata
                                .labels
                                .as_ref()?
                                .get("batch.kubernetes.io/controller-uid")
                                .cloned()
                        })
                        .collect();
                    seen.lock().unwrap().push(owners);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    let safe_pod = running_pod(&pods, "safe").await;
    let never_pod = running_pod(&pods, "never").await;
    for pod in [&safe_pod, &never_pod] {
        pods.evict(pod, &EvictParams::default()).await.unwrap();
    }

    // never: the order fails, the attempt is disrupted, no retry is spent, the Job stays.
    let entry = t.s.log_entry(&never, 90).await;
    assert_eq!(entry["outcome"], "failed", "{entry}");
    assert_eq!(entry["retry_count"], 0, "{entry}");
    assert_eq!(results(&entry), ["disrupted"], "{entry}");
    let message = entry["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("Job {}/never failed", t.ns))
            && message.contains(&format!("pod {never_pod}"))
            && message.contains("EvictionByEvictionAPI"),
        "{entry}"
    );
    assert!(jobs.get("never").await.is_ok(), "the Job is left as it is");

    // safe: the Job is cleared away and the order runs again, to its verdict.
    let entry = t.s.log_entry(&safe, 120).await;
    assert_eq!(entry["outcome"], "succeeded", "{entry}");
    assert_eq!(entry["retry_count"], 0, "{entry}");
    assert_eq!(results(&entry), ["disrupted", "succeeded"], "{entry}");
    let first = &entry["attempts"][0]["message"];
    assert!(
        first
            .as_str()
            .is_some_and(|m| m.contains(&format!("pod {safe_pod}"))
                && m.contains("the Job was deleted for the next attempt")),
        "{entry}"
    );
    poller.abort();
    let seen = seen.lock().unwrap().clone();
    let runs: BTreeSet<&String> = seen.iter().flatten().collect();
    assert_eq!(runs.len(), 2, "the pods of two runs were seen: {seen:?}");
    assert!(
        seen.iter().all(|owners| owners.len() <= 1),
        "pods of both runs at once: {seen:?}"
    );

    ex.stop().await;
    drop_namespace(&t.k, &t.ns).await;
}
