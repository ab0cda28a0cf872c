//! The `WorkOrder` and `Executor` custom resources (docs/design.md §6), `pullman.dev/v1alpha1`.
//!
//! The schema carries what the API server can check itself: enums, bounds, required fields, and
//! (added by [`crds`]) CEL rules for the immutable WorkOrder `spec` and for targeting with at least
//! one criterion. `crds/` holds the output of [`crds_yaml`]; a test fails when they drift.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::queue::limits::{
    BACKOFF_SECONDS, CLAIM_TIMEOUT_SECONDS, CONCURRENCY_MAX, LEASE_SECONDS, MAX_CONCURRENCY,
    MAX_CONCURRENCY_KEY_CHARS, MAX_RECLAIMS, MAX_RETRIES, MAX_YAML_BYTES, PRIORITY,
};
use crate::queue::{
    NewConcurrency, NewWorkOrder, OnConflict, RetryOnDisruption, Targeting, WorkType,
};

/// Work type of a WorkOrder (docs/design.md §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CrdWorkType {
    /// A Shipwright Build; the executor runs a BuildRun of it.
    Build,
    /// Kubernetes objects applied with server-side apply; Jobs among them are watched.
    Custom,
}

impl From<CrdWorkType> for WorkType {
    fn from(t: CrdWorkType) -> Self {
        match t {
            CrdWorkType::Build => WorkType::Build,
            CrdWorkType::Custom => WorkType::Custom,
        }
    }
}

/// Which agents may claim the order; any one matching criterion is enough (docs/design.md §3).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkOrderTargeting {
    /// Agent ids (an Executor's agent id is its metadata.uid).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agent_ids: Vec<String>,
    /// Agent names (an Executor's agent is named <namespace>/<name>).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agent_names: Vec<String>,
    /// Agent labels; an agent with any of them matches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    /// Agent annotations; an agent with any one of these keys set to the same value matches.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

// The defaults and ranges below are the queue's (crate::queue::limits), so an order applied as
// a WorkOrder and one created over REST are bounded and defaulted alike.
fn default_max_retries() -> i32 {
    MAX_RETRIES.default_i32()
}
fn default_backoff() -> i32 {
    BACKOFF_SECONDS.default_i32()
}
fn default_claim_timeout() -> i32 {
    CLAIM_TIMEOUT_SECONDS.default_i32()
}
fn default_max_reclaims() -> i32 {
    MAX_RECLAIMS.default_i32()
}

fn default_priority() -> i32 {
    PRIORITY.default_i32()
}

fn default_concurrency_max() -> i32 {
    CONCURRENCY_MAX.default_i32()
}

/// `spec.concurrency` of a WorkOrder: its concurrency key (docs/design.md §3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkOrderConcurrency {
    /// The key; keys are per tenant (orders without a tenant share theirs).
    #[schemars(length(min = 1, max = MAX_CONCURRENCY_KEY_CHARS))]
    pub key: String,
    /// Most orders of the key holding a claim at once.
    #[serde(default = "default_concurrency_max")]
    #[schemars(range(min = CONCURRENCY_MAX.min, max = CONCURRENCY_MAX.max))]
    pub max: i32,
    /// queue (wait for a free slot) or supersede (cancel the key's waiting orders when this one
    /// is created; claimed ones go on).
    #[serde(default)]
    pub on_conflict: CrdOnConflict,
}

/// `spec.concurrency.onConflict` (docs/design.md §3).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CrdOnConflict {
    /// Wait for a free slot.
    #[default]
    Queue,
    /// Cancel the key's waiting orders.
    Supersede,
}

impl From<CrdOnConflict> for OnConflict {
    fn from(c: CrdOnConflict) -> Self {
        match c {
            CrdOnConflict::Queue => OnConflict::Queue,
            CrdOnConflict::Supersede => OnConflict::Supersede,
        }
    }
}

/// `spec.retryOnDisruption` of a WorkOrder: what an attempt ended by an eviction, a drain, a
/// preemption or a lost node does to the order (docs/design.md §12).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CrdRetryOnDisruption {
    /// The order fails; the attempt is recorded as disrupted.
    #[default]
    Never,
    /// The order runs again at once (counted as a reclaim, not a retry), but only once the
    /// disrupted run is known to have stopped, so runs never overlap.
    Safe,
}

