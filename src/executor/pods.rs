//! Why a Job failed, in the words of its pods: the Job's own `Failed` condition says only
//! "reached the specified backoff limit", while the user needs the pod, the container and its exit
//! code (docs/design.md §4, the executor's failure message); a BuildRun's names the failed step
//! but not how it ended. Read once, when the verdict is `Failed`.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client};

use super::apply::Applied;

/// At most this many failed containers are named; the rest are counted.
const NAMED: usize = 3;

/// The two reads may take this long together; the verdict is reported without them after it.
const READ_LIMIT: Duration = Duration::from_secs(10);

/// `pod P container C exited with code N (Reason)` for each container of the Job's pods that ended
/// with a non-zero code (init containers included), oldest pod first, joined with `; `. The pods
/// are this Job's by its uid, not its name, which an earlier Job of the same name had too. `None`
/// when the Job or its pods cannot be read within [`READ_LIMIT`] (no `list` on pods in the
/// executor's Role, or they are gone) or none ended that way: the caller then reports the Job's
/// condition alone.
pub async fn failed_containers(client: &Client, job: &Applied) -> Option<String> {
    let ns = job.namespace.as_deref()?;
    let read = async {
        let uid = Api::<Job>::namespaced(client.clone(), ns)
            .get(&job.name)
            .await?
            .metadata
            .uid
            .unwrap_or_default();
        let selector = format!("batch.kubernetes.io/controller-uid={uid}");
        let pods = Api::<Pod>::namespaced(client.clone(), ns)
            .list(&ListParams::default().labels(&selector))
            .await?;
        Ok(pods.items)
    };
    described_within_limit(read, job).await
}

/// `pod P container C exited with code N (Reason)` for the step a failed Shipwright `BuildRun`
/// names in `status.failureDetails.location`: its `Failed` condition names the step but not how
/// it ended (Shipwright v0.20 on the real node, issue #38). Only that container: Tekton ends the
/// steps after a failed one with code 1 as well, without running them. `None` as for
/// [`failed_containers`], or when the BuildRun names no pod and container.
pub async fn failed_build_step(client: &Client, run: &Applied) -> Option<String> {
    let ns = run.namespace.as_deref()?;
    let read = async {
        let object = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &run.resource)
            .get(&run.name)
            .await?;
        let at = |key: &str| {
            object
                .data
                .pointer(&format!("/status/failureDetails/location/{key}"))
                .and_then(serde_json::Value::as_str)
                .map(str::to_string)
        };
        let (Some(pod), Some(container)) = (at("pod"), at("container")) else {
            return Ok(vec![]);
        };
        let mut pod = Api::<Pod>::namespaced(client.clone(), ns).get(&pod).await?;
        if let Some(status) = pod.status.as_mut() {
            for statuses in [
                &mut status.init_container_statuses,
                &mut status.container_statuses,
            ] {
                if let Some(list) = statuses.as_mut() {
                    list.retain(|c| c.name == container);
                }
            }
        }
        Ok(vec![pod])
    };
    described_within_limit(read, run).await
}

async fn described_within_limit(
    read: impl std::future::Future<Output = kube::Result<Vec<Pod>>>,
    owner: &Applied,
) -> Option<String> {
    match tokio::time::timeout(READ_LIMIT, read).await {
        Ok(Ok(pods)) => describe(pods),
        Ok(Err(error)) => {
            tracing::debug!(%error, owner = %owner.display(), "cannot read the pods for the failure message");
            None
        }
        Err(_) => {
            tracing::debug!(owner = %owner.display(), "reading the pods took too long; reporting the condition alone");
            None
        }
    }
}

/// The statuses of `pod`'s containers, init containers first (none while it has no status).
pub fn container_statuses(pod: &Pod) -> impl Iterator<Item = &ContainerStatus> {
    let status = pod.status.as_ref();
    let init = status.and_then(|s| s.init_container_statuses.as_ref());
    let main = status.and_then(|s| s.container_statuses.as_ref());
    init.into_iter().flatten().chain(main.into_iter().flatten())
}

/// What orders pods oldest first: creation time, then name.
pub fn age(pod: &Pod) -> (Option<&Time>, &Option<String>) {
    (pod.metadata.creation_timestamp.as_ref(), &pod.metadata.name)
}

