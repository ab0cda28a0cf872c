//! Validation of create bodies (docs/design.md §5): every problem is reported against the field that
//! holds it, before anything is written.

use std::collections::BTreeMap;

use super::QueueError;
use super::keys::{self, Concurrency};
use super::model::{
    ClaimWaiting, Completion, NewAgent, NewWorkOrder, RequestedWorkType, RetryOnDisruption,
    Targeting, WaitReason, WorkType,
};
use super::rules::{MIN_WATCH_BUDGET, watch_budget};
use super::text::{strip_nul, strip_nul_all, strip_nul_map};
use crate::manifest;

use super::limits::{
    BACKOFF_SECONDS, CLAIM_TIMEOUT_SECONDS, LEASE_SECONDS, MAX_AGENT_NAME_CHARS, MAX_CONCURRENCY,
    MAX_LIST_ENTRIES, MAX_RECLAIMS, MAX_RETRIES, MAX_STRING_CHARS, MAX_YAML_BYTES, PRIORITY,
    WATCHED_MIN_CLAIM_TIMEOUT_SECONDS,
};

/// A create body that passed validation, with defaults applied.
#[derive(Debug, Clone)]
pub struct WorkOrderSpec {
    pub work_type: WorkType,
    pub yaml_content: String,
    pub max_retries: i32,
    pub backoff_seconds: i32,
    pub claim_timeout_seconds: i32,
    pub max_reclaims: i32,
    /// Higher first within a tenant (docs/design.md §3).
    pub priority: i32,
    /// Its concurrency key, if any (docs/design.md §3).
    pub concurrency: Option<Concurrency>,
    pub tenant: Option<String>,
    pub targeting: Targeting,
    /// What an attempt ended by a disruption does to the order (docs/design.md §12).
    pub retry_on_disruption: RetryOnDisruption,
}

/// An agent registration that passed validation.
#[derive(Debug, Clone)]
pub struct AgentSpec {
    pub name: String,
    pub labels: Vec<String>,
    pub annotations: BTreeMap<String, String>,
    pub work_types: Vec<WorkType>,
    pub tenant: Option<String>,
    pub max_concurrency: Option<i32>,
    pub lease_seconds: Option<i32>,
}

fn invalid(field: &str, message: impl Into<String>) -> QueueError {
    QueueError::Invalid {
        field: field.to_string(),
        message: message.into(),
    }
}

/// The length bounds hold for a text as sent, U+0000 included, as the OpenAPI schema's `maxLength`
/// counts it: a text past them is refused even when removing U+0000 (which the checks after it
/// see) would bring it under.
fn within_as_sent(field: &str, value: &str, max: usize) -> Result<(), QueueError> {
    if value.chars().count() > max {
        return Err(invalid(
            field,
            format!("{field} is longer than {max} characters"),
        ));
    }
    Ok(())
}

/// [`within_as_sent`] over every text of a list and a map.
fn lists_within_as_sent(
    field: &str,
    list: &[String],
    map_field: &str,
    map: &BTreeMap<String, String>,
) -> Result<(), QueueError> {
    for v in list {
        within_as_sent(field, v, MAX_STRING_CHARS)?;
    }
    for (k, v) in map {
        within_as_sent(&format!("{map_field} key"), k, MAX_STRING_CHARS)?;
        within_as_sent(&format!("{map_field}[{k:?}]"), v, MAX_STRING_CHARS)?;
    }
    Ok(())
}

fn check_string(field: &str, value: &str) -> Result<(), QueueError> {
    if value.is_empty() {
        return Err(invalid(field, format!("{field} must not be empty")));
    }
    if value.chars().count() > MAX_STRING_CHARS {
        return Err(invalid(
            field,
            format!("{field} is longer than {MAX_STRING_CHARS} characters"),
        ));
    }
    Ok(())
}

fn check_list<T>(field: &str, list: &[T]) -> Result<(), QueueError> {
    if list.len() > MAX_LIST_ENTRIES {
        return Err(invalid(
            field,
            format!("{field} has more than {MAX_LIST_ENTRIES} entries"),
        ));
    }
    Ok(())
}

