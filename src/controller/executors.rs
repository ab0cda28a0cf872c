//! Executor reconciler (DESIGN.md §6): registers the agent (id = `metadata.uid`), keeps its token
//! in the Secret `<name>-agent-token` (re-issued when the Secret is deleted), keeps the agent in
//! step with the spec, optionally runs `pullman executor` as a Deployment, reports health, and
//! retires the agent when the resource is deleted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType};
use kube::runtime::finalizer::{Event, finalizer};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{Context, Error, FIELD_MANAGER, RETIRE_FINALIZER, scoped};
use crate::crd::{Executor, ExecutorStatus};
use crate::queue::validate::{AgentSpec, validate_agent};
use crate::queue::{Agent, AgentHealth, NewAgent, QueueError};

pub(super) async fn run(ctx: Arc<Context>, stop: CancellationToken) {
    let api: Api<Executor> = scoped(&ctx.client, &ctx.config.namespace);
    let secrets: Api<Secret> = scoped(&ctx.client, &ctx.config.namespace);
    let deployments: Api<Deployment> = scoped(&ctx.client, &ctx.config.namespace);
    let owned = watcher::Config::default().labels("app.kubernetes.io/managed-by=pullman");
    Controller::new(api, watcher::Config::default())
        .owns(secrets, owned.clone())
        .owns(deployments, owned)
        .graceful_shutdown_on(stop.cancelled_owned())
        .run(
            |o, c| super::measured("executor", reconcile(o, c)),
            error_policy,
            ctx,
        )
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "Executor reconcile failed");
            }
        })
        .await;
}

fn error_policy(ex: Arc<Executor>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(executor = %ex.name_any(), namespace = ?ex.namespace(), kind = error.metric_label(), %error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

async fn reconcile(ex: Arc<Executor>, ctx: Arc<Context>) -> Result<Action, Error> {
    let api: Api<Executor> = ctx.api(&ex.namespace().unwrap_or_default());
    finalizer(&api, RETIRE_FINALIZER, ex, |event| async {
        match event {
            Event::Apply(ex) => apply(ex, &ctx).await,
            Event::Cleanup(ex) => cleanup(ex, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// The agent an Executor declares; named `<namespace>/<name>` (DESIGN.md §6).
pub fn agent_spec(ex: &Executor) -> Result<AgentSpec, QueueError> {
    validate_agent(NewAgent {
        name: format!("{}/{}", ex.namespace().unwrap_or_default(), ex.name_any()),
        labels: ex.spec.labels.clone(),
        annotations: ex.spec.annotations.clone(),
        work_types: ex
            .spec
            .work_types
            .iter()
            .map(|t| crate::queue::WorkType::from(*t).as_str().to_string())
            .collect(),
        tenant: ex.spec.tenant.clone(),
        max_concurrency: ex.spec.max_concurrency.map(i64::from),
        lease_seconds: ex.spec.lease_seconds.map(i64::from),
    })
}

/// Name of the Secret holding an Executor's token.
pub fn token_secret_name(ex: &Executor) -> String {
    format!("{}-agent-token", ex.name_any())
}

fn managed_labels(ex: &Executor) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "app.kubernetes.io/managed-by".to_string(),
            "pullman".to_string(),
        ),
        ("pullman.dev/executor".to_string(), ex.name_any()),
    ])
}

async fn write_token(ex: &Executor, token: &str, ctx: &Context) -> Result<(), Error> {
    let ns = ex.namespace().unwrap_or_default();
    let owner = ex
        .controller_owner_ref(&())
        .expect("Executor has a name and uid");
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(token_secret_name(ex)),
            namespace: Some(ns.clone()),
            labels: Some(managed_labels(ex)),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(
            "token".to_string(),
            ByteString(token.as_bytes().to_vec()),
        )])),
        ..Default::default()
    };
    let api: Api<Secret> = ctx.api(&ns);
    api.patch(
        &token_secret_name(ex),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&secret),
    )
    .await?;
    Ok(())
}