impl From<CrdRetryOnDisruption> for RetryOnDisruption {
    fn from(p: CrdRetryOnDisruption) -> Self {
        match p {
            CrdRetryOnDisruption::Never => RetryOnDisruption::Never,
            CrdRetryOnDisruption::Safe => RetryOnDisruption::Safe,
        }
    }
}

// The Rust types are `WorkOrderResource` / `WorkOrderResourceSpec` so they never collide with the
// queue's `WorkOrder` / `WorkOrderSpec` (issue #13); the Kubernetes kind stays `WorkOrder`.
/// A one-time operation pulled by an agent (docs/design.md §6). Immutable once created.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "pullman.dev",
    version = "v1alpha1",
    kind = "WorkOrder",
    root = "WorkOrderResource",
    namespaced,
    shortname = "wo",
    status = "WorkOrderStatus",
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".spec.workType"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Agent","type":"string","jsonPath":".status.claimedBy"}"#,
    printcolumn = r#"{"name":"Retries","type":"integer","jsonPath":".status.retryCount"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct WorkOrderResourceSpec {
    /// build (a Shipwright Build) or custom (Kubernetes objects).
    pub work_type: CrdWorkType,
    /// One or more YAML documents: the objects to apply, or the Shipwright Build.
    #[schemars(length(min = 1, max = MAX_YAML_BYTES))]
    pub yaml_content: String,
    /// Retries after a failed attempt (0 means one attempt).
    #[serde(default = "default_max_retries")]
    #[schemars(range(min = MAX_RETRIES.min, max = MAX_RETRIES.max))]
    pub max_retries: i32,
    /// Base of the exponential backoff between attempts, in seconds.
    #[serde(default = "default_backoff")]
    #[schemars(range(min = BACKOFF_SECONDS.min, max = BACKOFF_SECONDS.max))]
    pub backoff_seconds: i32,
    /// Seconds a claim may last; the executor's watch budget is derived from it.
    #[serde(default = "default_claim_timeout")]
    #[schemars(range(min = CLAIM_TIMEOUT_SECONDS.min, max = CLAIM_TIMEOUT_SECONDS.max))]
    pub claim_timeout_seconds: i32,
    /// Reclaims of stale claims before the order fails.
    #[serde(default = "default_max_reclaims")]
    #[schemars(range(min = MAX_RECLAIMS.min, max = MAX_RECLAIMS.max))]
    pub max_reclaims: i32,
    /// Of one tenant's orders an agent may take, the higher priority goes first, then the older;
    /// tenants take turns before that, the one served least recently first (docs/design.md §3).
    #[serde(default = "default_priority")]
    #[schemars(range(min = PRIORITY.min, max = PRIORITY.max))]
    pub priority: i32,
    /// At most `max` orders with this key (per tenant) hold a claim at once (docs/design.md §3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<WorkOrderConcurrency>,
    /// Only agents of this tenant (or instance-wide agents) may claim it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Which agents may claim it; at least one criterion.
    pub targeting: WorkOrderTargeting,
    /// never (default: an attempt ended by a disruption fails the order) or safe (the order runs
    /// again at once once the disrupted run is known to have stopped; counted as a reclaim).
    /// Applies to the Jobs of custom orders (docs/design.md §12).
    #[serde(default)]
    pub retry_on_disruption: CrdRetryOnDisruption,
    /// Seconds after the order finished (succeeded, failed, was cancelled or rejected) when the
    /// controller deletes this WorkOrder, as on a Job; the work-order log keeps its record.
    /// Unset: kept until deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 31536000))]
    pub ttl_seconds_after_finished: Option<i32>,
}

/// Phase of a WorkOrder, following its queue row (docs/design.md §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum WorkOrderPhase {
    Pending,
    Claimed,
    RetryPending,
    Succeeded,
    Failed,
    Cancelled,
}

