//! Executor status as a pure function of what the reconcile found (docs/design.md §6), so its
//! conditions are tested without a cluster:
//!
//! - `Ready`: True once the agent is registered, its token Secret written and, with
//!   `spec.deployment`, the Deployment available at its current generation;
//! - `Reconciling`: True on the way there (e.g. the Deployment rolling out);
//! - `Stalled`: True for errors a retry cannot fix (invalid spec, the agent name taken, a Secret
//!   of the token's name that Pullman does not own, no server URL to give a Deployment);
//! - `Connected`: whether the agent talks to the server (`health` says the same in one word). It
//!   is kept apart from `Ready` so that an agent that flaps does not turn a GitOps application red.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::status::condition;
use crate::crd::ExecutorStatus;
use crate::queue::{Agent, AgentHealth};

/// How far the reconcile got towards `Ready`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// Everything the Executor declares is in place.
    Ready,
    /// Still on the way (`Reconciling=True`); `message` is a sentence naming what is awaited.
    Waiting {
        reason: &'static str,
        message: String,
    },
    /// Blocked until someone changes something (`Stalled=True`); `message` says what and where.
    Stalled {
        reason: &'static str,
        message: String,
    },
}

/// `health` as the REST API spells it (docs/design.md §5).
pub fn health_str(h: AgentHealth) -> &'static str {
    match h {
        AgentHealth::NeverSeen => "never_seen",
        AgentHealth::Active => "active",
        AgentHealth::Stale => "stale",
        AgentHealth::Retired => "retired",
    }
}

