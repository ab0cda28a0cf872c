//! Verdicts of watched objects and the classification of API errors (docs/design.md §4), as pure
//! functions of the objects' JSON so they can be tested without a cluster.

use serde_json::Value;

use crate::pull::Verdict;

/// A failure no retry can mend (refused documents, a deleted object, the window over).
pub fn terminal(message: impl Into<String>) -> Verdict {
    Verdict::Failure {
        message: message.into(),
        retryable: false,
    }
}

/// What a watched object says about the order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectVerdict {
    /// Still running.
    Pending,
    /// Finished well; the message to report (e.g. a BuildRun's image digest).
    Succeeded(String),
    /// Finished badly.
    Failed { reason: String, message: String },
}

fn condition<'a>(obj: &'a Value, kind: &str) -> Option<&'a Value> {
    obj.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(kind))
}

fn is_true(c: Option<&Value>) -> bool {
    c.and_then(|c| c.get("status")).and_then(Value::as_str) == Some("True")
}

fn text(c: &Value, key: &str) -> String {
    c.get(key).and_then(Value::as_str).unwrap_or("").to_string()
}

/// Verdict of a `batch/v1` Job: `Complete` or (Kubernetes ≥ 1.31) `SuccessCriteriaMet` True is
/// success; `Failed` or `FailureTarget` True is failure; anything else is still running.
/// The `*Target`/`*CriteriaMet` conditions come first: they are final as soon as they are set,
/// while `Complete`/`Failed` wait for the pods to terminate.
pub fn job_verdict(job: &Value) -> ObjectVerdict {
    for kind in ["FailureTarget", "Failed"] {
        if let Some(c) = condition(job, kind).filter(|c| is_true(Some(c))) {
            return ObjectVerdict::Failed {
                reason: text(c, "reason"),
                message: text(c, "message"),
            };
        }
    }
    if is_true(condition(job, "SuccessCriteriaMet")) || is_true(condition(job, "Complete")) {
        let succeeded = job
            .pointer("/status/succeeded")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        return ObjectVerdict::Succeeded(format!("{succeeded} pod(s) succeeded"));
    }
    ObjectVerdict::Pending
}

/// Verdict of a Shipwright `BuildRun` from its `Succeeded` condition: True → success with
/// `status.output.digest`; False → failure with the condition's reason and message.
pub fn buildrun_verdict(run: &Value) -> ObjectVerdict {
    let Some(c) = condition(run, "Succeeded") else {
        return ObjectVerdict::Pending;
    };
    match c.get("status").and_then(Value::as_str) {
        Some("True") => ObjectVerdict::Succeeded(
            run.pointer("/status/output/digest")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
        ),
        Some("False") => ObjectVerdict::Failed {
            reason: text(c, "reason"),
            message: text(c, "message"),
        },
        _ => ObjectVerdict::Pending,
    }
}

/// Whether Shipwright's Build controller has written a `Build`'s `status.registered` (a condition
/// status string, "True" or "False"): from then on Shipwright's shared cache holds the Build.
pub fn build_registered(build: &Value) -> bool {
    build
        .pointer("/status/registered")
        .and_then(Value::as_str)
        .is_some_and(|r| !r.is_empty())
}

/// Strips a watched object down to what [`job_verdict`] and [`buildrun_verdict`] read (status
/// conditions, `status.succeeded`, `status.output.digest`) plus its identity, so the shared
/// watch's store costs a few hundred bytes per object whatever the object's spec holds.
pub fn keep_verdict_fields(object: &mut kube::api::DynamicObject) {
    let meta = &mut object.metadata;
    meta.managed_fields = None;
    meta.annotations = None;
    meta.labels = None;
    meta.owner_references = None;
    meta.finalizers = None;
    let status = object.data.get("status");
    let kept = json_status(status);
    object.data = kept;
}

fn json_status(status: Option<&Value>) -> Value {
    let Some(status) = status else {
        return Value::Object(Default::default());
    };
    let mut kept = serde_json::Map::new();
    for key in ["conditions", "succeeded"] {
        if let Some(v) = status.get(key) {
            kept.insert(key.into(), v.clone());
        }
    }
    if let Some(digest) = status.pointer("/output/digest") {
        kept.insert(
            "output".into(),
            serde_json::json!({ "digest": digest.clone() }),
        );
    }
    serde_json::json!({ "status": kept })
}

