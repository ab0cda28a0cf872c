//! Whether a failed Job's attempt was ended by a disruption rather than by the work
//! (docs/design.md §12), as a pure record of what the Job's pods said while it was watched.
//!
//! An eviction (`kubectl drain`), a preemption, a node-pressure eviction or graceful node
//! shutdown, and a lost node's taint-manager or PodGC deletion all put a `DisruptionTarget`
//! condition on the pod before it goes. The pod may be gone from the API server by the time the
//! Job fails (the Job controller counts a terminating pod as failed, and removes its finalizer
//! once counted), so the record keeps what it saw, by pod, as the pods change. A pod held on a
//! lost node whose node is then deleted or marked out-of-service is a disruption too, with no
//! condition left to show for it.
//!
//! The attempt is disrupted when the Job failed for want of pods (not for its
//! `activeDeadlineSeconds`), at least one pod was disrupted, and no pod failed on its own (phase
//! `Failed` with no `DisruptionTarget`): a Job whose own retries also failed failed on the work.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;

/// How one pod was disrupted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disruption {
    /// The pod's name (in the Job's namespace).
    pub pod: String,
    /// The node it was bound to, when known.
    pub node: Option<String>,
    /// The `DisruptionTarget` reason (`EvictionByEvictionAPI`, `PreemptionByScheduler`,
    /// `TerminationByKubelet`, `DeletionByTaintManager`, `DeletionByPodGC`), or `NodeStopped`
    /// for a held pod whose node was deleted or marked out-of-service.
    pub reason: String,
    /// The condition's message, when it has one.
    pub message: Option<String>,
}

impl Disruption {
    /// `pod P on node N was evicted (EvictionByEvictionAPI: message)`, for the order's result.
    pub fn describe(&self) -> String {
        let what = match self.reason.as_str() {
            "EvictionByEvictionAPI" => "was evicted (drain or Eviction API)",
            "PreemptionByScheduler" => "was preempted by a higher-priority pod",
            "TerminationByKubelet" => "was stopped by its kubelet (node pressure or shutdown)",
            "DeletionByTaintManager" | "DeletionByPodGC" => "was deleted for a lost node",
            "NodeStopped" => "was lost with its node (deleted or out-of-service)",
            _ => "was disrupted",
        };
        let node = self
            .node
            .as_deref()
            .map(|n| format!(" on node {n}"))
            .unwrap_or_default();
        let message = self
            .message
            .as_deref()
            .filter(|m| !m.is_empty())
            .map(|m| format!(": {m}"))
            .unwrap_or_default();
        format!("pod {}{node} {what} ({}{message})", self.pod, self.reason)
    }
}

/// What a Job's pods said of disruptions while it was watched.
#[derive(Debug, Default)]
pub struct Record {
    disrupted: BTreeMap<String, Disruption>,
    failed_on_their_own: BTreeSet<String>,
}

impl Record {
    /// Notes what `pod`, as it is now, says: a `DisruptionTarget` condition, or a failure of its
    /// own (phase `Failed` without one).
    pub fn look(&mut self, pod: &Pod) {
        let Some(name) = pod.metadata.name.clone() else {
            return;
        };
        let status = pod.status.as_ref();
        let condition = status.and_then(|s| s.conditions.as_ref()).and_then(|c| {
            c.iter()
                .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")
        });
        if let Some(c) = condition {
            self.failed_on_their_own.remove(&name);
            self.disrupted.insert(
                name.clone(),
                Disruption {
                    pod: name,
                    node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
                    reason: c.reason.clone().unwrap_or_default(),
                    message: c.message.clone(),
                },
            );
        } else if status.and_then(|s| s.phase.as_deref()) == Some("Failed")
            && pod.metadata.deletion_timestamp.is_none()
            && !self.disrupted.contains_key(&name)
        {
            // A pod deleted while it ran (the Job controller stops a failed Job's other pods)
            // did not fail on its own.
            self.failed_on_their_own.insert(name);
        }
    }

    /// Notes that `pod`, held while `node` did not report, is gone with its node deleted or
    /// marked out-of-service (docs/design.md §12).
    pub fn lost_with_node(&mut self, pod: &str, node: &str) {
        self.failed_on_their_own.remove(pod);
        self.disrupted
            .entry(pod.to_string())
            .or_insert_with(|| Disruption {
                pod: pod.to_string(),
                node: Some(node.to_string()),
                reason: "NodeStopped".into(),
                message: None,
            });
    }

    /// The disruption that ended the attempt of a Job that failed with `reason` (its `Failed`
    /// or `FailureTarget` condition's), when it was one: the first disrupted pod by name is
    /// named. `None` when no pod was disrupted, one failed on its own, or the Job failed for
    /// its own deadline.
    pub fn ended_by(&self, reason: &str) -> Option<&Disruption> {
        if reason == "DeadlineExceeded" || !self.failed_on_their_own.is_empty() {
            return None;
        }
        self.disrupted.values().next()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn pod(name: &str, status: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"containers": [], "nodeName": "n1"},
            "status": status,
        }))
        .unwrap()
    }

    fn evicted(phase: &str) -> Value {
        json!({"phase": phase, "conditions": [{"type": "DisruptionTarget", "status": "True",
               "reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting"}]})
    }

    #[test]
    fn an_evicted_pod_ends_the_attempt_as_a_disruption() {
        let mut record = Record::default();
        record.look(&pod("a", json!({"phase": "Running"})));
        assert_eq!(record.ended_by("BackoffLimitExceeded"), None);
        record.look(&pod("a", evicted("Running")));
        record.look(&pod("a", evicted("Failed")));
        let d = record.ended_by("BackoffLimitExceeded").unwrap();
        assert_eq!(d.pod, "a");
        assert_eq!(
            d.describe(),
            "pod a on node n1 was evicted (drain or Eviction API) \
             (EvictionByEvictionAPI: Eviction API: evicting)"
        );
        // A Job past its own deadline failed on the work, whatever its pods went through.
        assert_eq!(record.ended_by("DeadlineExceeded"), None);
    }

    #[test]
    fn a_pod_that_failed_on_its_own_makes_it_the_work_s_failure() {
        let mut record = Record::default();
        record.look(&pod("a", evicted("Failed")));
        record.look(&pod("b", json!({"phase": "Failed"})));
        assert_eq!(record.ended_by("BackoffLimitExceeded"), None);
        // A failure first seen without its condition, then with it, was a disruption.
        let mut record = Record::default();
        record.look(&pod("a", json!({"phase": "Failed"})));
        record.look(&pod("a", evicted("Failed")));
        assert!(record.ended_by("PodFailurePolicy").is_some());
    }

    #[test]
    fn a_pod_stopped_by_the_job_controller_did_not_fail_on_its_own() {
        let mut record = Record::default();
        record.look(&pod("a", evicted("Failed")));
        let mut sibling = pod("b", json!({"phase": "Failed"}));
        sibling.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-01-01T00:00:00Z".parse().unwrap(),
            ));
        record.look(&sibling);
        assert!(record.ended_by("BackoffLimitExceeded").is_some());
    }

    #[test]
    fn a_held_pod_lost_with_its_node_is_a_disruption() {
        let mut record = Record::default();
        assert_eq!(record.ended_by("BackoffLimitExceeded"), None);
        record.lost_with_node("a", "n1");
        let d = record.ended_by("BackoffLimitExceeded").unwrap();
        assert_eq!(
            d.describe(),
            "pod a on node n1 was lost with its node (deleted or out-of-service) (NodeStopped)"
        );
    }
}