fn check_annotations(field: &str, map: &BTreeMap<String, String>) -> Result<(), QueueError> {
    if map.len() > MAX_LIST_ENTRIES {
        return Err(invalid(
            field,
            format!("{field} has more than {MAX_LIST_ENTRIES} entries"),
        ));
    }
    for (k, v) in map {
        check_string(&format!("{field} key"), k)?;
        if k.contains('=') {
            return Err(invalid(
                field,
                format!("{field} key {k:?} must not contain '='"),
            ));
        }
        if v.chars().count() > MAX_STRING_CHARS {
            return Err(invalid(
                field,
                format!("{field}[{k:?}] is longer than {MAX_STRING_CHARS} characters"),
            ));
        }
    }
    Ok(())
}

fn check_targeting(t: &Targeting) -> Result<(), QueueError> {
    if t.is_empty() {
        return Err(QueueError::Invalid {
            field: "targeting".into(),
            message: "targeting needs at least one of agent_ids, agent_names, labels, annotations"
                .into(),
        });
    }
    check_list("targeting.agent_ids", &t.agent_ids)?;
    check_list("targeting.agent_names", &t.agent_names)?;
    check_list("targeting.labels", &t.labels)?;
    for n in &t.agent_names {
        check_string("targeting.agent_names", n)?;
    }
    for l in &t.labels {
        check_string("targeting.labels", l)?;
    }
    check_annotations("targeting.annotations", &t.annotations)
}

/// Parses a `work_type`; the error is docs/design.md §4's `Unknown work type: <value>`.
pub fn parse_work_type(field: &str, value: &str) -> Result<WorkType, QueueError> {
    WorkType::parse(value).ok_or_else(|| QueueError::UnknownWorkType {
        field: field.to_string(),
        value: value.to_string(),
    })
}

/// The work type a request named, or docs/design.md §4's `Unknown work type: <value>` against `field`.
fn known_work_type(field: &str, requested: &RequestedWorkType) -> Result<WorkType, QueueError> {
    match requested {
        RequestedWorkType::Known(t) => Ok(*t),
        RequestedWorkType::Unknown(value) => Err(QueueError::UnknownWorkType {
            field: field.to_string(),
            value: value.clone(),
        }),
    }
}

/// Validates a create body (docs/design.md §5): bounds, targeting, YAML shape, and the watch budget of
/// orders that need watching (§4). Errors name the field. U+0000 is removed from every text
/// first (see [`super::text`]), so what is validated is what is stored.
///
/// Parsing `yaml_content` costs CPU in proportion to its size and nesting (bounded by
/// [`crate::manifest`]); async callers run this on a blocking thread.
pub fn validate_work_order(mut body: NewWorkOrder) -> Result<WorkOrderSpec, QueueError> {
    let work_type = known_work_type("work_type", &body.work_type)?;
    if body.yaml_content.len() > MAX_YAML_BYTES {
        return Err(QueueError::TooLarge {
            field: "yaml_content".into(),
            limit: MAX_YAML_BYTES,
        });
    }
    let t = &body.targeting;
    lists_within_as_sent(
        "targeting.labels",
        &t.labels,
        "targeting.annotations",
        &t.annotations,
    )?;
    for n in &t.agent_names {
        within_as_sent("targeting.agent_names", n, MAX_STRING_CHARS)?;
    }
    if let Some(tenant) = &body.tenant {
        within_as_sent("tenant", tenant, MAX_STRING_CHARS)?;
    }
    strip_nul(&mut body.yaml_content);
    if let Some(tenant) = &mut body.tenant {
        strip_nul(tenant);
    }
    strip_nul_targeting(&mut body.targeting);
    let max_retries = MAX_RETRIES.check_or_default(body.max_retries)?;
    let backoff_seconds = BACKOFF_SECONDS.check_or_default(body.backoff_seconds)?;
    let claim_timeout_seconds =
        CLAIM_TIMEOUT_SECONDS.check_or_default(body.claim_timeout_seconds)?;
    let max_reclaims = MAX_RECLAIMS.check_or_default(body.max_reclaims)?;
    let priority = PRIORITY.check_or_default(body.priority)?;
    let concurrency = body.concurrency.map(keys::validate).transpose()?;
    let retry_on_disruption = parse_retry_on_disruption(body.retry_on_disruption.as_deref())?;
    if let Some(tenant) = &body.tenant {
        check_string("tenant", tenant)?;
    }
    check_targeting(&body.targeting)?;

    let docs =
        manifest::parse_documents(&body.yaml_content).map_err(|e| invalid("yaml_content", e.0))?;
    if docs.is_empty() {
        return Err(invalid(
            "yaml_content",
            "yaml_content holds no Kubernetes object (all documents are empty)",
        ));
    }
    let needs_watch = match work_type {
        WorkType::Build => {
            if docs.len() != 1 || !manifest::is_shipwright_build(&docs[0]) {
                return Err(invalid(
                    "yaml_content",
                    "a build work order holds exactly one Build (apiVersion shipwright.io/v1beta1)",
                ));
            }
            true
        }
        WorkType::Custom => docs.iter().any(manifest::is_job),
    };
    if needs_watch && watch_budget(claim_timeout_seconds as u32) < MIN_WATCH_BUDGET {
        return Err(invalid(
            "claim_timeout_seconds",
            format!(
                "claim_timeout_seconds {claim_timeout_seconds} leaves a watch budget under {} s \
                 for an order that must be watched (Job or build); use at least \
                 {WATCHED_MIN_CLAIM_TIMEOUT_SECONDS}",
                MIN_WATCH_BUDGET.as_secs()
            ),
        ));
    }
    Ok(WorkOrderSpec {
        work_type,
        yaml_content: body.yaml_content,
        max_retries,
        backoff_seconds,
        claim_timeout_seconds,
        max_reclaims,
        priority,
        concurrency,
        tenant: body.tenant,
        targeting: body.targeting,
        retry_on_disruption,
    })
}