/// Whether a failed Kubernetes API call is worth retrying (docs/design.md §4): 5xx, 429, 409
/// conflicts, and transport failures are; validation and permission errors are not.
pub fn is_transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code >= 500 || status.code == 429 || status.code == 409,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// The API server's own words for a failed call.
pub fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.reason),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn with(conds: Value) -> Value {
        json!({"status": {"conditions": conds, "succeeded": 1}})
    }

    #[test]
    fn job_conditions_decide() {
        assert_eq!(job_verdict(&json!({})), ObjectVerdict::Pending);
        assert_eq!(
            job_verdict(&with(json!([{"type": "Complete", "status": "True"}]))),
            ObjectVerdict::Succeeded("1 pod(s) succeeded".into())
        );
        assert_eq!(
            job_verdict(&with(
                json!([{"type": "SuccessCriteriaMet", "status": "True"}])
            )),
            ObjectVerdict::Succeeded("1 pod(s) succeeded".into())
        );
        assert_eq!(
            job_verdict(&with(
                json!([{"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}])
            )),
            ObjectVerdict::Failed {
                reason: "BackoffLimitExceeded".into(),
                message: "Job has reached the specified backoff limit".into()
            }
        );
        assert!(matches!(
            job_verdict(&with(json!([{"type": "Failed", "status": "True"}]))),
            ObjectVerdict::Failed { .. }
        ));
        assert_eq!(
            job_verdict(&with(
                json!([{"type": "Complete", "status": "False"}, {"type": "Suspended", "status": "True"}])
            )),
            ObjectVerdict::Pending
        );
    }

    #[test]
    fn pruned_objects_keep_their_verdicts() {
        let samples = [
            json!({"spec": {"template": {"big": "x".repeat(10_000)}}, "status": {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 2, "active": 0}}),
            json!({"status": {"conditions": [{"type": "FailureTarget", "status": "True", "reason": "r", "message": "m"}]}}),
            json!({"status": {"conditions": [{"type": "Succeeded", "status": "True"}], "output": {"digest": "sha256:abc", "size": 3}}}),
            json!({"status": {"conditions": [{"type": "Succeeded", "status": "False", "reason": "r", "message": "m"}]}}),
            json!({"spec": {}}),
        ];
        for data in samples {
            let mut full = kube::api::DynamicObject {
                types: None,
                metadata: kube::api::ObjectMeta {
                    name: Some("j".into()),
                    annotations: Some([("a".to_string(), "b".repeat(1000))].into()),
                    ..Default::default()
                },
                data: data.clone(),
            };
            let before = serde_json::to_value(&full).unwrap();
            keep_verdict_fields(&mut full);
            let after = serde_json::to_value(&full).unwrap();
            assert_eq!(job_verdict(&before), job_verdict(&after), "{data}");
            assert_eq!(
                buildrun_verdict(&before),
                buildrun_verdict(&after),
                "{data}"
            );
            assert!(after.to_string().len() < 400, "{after}");
            assert_eq!(full.metadata.name.as_deref(), Some("j"));
        }
    }

    #[test]
    fn a_build_is_registered_once_shipwright_wrote_true_or_false() {
        assert!(!build_registered(&json!({})));
        assert!(!build_registered(&json!({"status": {"registered": ""}})));
        assert!(build_registered(&json!({"status": {"registered": "True"}})));
        assert!(build_registered(
            &json!({"status": {"registered": "False", "reason": "ClusterBuildStrategyNotFound"}})
        ));
    }

    #[test]
    fn buildrun_succeeded_condition_decides() {
        assert_eq!(
            buildrun_verdict(&json!({"status": {}})),
            ObjectVerdict::Pending
        );
        let ok = json!({"status": {"conditions": [{"type": "Succeeded", "status": "True"}], "output": {"digest": "sha256:abc"}}});
        assert_eq!(
            buildrun_verdict(&ok),
            ObjectVerdict::Succeeded("sha256:abc".into())
        );
        let unknown = json!({"status": {"conditions": [{"type": "Succeeded", "status": "Unknown", "reason": "Running"}]}});
        assert_eq!(buildrun_verdict(&unknown), ObjectVerdict::Pending);
        let bad = json!({"status": {"conditions": [{"type": "Succeeded", "status": "False", "reason": "BuildRunTimeout", "message": "took too long"}]}});
        assert_eq!(
            buildrun_verdict(&bad),
            ObjectVerdict::Failed {
                reason: "BuildRunTimeout".into(),
                message: "took too long".into()
            }
        );
    }
}