/// Observed state of a WorkOrder: the queue row, mirrored within seconds of each change.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkOrderStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<WorkOrderPhase>,
    /// Id of the queue row (the resource's uid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_order_id: Option<String>,
    /// Agent holding (or last holding) the claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_count: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim_count: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_retry_after: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<String>,
    /// Result message of the finished order, or why it was rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (True once it succeeded), `Completed` (True once it finished, whatever the
    /// outcome), `Reconciling` (True while it waits or runs) and `Stalled` (True when it failed, was
    /// rejected or cancelled), in the metav1.Condition shape (docs/design.md §6).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// How to run `pullman executor` for this Executor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecutorDeployment {
    /// Container image holding the pullman binary.
    #[schemars(length(min = 1))]
    pub image: String,
    /// Executor replicas, kept so by the controller. Unset: the controller leaves the count to
    /// whoever scales the Deployment (KEDA, an HPA, `kubectl scale`); a new Deployment starts with
    /// 1. Leave it unset when an autoscaler scales the Deployment, or the two fight over it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub replicas: Option<i32>,
    /// ServiceAccount the executor runs as: its RBAC is what work orders can do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Namespace for namespaced objects that name none (default: the Executor's namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_namespace: Option<String>,
    /// `imagePullPolicy` of the executor container (default: Kubernetes' own, `IfNotPresent`
    /// unless the tag is `latest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = "^(Always|IfNotPresent|Never)$"))]
    pub image_pull_policy: Option<String>,
    /// Node labels the executor's pods must match, as a pod's `nodeSelector`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Taints the executor's pods tolerate, as a pod's `tolerations`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
}

/// An agent declared with GitOps (docs/design.md §6): the controller registers it and keeps its token
/// in the Secret `<name>-agent-token`.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "pullman.dev",
    version = "v1alpha1",
    kind = "Executor",
    namespaced,
    shortname = "ex",
    status = "ExecutorStatus",
    printcolumn = r#"{"name":"Health","type":"string","jsonPath":".status.health"}"#,
    printcolumn = r#"{"name":"Claims","type":"integer","jsonPath":".status.activeClaims"}"#,
    printcolumn = r#"{"name":"Last Seen","type":"date","jsonPath":".status.lastSeenAt"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ExecutorSpec {
    /// Labels work orders can target.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    /// Annotations work orders can target.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Work types it takes (empty: all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub work_types: Vec<CrdWorkType>,
    /// Tenant it serves (empty: instance-wide).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Most claims held at once (empty: unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MAX_CONCURRENCY.min, max = MAX_CONCURRENCY.max))]
    pub max_concurrency: Option<i32>,
    /// Lease the executor claims with, seconds; health turns stale after 3 × this without contact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = LEASE_SECONDS.min, max = LEASE_SECONDS.max))]
    pub lease_seconds: Option<i32>,
    /// When set, the controller runs `pullman executor` as a Deployment with the agent's token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<ExecutorDeployment>,
}

/// Observed state of an Executor (docs/design.md §6).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecutorStatus {
    /// Id of the agent (the Executor's metadata.uid) once registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// never_seen, active, stale or retired: the agent's contact with the server, followed within
    /// seconds (the `Connected` condition says the same).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_claims: Option<i64>,
    /// Replicas the executor Deployment asks for now (its `spec.replicas`, as whoever scales it
    /// set it), as the last reconcile found it; unset without `spec.deployment`. With
    /// `spec.deployment.replicas` unset and 0 here, the Executor waits for its autoscaler, and a
    /// WorkOrder that waits for it (no matching agent in contact) says `AwaitingScaleUp`
    /// (docs/design.md §10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (agent registered, token Secret written, Deployment available when `deployment` is
    /// set), `Reconciling` (on the way there), `Stalled` (an error a retry cannot fix) and
    /// `Connected` (the agent talks to the server), in the metav1.Condition shape (docs/design.md §6).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A WorkOrder spec the controller cannot queue as it stands: `field` is the spec path
/// (`spec.targeting.agentIds[2]`), `message` a sentence naming it. Surfaced as the `Rejected`
/// condition and Event, like the queue's own refusals (docs/design.md §6).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InvalidSpec {
    pub field: String,
    pub message: String,
}