/// The order's `retry_on_disruption` (docs/design.md §12): `never` when absent; a spelling
/// other than `never` or `safe` is `400 invalid_field` naming the field.
fn parse_retry_on_disruption(value: Option<&str>) -> Result<RetryOnDisruption, QueueError> {
    match value {
        None => Ok(RetryOnDisruption::default()),
        Some(v) => RetryOnDisruption::parse(v).ok_or_else(|| {
            invalid(
                "retry_on_disruption",
                format!("retry_on_disruption must be never or safe, not {v:?}"),
            )
        }),
    }
}

/// [`validate_work_order`] on a blocking thread, for async callers (the API, the controller):
/// parsing up to 1 MiB of YAML is CPU work that would otherwise hold an async worker, and with
/// it other requests, heartbeats among them (issue #14).
pub async fn validate_work_order_off_thread(
    body: NewWorkOrder,
) -> Result<WorkOrderSpec, QueueError> {
    match tokio::task::spawn_blocking(move || validate_work_order(body)).await {
        Ok(result) => result,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

fn strip_nul_targeting(t: &mut Targeting) {
    strip_nul_all(&mut t.agent_names);
    strip_nul_all(&mut t.labels);
    strip_nul_map(&mut t.annotations);
}

/// Validates an agent registration (docs/design.md §5). Errors name the field. U+0000 is removed
/// from every text first (see [`super::text`]).
pub fn validate_agent(mut body: NewAgent) -> Result<AgentSpec, QueueError> {
    within_as_sent("name", &body.name, MAX_AGENT_NAME_CHARS)?;
    lists_within_as_sent("labels", &body.labels, "annotations", &body.annotations)?;
    if let Some(tenant) = &body.tenant {
        within_as_sent("tenant", tenant, MAX_STRING_CHARS)?;
    }
    strip_nul(&mut body.name);
    strip_nul_all(&mut body.labels);
    strip_nul_map(&mut body.annotations);
    if let Some(tenant) = &mut body.tenant {
        strip_nul(tenant);
    }
    check_string("name", &body.name)?;
    if body.name.chars().count() > MAX_AGENT_NAME_CHARS {
        return Err(invalid("name", "name is longer than 253 characters"));
    }
    check_list("labels", &body.labels)?;
    for l in &body.labels {
        check_string("labels", l)?;
    }
    check_annotations("annotations", &body.annotations)?;
    check_list("work_types", &body.work_types)?;
    let mut work_types = Vec::new();
    for t in &body.work_types {
        let t = known_work_type("work_types", t)?;
        if !work_types.contains(&t) {
            work_types.push(t);
        }
    }
    if let Some(tenant) = &body.tenant {
        check_string("tenant", tenant)?;
    }
    let max_concurrency = MAX_CONCURRENCY.check_optional(body.max_concurrency)?;
    let lease_seconds = LEASE_SECONDS.check_optional(body.lease_seconds)?;
    Ok(AgentSpec {
        name: body.name,
        labels: body.labels,
        annotations: body.annotations,
        work_types,
        tenant: body.tenant,
        max_concurrency,
        lease_seconds,
    })
}

/// Validates the `lease_seconds` of a claim request ([`LEASE_SECONDS`]).
pub fn validate_lease(lease_seconds: Option<i64>) -> Result<Option<i32>, QueueError> {
    LEASE_SECONDS.check_optional(lease_seconds)
}

/// Validates a complete before anything is written (docs/design.md §5, §12): `disrupted: true`
/// only with `success: false` (an attempt a disruption ended did not succeed); otherwise
/// `400 invalid_field` naming `disrupted`.
pub fn validate_completion(completion: &Completion) -> Result<(), QueueError> {
    if completion.success && completion.disrupted {
        return Err(invalid(
            "disrupted",
            "disrupted: true goes only with success: false (an attempt ended by a disruption did \
             not succeed)",
        ));
    }
    Ok(())
}

/// Validates what a heartbeat says holds its order up (docs/design.md §12): only
/// `node_unreachable`, a `message` of at most [`MAX_STRING_CHARS`] characters and a node name of
/// at most [`MAX_AGENT_NAME_CHARS`] (Kubernetes' 253): the bounds the served OpenAPI states
/// (`api::ops`), so that nothing the schema allows is refused. U+0000 is removed, as from every
/// text.
pub fn validate_claim_waiting(
    waiting: Option<ClaimWaiting>,
) -> Result<Option<ClaimWaiting>, QueueError> {
    let Some(mut w) = waiting else {
        return Ok(None);
    };
    if w.reason != WaitReason::NodeUnreachable {
        return Err(invalid(
            "waiting.reason",
            format!(
                "waiting.reason: an agent may say only node_unreachable of a claimed order, not {}",
                w.reason
            ),
        ));
    }
    within_as_sent("waiting.message", &w.message, MAX_STRING_CHARS)?;
    within_as_sent("waiting.node.name", &w.node.name, MAX_AGENT_NAME_CHARS)?;
    strip_nul(&mut w.message);
    strip_nul(&mut w.node.name);
    Ok(Some(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(annotation_value: String) -> NewAgent {
        NewAgent {
            name: "a".into(),
            annotations: [("zone".to_string(), annotation_value)].into(),
            ..Default::default()
        }
    }

    #[test]
    fn lengths_count_every_character_as_sent_nul_included() {
        // 4096 characters and a U+0000: over the bound as sent, though not once stripped.
        let over = format!("{}\u{0}", "a".repeat(MAX_STRING_CHARS));
        let err = validate_agent(agent(over)).unwrap_err();
        assert!(
            matches!(&err, QueueError::Invalid { field, .. } if field == "annotations[\"zone\"]"),
            "{err:?}"
        );
        // Within the bound as sent: accepted, and stored without the U+0000.
        let within = format!("{}\u{0}", "a".repeat(MAX_STRING_CHARS - 1));
        let spec = validate_agent(agent(within)).unwrap();
        assert_eq!(spec.annotations["zone"].len(), MAX_STRING_CHARS - 1);
        let long_name = NewAgent {
            name: format!("{}\u{0}", "n".repeat(MAX_AGENT_NAME_CHARS)),
            ..Default::default()
        };
        assert!(
            matches!(validate_agent(long_name), Err(QueueError::Invalid { field, .. }) if field == "name")
        );
    }
}