async fn event(ex: &Executor, ctx: &Context, type_: EventType, reason: &str, note: String) {
    let e = KubeEvent {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(error) = ctx.recorder.publish(&e, &ex.object_ref(&())).await {
        tracing::debug!(%error, "could not record an event");
    }
}

fn differs(agent: &Agent, spec: &AgentSpec) -> bool {
    agent.name != spec.name
        || agent.labels != spec.labels
        || agent.annotations != spec.annotations
        || agent.work_types != spec.work_types
        || agent.tenant != spec.tenant
        || agent.max_concurrency != spec.max_concurrency
        || (spec.lease_seconds.is_some() && agent.lease_seconds != spec.lease_seconds)
}

async fn apply(ex: Arc<Executor>, ctx: &Context) -> Result<Action, Error> {
    let ns = ex.namespace().unwrap_or_default();
    let id = ex
        .uid()
        .and_then(|u| Uuid::parse_str(&u).ok())
        .ok_or_else(|| Error::Invalid("Executor has no uid".into()))?;
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let spec = match agent_spec(&ex) {
        Ok(s) => s,
        Err(e) => {
            let status = status_with(&ex, None, false, "InvalidSpec", &e.to_string(), &now);
            patch_status(&ex, &status, ctx).await?;
            return Ok(Action::await_change());
        }
    };
    let secrets: Api<Secret> = ctx.api(&ns);
    let agent = match ctx.queue.get_agent(id).await {
        Err(QueueError::NotFound { .. }) => match ctx.queue.register_agent(&spec, Some(id)).await {
            Ok(created) => {
                write_token(&ex, &created.token, ctx).await?;
                event(
                    &ex,
                    ctx,
                    EventType::Normal,
                    "Registered",
                    format!(
                        "agent {} registered; token in Secret {}",
                        spec.name,
                        token_secret_name(&ex)
                    ),
                )
                .await;
                created.agent
            }
            Err(QueueError::Conflict { message, .. }) => {
                let status = status_with(&ex, None, false, "NameTaken", &message, &now);
                patch_status(&ex, &status, ctx).await?;
                return Ok(Action::requeue(Duration::from_secs(60)));
            }
            Err(e) => return Err(e.into()),
        },
        Err(e) => return Err(e.into()),
        Ok(agent) => {
            let agent = if differs(&agent, &spec) {
                ctx.queue.update_agent(id, &spec).await?
            } else {
                agent
            };
            if secrets.get_opt(&token_secret_name(&ex)).await?.is_none() {
                // The Secret is gone: issue a new token and revoke the old one.
                let rotated = ctx.queue.rotate_agent_token(id).await?;
                write_token(&ex, &rotated.token, ctx).await?;
                event(
                    &ex,
                    ctx,
                    EventType::Normal,
                    "TokenRotated",
                    format!(
                        "Secret {} was missing; issued a new token and revoked the old one",
                        token_secret_name(&ex)
                    ),
                )
                .await;
                rotated.agent
            } else {
                agent
            }
        }
    };
    let deployment_note = reconcile_deployment(&ex, ctx).await?;
    let (ready, reason, message) = match &deployment_note {
        Some(problem) => (false, "DeploymentNotConfigured", problem.as_str()),
        None => (true, "Registered", "agent registered; token in its Secret"),
    };
    let status = status_with(&ex, Some(&agent), ready, reason, message, &now);
    if ex.status.as_ref() != Some(&status) {
        patch_status(&ex, &status, ctx).await?;
    }
    Ok(Action::requeue(Duration::from_secs(30)))
}

fn health_str(h: AgentHealth) -> &'static str {
    match h {
        AgentHealth::NeverSeen => "never_seen",
        AgentHealth::Active => "active",
        AgentHealth::Stale => "stale",
        AgentHealth::Retired => "retired",
    }
}