impl WorkOrderResourceSpec {
    /// The REST create body this spec mirrors (docs/design.md §6). Every `targeting.agentIds` entry
    /// must be a UUID (an agent id); the first one that is not is an [`InvalidSpec`] naming it,
    /// never silently dropped (issue #13).
    pub fn to_create_body(&self) -> Result<NewWorkOrder, InvalidSpec> {
        let agent_ids = self
            .targeting
            .agent_ids
            .iter()
            .enumerate()
            .map(|(i, s)| {
                uuid::Uuid::parse_str(s).map_err(|_| InvalidSpec {
                    field: format!("spec.targeting.agentIds[{i}]"),
                    message: format!(
                        "spec.targeting.agentIds[{i}] is {s:?}, which is not an agent id (a UUID, \
                         e.g. an Executor's metadata.uid)"
                    ),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(NewWorkOrder {
            work_type: WorkType::from(self.work_type).into(),
            yaml_content: self.yaml_content.clone(),
            max_retries: Some(i64::from(self.max_retries)),
            backoff_seconds: Some(i64::from(self.backoff_seconds)),
            claim_timeout_seconds: Some(i64::from(self.claim_timeout_seconds)),
            max_reclaims: Some(i64::from(self.max_reclaims)),
            priority: Some(i64::from(self.priority)),
            concurrency: self.concurrency.as_ref().map(|c| NewConcurrency {
                key: c.key.clone(),
                max: Some(i64::from(c.max)),
                on_conflict: Some(c.on_conflict.into()),
            }),
            tenant: self.tenant.clone(),
            retry_on_disruption: Some(
                RetryOnDisruption::from(self.retry_on_disruption)
                    .as_str()
                    .to_string(),
            ),
            targeting: Targeting {
                agent_ids,
                agent_names: self.targeting.agent_names.clone(),
                labels: self.targeting.labels.clone(),
                annotations: self.targeting.annotations.clone(),
            },
        })
    }
}

/// The CRDs with the CEL rules the derive cannot express: WorkOrder `spec` immutable, targeting
/// with at least one criterion.
pub fn crds() -> Vec<CustomResourceDefinition> {
    let mut wo = serde_json::to_value(WorkOrderResource::crd()).expect("CRD serializes");
    let schema = &mut wo["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    // The kind's name, not the Rust type's (`WorkOrderResource`).
    schema["title"] = json!("WorkOrder");
    schema["description"] = json!("A WorkOrder: a one-time operation pulled by an agent.");
    let spec = &mut schema["properties"]["spec"];
    spec["x-kubernetes-validations"] = json!([
        {"rule": "self == oldSelf", "message": "spec is immutable; delete and recreate the WorkOrder"}
    ]);
    spec["properties"]["targeting"]["x-kubernetes-validations"] = json!([{
        "rule": "(has(self.agentIds) && size(self.agentIds) > 0) || (has(self.agentNames) && size(self.agentNames) > 0) || (has(self.labels) && size(self.labels) > 0) || (has(self.annotations) && size(self.annotations) > 0)",
        "message": "targeting needs at least one of agentIds, agentNames, labels, annotations"
    }]);
    let wo: CustomResourceDefinition = serde_json::from_value(wo).expect("patched CRD parses");
    vec![wo, Executor::crd()]
}

/// `pullman crdgen` output: every CRD as a YAML document.
pub fn crds_yaml() -> String {
    crds()
        .iter()
        .map(|c| serde_norway::to_string(c).expect("CRD serializes to YAML"))
        .collect::<Vec<_>>()
        .join("---\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> WorkOrderResourceSpec {
        serde_norway::from_str(yaml).unwrap()
    }

    #[test]
    fn retry_on_disruption_is_mirrored_to_the_create_body() {
        let base = "workType: custom\nyamlContent: x\ntargeting: {labels: [a]}\n";
        let safe = spec(&format!("{base}retryOnDisruption: safe\n"));
        assert_eq!(safe.retry_on_disruption, CrdRetryOnDisruption::Safe);
        let body = safe.to_create_body().unwrap();
        assert_eq!(body.retry_on_disruption.as_deref(), Some("safe"));
        // Absent: never, stated to the queue.
        let body = spec(base).to_create_body().unwrap();
        assert_eq!(body.retry_on_disruption.as_deref(), Some("never"));
        assert!(
            serde_norway::from_str::<WorkOrderResourceSpec>(&format!(
                "{base}retryOnDisruption: sometimes\n"
            ))
            .is_err()
        );
    }
}