fn rfc3339(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// `Connected` condition of an agent: (status, reason, message).
fn connected(agent: Option<&Agent>) -> (bool, &'static str, String) {
    let Some(a) = agent else {
        return (
            false,
            "NotRegistered",
            "No agent is registered for this Executor yet.".to_string(),
        );
    };
    let seen = a.last_seen_at.map(rfc3339).unwrap_or_default();
    match a.health {
        AgentHealth::Active => (
            true,
            "Active",
            format!("Agent {} last contacted the server at {seen}.", a.name),
        ),
        AgentHealth::NeverSeen => (
            false,
            "NeverSeen",
            format!("Agent {} has not contacted the server yet.", a.name),
        ),
        AgentHealth::Stale => (
            false,
            "Stale",
            format!(
                "Agent {} has not contacted the server since {seen}, longer than its stale threshold.",
                a.name
            ),
        ),
        AgentHealth::Retired => (false, "Retired", format!("Agent {} is retired.", a.name)),
    }
}

/// Status of Executor `name` (`<namespace>/<name>`) with the agent (once registered), the name
/// of its token Secret (once written) and the reconcile's `progress`. Conditions keep their
/// `lastTransitionTime` from `prev` while their status holds.
pub fn executor_status(
    name: &str,
    agent: Option<&Agent>,
    token_secret: Option<String>,
    progress: &Progress,
    prev: Option<&ExecutorStatus>,
    generation: Option<i64>,
    now: &Time,
) -> ExecutorStatus {
    let prev = prev.map(|p| p.conditions.as_slice()).unwrap_or_default();
    let c = |type_: &str, status: bool, reason: &str, message: &str| {
        condition(prev, type_, status, reason, message, generation, now)
    };
    let mut conditions = match progress {
        Progress::Ready => vec![c(
            "Ready",
            true,
            "Ready",
            &format!(
                "Executor {name} is ready: its agent is registered{}.",
                token_secret
                    .as_deref()
                    .map(|s| format!(" and its token is in Secret {s}"))
                    .unwrap_or_default()
            ),
        )],
        Progress::Waiting { reason, message } => vec![
            c("Ready", false, reason, message),
            c("Reconciling", true, reason, message),
        ],
        Progress::Stalled { reason, message } => vec![
            c("Ready", false, reason, message),
            c("Stalled", true, reason, message),
        ],
    };
    let (ok, reason, message) = connected(agent);
    conditions.push(c("Connected", ok, reason, &message));
    ExecutorStatus {
        agent_id: agent.map(|a| a.id.to_string()),
        health: agent.map(|a| health_str(a.health).to_string()),
        last_seen_at: agent.and_then(|a| a.last_seen_at).map(rfc3339),
        active_claims: agent.map(|a| a.active_claims),
        // The Deployment's count is the reconcile's to fill in (`executors::write_status`).
        replicas: None,
        token_secret_name: token_secret,
        observed_generation: generation,
        conditions,
    }
}

/// Whether Deployment `d` is available at its current generation (`None`) or what is awaited
/// (`Some(sentence)`): the Deployment controller has seen the latest spec, every replica runs the
/// latest template and is available, and its `Available` condition is True.
pub fn deployment_waiting(d: &Deployment) -> Option<String> {
    let name = d.metadata.name.as_deref().unwrap_or("(unnamed)");
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let Some(st) = d.status.as_ref() else {
        return Some(format!(
            "Deployment {name} has not been picked up by the Deployment controller yet."
        ));
    };
    let generation = d.metadata.generation.unwrap_or(0);
    if st.observed_generation.unwrap_or(0) < generation {
        return Some(format!(
            "Deployment {name} is at generation {generation}; the Deployment controller has \
             observed generation {} so far.",
            st.observed_generation.unwrap_or(0)
        ));
    }
    let updated = st.updated_replicas.unwrap_or(0);
    let available = st.available_replicas.unwrap_or(0);
    let total = st.replicas.unwrap_or(0);
    if updated < want || available < want || total > updated {
        return Some(format!(
            "Deployment {name} is rolling out: {updated} of {want} replicas updated, {available} \
             available."
        ));
    }
    let cond_available = st
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Available" && c.status == "True");
    if !cond_available {
        return Some(format!(
            "Deployment {name} does not report the Available condition yet."
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::now())
    }

    fn agent(health: AgentHealth) -> Agent {
        let t = chrono::Utc::now();
        Agent {
            id: uuid::Uuid::from_u128(5),
            name: "ns/runner".into(),
            labels: vec![],
            annotations: Default::default(),
            work_types: vec![],
            tenant: None,
            max_concurrency: None,
            lease_seconds: Some(30),
            health,
            active_claims: 0,
            created_at: t,
            last_seen_at: (health != AgentHealth::NeverSeen).then_some(t),
            retired_at: None,
        }
    }

    fn conds(s: &ExecutorStatus) -> Vec<(&str, &str, &str)> {
        s.conditions
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.as_str()))
            .collect()
    }

    #[test]
    fn readiness_and_contact_are_separate_conditions() {
        let a = agent(AgentHealth::NeverSeen);
        let s = executor_status(
            "ns/runner",
            Some(&a),
            Some("runner-agent-token".into()),
            &Progress::Ready,
            None,
            Some(2),
            &now(),
        );
        assert_eq!(
            conds(&s),
            vec![
                ("Ready", "True", "Ready"),
                ("Connected", "False", "NeverSeen")
            ]
        );
        assert_eq!(s.health.as_deref(), Some("never_seen"));
        assert_eq!(s.observed_generation, Some(2));
        assert_eq!(
            s.conditions[0].message,
            "Executor ns/runner is ready: its agent is registered and its token is in Secret runner-agent-token."
        );
        let a = agent(AgentHealth::Active);
        let later = Time(
            k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(9),
        );
        let s2 = executor_status(
            "ns/runner",
            Some(&a),
            Some("runner-agent-token".into()),
            &Progress::Ready,
            Some(&s),
            Some(2),
            &later,
        );
        assert_eq!(
            conds(&s2),
            vec![("Ready", "True", "Ready"), ("Connected", "True", "Active")]
        );
        assert_eq!(
            s2.conditions[0].last_transition_time, s.conditions[0].last_transition_time,
            "Ready did not change when the agent connected"
        );
        assert_eq!(s2.conditions[1].last_transition_time, later);
    }

    #[test]
    fn waiting_reconciles_and_blocked_stalls() {
        let a = agent(AgentHealth::Stale);
        let waiting = Progress::Waiting {
            reason: "DeploymentProgressing",
            message: "Deployment runner-executor is rolling out.".into(),
        };
        let s = executor_status("ns/runner", Some(&a), None, &waiting, None, Some(1), &now());
        assert_eq!(
            conds(&s),
            vec![
                ("Ready", "False", "DeploymentProgressing"),
                ("Reconciling", "True", "DeploymentProgressing"),
                ("Connected", "False", "Stale"),
            ]
        );
        let stalled = Progress::Stalled {
            reason: "SecretNotOwned",
            message: "Secret runner-agent-token is not owned by Executor ns/runner.".into(),
        };
        let s = executor_status("ns/runner", None, None, &stalled, None, Some(1), &now());
        assert_eq!(
            conds(&s),
            vec![
                ("Ready", "False", "SecretNotOwned"),
                ("Stalled", "True", "SecretNotOwned"),
                ("Connected", "False", "NotRegistered"),
            ]
        );
        assert_eq!(s.health, None);
    }

    #[test]
    fn a_deployment_is_ready_when_available_at_its_generation() {
        let d = |generation: i64, status: serde_json::Value| -> Deployment {
            serde_json::from_value(json!({
                "metadata": {"name": "runner-executor", "generation": generation},
                "spec": {"replicas": 2, "selector": {}, "template": {}},
                "status": status,
            }))
            .unwrap()
        };
        let available = json!([{"type": "Available", "status": "True"}]);
        let ready = d(
            3,
            json!({"observedGeneration": 3, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2, "conditions": available}),
        );
        assert_eq!(deployment_waiting(&ready), None);
        let old = d(
            4,
            json!({"observedGeneration": 3, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2, "conditions": available}),
        );
        assert!(deployment_waiting(&old).unwrap().contains("generation 4"));
        let rolling = d(
            3,
            json!({"observedGeneration": 3, "replicas": 3, "updatedReplicas": 1, "availableReplicas": 2, "conditions": available}),
        );
        assert!(
            deployment_waiting(&rolling)
                .unwrap()
                .contains("1 of 2 replicas updated")
        );
        let unavailable = d(
            3,
            json!({"observedGeneration": 3, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2, "conditions": [{"type": "Available", "status": "False"}]}),
        );
        assert!(deployment_waiting(&unavailable).is_some());
        let fresh = d(1, serde_json::Value::Null);
        assert!(deployment_waiting(&fresh).is_some());
    }
}