/// The sentence [`failed_containers`] reports, from the pods as listed.
pub fn describe(mut pods: Vec<Pod>) -> Option<String> {
    pods.sort_by(|a, b| age(a).cmp(&age(b)));
    let mut failed = Vec::new();
    for pod in &pods {
        let name = pod.metadata.name.as_deref().unwrap_or("?");
        for c in container_statuses(pod) {
            if let Some(line) = container_failure(name, c) {
                failed.push(line);
            }
        }
    }
    if failed.is_empty() {
        return None;
    }
    let more = failed.len().saturating_sub(NAMED);
    failed.truncate(NAMED);
    let mut text = failed.join("; ");
    if more > 0 {
        text.push_str(&format!("; and {more} more"));
    }
    Some(text)
}

fn container_failure(pod: &str, c: &ContainerStatus) -> Option<String> {
    // The current state, else the last one (a container restarted in place, restartPolicy OnFailure).
    let ended = c
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .or_else(|| c.last_state.as_ref().and_then(|s| s.terminated.as_ref()))?;
    if ended.exit_code == 0 {
        return None;
    }
    let reason = ended
        .reason
        .as_deref()
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    Some(format!(
        "pod {pod} container {} exited with code {}{reason}",
        c.name, ended.exit_code
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, created: &str, statuses: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "creationTimestamp": created},
            "status": statuses,
        }))
        .unwrap()
    }

    fn terminated(name: &str, code: i32, reason: &str) -> serde_json::Value {
        json!({"name": name, "image": "i", "imageID": "", "ready": false, "restartCount": 0,
               "state": {"terminated": {"exitCode": code, "reason": reason}}})
    }

    #[test]
    fn names_pod_container_and_code_oldest_pod_first() {
        let pods = vec![
            pod(
                "job-b",
                "2026-01-01T00:00:10Z",
                json!({"containerStatuses": [terminated("main", 7, "Error")]}),
            ),
            pod(
                "job-a",
                "2026-01-01T00:00:00Z",
                json!({
                    "initContainerStatuses": [terminated("setup", 0, "Completed")],
                    "containerStatuses": [terminated("main", 7, "Error"), terminated("side", 0, "Completed")],
                }),
            ),
        ];
        assert_eq!(
            describe(pods).as_deref(),
            Some(
                "pod job-a container main exited with code 7 (Error); pod job-b container main exited with code 7 (Error)"
            )
        );
    }

    #[test]
    fn a_failed_init_container_and_a_restarted_one_count() {
        let mut restarted = terminated("main", 0, "");
        restarted["state"] = json!({"running": {}});
        restarted["lastState"] = json!({"terminated": {"exitCode": 137, "reason": "OOMKilled"}});
        let pods = vec![pod(
            "p",
            "2026-01-01T00:00:00Z",
            json!({
                "initContainerStatuses": [terminated("init", 2, "Error")],
                "containerStatuses": [restarted],
            }),
        )];
        assert_eq!(
            describe(pods).as_deref(),
            Some(
                "pod p container init exited with code 2 (Error); pod p container main exited with code 137 (OOMKilled)"
            )
        );
    }

    #[test]
    fn nothing_to_say_without_a_non_zero_exit_and_more_than_three_are_counted() {
        let ok = vec![pod(
            "p",
            "2026-01-01T00:00:00Z",
            json!({"containerStatuses": [terminated("main", 0, "Completed")]}),
        )];
        assert_eq!(describe(ok), None);
        assert_eq!(
            describe(vec![pod("p", "2026-01-01T00:00:00Z", json!({}))]),
            None
        );
        let many: Vec<Pod> = (0..5)
            .map(|i| {
                pod(
                    &format!("p{i}"),
                    &format!("2026-01-01T00:00:0{i}Z"),
                    json!({"containerStatuses": [terminated("main", 1, "Error")]}),
                )
            })
            .collect();
        let text = describe(many).unwrap();
        assert!(
            text.starts_with("pod p0 container main exited with code 1 (Error); pod p1"),
            "{text}"
        );
        assert!(
            text.ends_with("pod p2 container main exited with code 1 (Error); and 2 more"),
            "{text}"
        );
    }
}