fn status_with(
    ex: &Executor,
    agent: Option<&Agent>,
    ready: bool,
    reason: &str,
    message: &str,
    now: &Time,
) -> ExecutorStatus {
    let status = if ready { "True" } else { "False" };
    let last = ex
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .filter(|c| c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    ExecutorStatus {
        agent_id: agent.map(|a| a.id.to_string()),
        health: agent.map(|a| health_str(a.health).to_string()),
        last_seen_at: agent
            .and_then(|a| a.last_seen_at)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
        active_claims: agent.map(|a| a.active_claims),
        token_secret_name: agent.map(|_| token_secret_name(ex)),
        observed_generation: ex.metadata.generation,
        conditions: vec![Condition {
            type_: "Ready".into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: last,
            observed_generation: ex.metadata.generation,
        }],
    }
}

async fn patch_status(ex: &Executor, status: &ExecutorStatus, ctx: &Context) -> Result<(), Error> {
    let api: Api<Executor> = ctx.api(&ex.namespace().unwrap_or_default());
    let patch = json!({"apiVersion": "pullman.dev/v1alpha1", "kind": "Executor", "status": status});
    api.patch_status(
        &ex.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

fn deployment_name(ex: &Executor) -> String {
    format!("{}-executor", ex.name_any())
}

/// Applies (or removes) the executor Deployment; returns a problem to report, if any.
async fn reconcile_deployment(ex: &Executor, ctx: &Context) -> Result<Option<String>, Error> {
    let ns = ex.namespace().unwrap_or_default();
    let api: Api<Deployment> = ctx.api(&ns);
    let Some(d) = &ex.spec.deployment else {
        if api.get_opt(&deployment_name(ex)).await?.is_some() {
            api.delete(&deployment_name(ex), &DeleteParams::background())
                .await?;
        }
        return Ok(None);
    };
    let Some(server) = &ctx.config.executor_server_url else {
        return Ok(Some(
            "spec.deployment is set but the controller has no --executor-server-url to give the executor".into(),
        ));
    };
    let mut labels = managed_labels(ex);
    labels.insert("app.kubernetes.io/name".into(), "pullman-executor".into());
    let owner = ex
        .controller_owner_ref(&())
        .expect("Executor has a name and uid");
    let mut args = vec![
        "executor".to_string(),
        "--server".into(),
        server.clone(),
        "--token-file".into(),
        "/var/run/pullman/token".into(),
        "--target-namespace".into(),
        d.target_namespace.clone().unwrap_or_else(|| ns.clone()),
    ];
    if let Some(lease) = ex.spec.lease_seconds {
        args.extend(["--lease-seconds".into(), lease.to_string()]);
    }
    if let Some(max) = ex.spec.max_concurrency {
        args.extend(["--concurrency".into(), max.min(256).to_string()]);
    }
    let deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": deployment_name(ex),
            "namespace": ns,
            "labels": labels,
            "ownerReferences": [owner],
        },
        "spec": {
            "replicas": d.replicas.unwrap_or(1),
            "selector": {"matchLabels": {"pullman.dev/executor": ex.name_any(), "app.kubernetes.io/name": "pullman-executor"}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": d.service_account_name,
                    "containers": [{
                        "name": "executor",
                        "image": d.image,
                        "args": args,
                        "volumeMounts": [{"name": "token", "mountPath": "/var/run/pullman", "readOnly": true}],
                        "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "runAsNonRoot": true},
                    }],
                    "volumes": [{"name": "token", "secret": {"secretName": token_secret_name(ex)}}],
                },
            },
        },
    });
    api.patch(
        &deployment_name(ex),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&deployment),
    )
    .await?;
    Ok(None)
}

async fn cleanup(ex: Arc<Executor>, ctx: &Context) -> Result<Action, Error> {
    if let Some(id) = ex.uid().and_then(|u| Uuid::parse_str(&u).ok()) {
        match ctx.queue.retire_agent(id).await {
            Ok(_) => {
                tracing::info!(executor = %ex.name_any(), agent = %id, "agent retired: Executor deleted")
            }
            Err(QueueError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Action::await_change())
}
