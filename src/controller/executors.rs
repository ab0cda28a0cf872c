//! Executor reconciler (docs/design.md §6): registers the agent (id = `metadata.uid`), keeps its token
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
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType};
use kube::runtime::finalizer::{Event, finalizer};
use kube::runtime::reflector::store::Writer;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::executor_status::{Progress, deployment_waiting, executor_status};
use super::{
    CONTROLLER_FIELD_MANAGER, Context, Error, RETIRE_FINALIZER, contact, finalized, scoped, status,
};
use crate::crd::{Executor, ExecutorStatus};
use crate::queue::validate::{AgentSpec, validate_agent};
use crate::queue::{Agent, NewAgent, QueueError};

/// Backstop resync of an Executor: refreshes `lastSeenAt` and `activeClaims`. Changes of the
/// agent's health do not wait for it (see contact.rs).
const RESYNC: Duration = Duration::from_secs(30);

/// Runs the Executor controller until `stop` fires. Its cache is filled through `writer`, so the
/// WorkOrder controller reads the same Executors (which of them wait for an autoscaler,
/// `schedulable::AwaitingScaleUp`) without a watch of its own.
pub(super) async fn run(ctx: Arc<Context>, writer: Writer<Executor>, stop: CancellationToken) {
    let api: Api<Executor> = scoped(&ctx.client, &ctx.config.namespace);
    let secrets: Api<Secret> = scoped(&ctx.client, &ctx.config.namespace);
    let deployments: Api<Deployment> = scoped(&ctx.client, &ctx.config.namespace);
    let owned = watcher::Config::default().labels("app.kubernetes.io/managed-by=pullman");
    let store = writer.as_reader();
    let objects = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects();
    let controller = Controller::for_stream(objects, store.clone());
    let contact = contact::changes(ctx.queue.clone(), store);
    controller
        .owns(secrets, owned.clone())
        .owns(deployments, owned)
        .reconcile_on(contact)
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
    let result = finalizer(&api, RETIRE_FINALIZER, ex, |event| async {
        match event {
            Event::Apply(ex) => apply(ex, &ctx).await,
            Event::Cleanup(ex) => cleanup(ex, &ctx).await,
        }
    })
    .await;
    finalized(result)
}

/// The agent an Executor declares; named `<namespace>/<name>` (docs/design.md §6).
pub fn agent_spec(ex: &Executor) -> Result<AgentSpec, QueueError> {
    validate_agent(NewAgent {
        name: format!("{}/{}", ex.namespace().unwrap_or_default(), ex.name_any()),
        labels: ex.spec.labels.clone(),
        annotations: ex.spec.annotations.clone(),
        work_types: ex
            .spec
            .work_types
            .iter()
            .map(|t| crate::queue::WorkType::from(*t).into())
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
        &PatchParams::apply(CONTROLLER_FIELD_MANAGER).force(),
        &Patch::Apply(&secret),
    )
    .await?;
    Ok(())
}

fn event(ex: &Executor, ctx: &Context, type_: EventType, reason: &str, note: String) {
    let e = KubeEvent {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    ctx.events.record(e, ex.object_ref(&()));
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

/// `<namespace>/<name>`: how messages name an Executor (and the name of its agent).
fn full_name(ex: &Executor) -> String {
    format!("{}/{}", ex.namespace().unwrap_or_default(), ex.name_any())
}

/// Whether the Secret of the token's name may be written by this Executor: it does not exist, or
/// this Executor owns it. Pullman never overwrites a Secret someone else put there.
fn secret_is_ours(secret: Option<&Secret>, ex: &Executor) -> bool {
    let uid = ex.uid();
    secret.is_none_or(|s| {
        s.owner_references()
            .iter()
            .any(|o| Some(&o.uid) == uid.as_ref() && o.kind == "Executor")
    })
}

async fn apply(ex: Arc<Executor>, ctx: &Context) -> Result<Action, Error> {
    let now = status::now();
    match reach(&ex, ctx).await {
        Ok(reached) => {
            write_status(&ex, &reached, &now, ctx).await?;
            Ok(reached.wake)
        }
        // A status on the very first reconcile even when it fails (the queue unreachable, say):
        // kstatus reads an object without conditions as Current.
        Err(error) if ex.status.is_none() => {
            let message = format!(
                "Executor {} is not registered yet; will retry: {error}",
                full_name(&ex)
            );
            let waiting = Reached::short(
                &ex,
                None,
                Progress::Waiting {
                    reason: "Registering",
                    message,
                },
                Action::await_change(),
            );
            if let Err(e) = write_status(&ex, &waiting, &now, ctx).await {
                tracing::debug!(error = %e, "could not write the first status");
            }
            Err(error)
        }
        Err(error) => Err(error),
    }
}

/// How far one reconcile of an Executor got: what its status says, and when to look again.
struct Reached {
    /// The agent as registered (or updated) now; `None` when it is not (yet) known.
    agent: Option<Agent>,
    /// The Secret holding the agent's token, once written.
    token_secret: Option<String>,
    progress: Progress,
    /// Replicas the Deployment asks for (`None` without `spec.deployment`).
    replicas: Option<i32>,
    wake: Action,
}

impl Reached {
    /// A reconcile that stopped before the Deployment: what it found of the agent, and the
    /// replicas as last written (unknown this time is not "none").
    fn short(ex: &Executor, agent: Option<Agent>, progress: Progress, wake: Action) -> Self {
        Self {
            agent,
            token_secret: None,
            progress,
            replicas: ex.status.as_ref().and_then(|s| s.replicas),
            wake,
        }
    }

    fn stalled(
        ex: &Executor,
        agent: Option<Agent>,
        reason: &'static str,
        message: String,
        wake: Action,
    ) -> Self {
        Self::short(ex, agent, Progress::Stalled { reason, message }, wake)
    }
}

/// The Executor's agent, token Secret and Deployment brought in line with its spec, one after
/// the other (docs/design.md §6): look up the agent and the Secret, stop at what a retry cannot
/// fix (an invalid spec, a Secret someone else owns, the agent's name taken), register or update
/// the agent, then the Deployment. Errors are the passing kind (the API server, the database).
async fn reach(ex: &Executor, ctx: &Context) -> Result<Reached, Error> {
    let ns = ex.namespace().unwrap_or_default();
    let name = full_name(ex);
    let id = ex
        .uid()
        .and_then(|u| Uuid::parse_str(&u).ok())
        .ok_or_else(|| Error::Invalid(format!("Executor {name} has no uid")))?;
    let spec = match agent_spec(ex) {
        Ok(s) => s,
        Err(e) => {
            let message = format!("Executor {name} has an invalid spec: {e}");
            let wake = Action::await_change();
            return Ok(Reached::stalled(ex, None, "InvalidSpec", message, wake));
        }
    };
    let secret_name = token_secret_name(ex);
    let secret = ctx.api::<Secret>(&ns).get_opt(&secret_name).await?;
    let registered = match ctx.queue.get_agent(id).await {
        Ok(agent) => Some(agent),
        Err(QueueError::NotFound { .. }) => None,
        Err(e) => return Err(e.into()),
    };
    if !secret_is_ours(secret.as_ref(), ex) {
        let message = format!(
            "Executor {name} cannot write its agent token: Secret {ns}/{secret_name} exists and \
             is not owned by this Executor; delete or rename that Secret."
        );
        // Unowned Secrets are not watched: look again now and then.
        let wake = Action::requeue(Duration::from_secs(30));
        return Ok(Reached::stalled(
            ex,
            registered,
            "SecretNotOwned",
            message,
            wake,
        ));
    }
    let agent = match registered {
        None => match register(ex, &spec, id, ctx).await? {
            Ok(agent) => agent,
            Err(taken) => {
                let message = format!(
                    "Executor {name} cannot register agent {}: {taken}",
                    spec.name
                );
                let wake = Action::requeue(Duration::from_secs(60));
                return Ok(Reached::stalled(ex, None, "AgentNameTaken", message, wake));
            }
        },
        Some(agent) => keep(ex, agent, &spec, secret.is_none(), ctx).await?,
    };
    let (progress, replicas) = reconcile_deployment(ex, ctx).await?;
    Ok(Reached {
        agent: Some(agent),
        token_secret: Some(secret_name),
        progress,
        replicas,
        // Changes of health are noticed within seconds by the contact watcher (contact.rs);
        // this resync refreshes lastSeenAt and activeClaims.
        wake: Action::requeue(RESYNC),
    })
}

/// Registers the Executor's agent (id = its uid) and writes its token Secret. `Ok(Err(why))`
/// when a live agent of another Executor (or of the REST API) has the name.
async fn register(
    ex: &Executor,
    spec: &AgentSpec,
    id: Uuid,
    ctx: &Context,
) -> Result<Result<Agent, String>, Error> {
    match ctx.queue.register_agent(spec, Some(id)).await {
        Ok(created) => {
            write_token(ex, &created.token, ctx).await?;
            let note = format!(
                "Agent {} registered; its token is in Secret {}.",
                spec.name,
                token_secret_name(ex)
            );
            event(ex, ctx, EventType::Normal, "Registered", note);
            Ok(Ok(created.agent))
        }
        Err(QueueError::Conflict { message, .. }) => Ok(Err(message)),
        Err(e) => Err(e.into()),
    }
}

/// Keeps a registered agent in step with the spec, and issues a new token (revoking the old
/// one) when its Secret is `missing`.
async fn keep(
    ex: &Executor,
    agent: Agent,
    spec: &AgentSpec,
    missing: bool,
    ctx: &Context,
) -> Result<Agent, Error> {
    let agent = if differs(&agent, spec) {
        ctx.queue.update_agent(agent.id, spec).await?
    } else {
        agent
    };
    if !missing {
        return Ok(agent);
    }
    let rotated = ctx.queue.rotate_agent_token(agent.id).await?;
    write_token(ex, &rotated.token, ctx).await?;
    let note = format!(
        "Secret {} was missing; issued a new token and revoked the old one.",
        token_secret_name(ex)
    );
    event(ex, ctx, EventType::Normal, "TokenRotated", note);
    Ok(rotated.agent)
}

/// Writes the status of what the reconcile `reached` when it changed.
async fn write_status(
    ex: &Executor,
    reached: &Reached,
    now: &Time,
    ctx: &Context,
) -> Result<(), Error> {
    let mut status = executor_status(
        &full_name(ex),
        reached.agent.as_ref(),
        reached.token_secret.clone(),
        &reached.progress,
        ex.status.as_ref(),
        ex.metadata.generation,
        now,
    );
    status.replicas = reached.replicas;
    if ex.status.as_ref() != Some(&status) {
        patch_status(ex, &status, ctx).await?;
    }
    Ok(())
}

async fn patch_status(ex: &Executor, status: &ExecutorStatus, ctx: &Context) -> Result<(), Error> {
    let api: Api<Executor> = ctx.api(&ex.namespace().unwrap_or_default());
    let patch = json!({"apiVersion": "pullman.dev/v1alpha1", "kind": "Executor", "status": status});
    api.patch_status(
        &ex.name_any(),
        &PatchParams::apply(CONTROLLER_FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

fn deployment_name(ex: &Executor) -> String {
    format!("{}-executor", ex.name_any())
}

/// Applies the Executor's Deployment (or deletes one it no longer declares): how far it got and
/// how many replicas the Deployment asks for (`None` without `spec.deployment`).
async fn reconcile_deployment(
    ex: &Executor,
    ctx: &Context,
) -> Result<(Progress, Option<i32>), Error> {
    let ns = ex.namespace().unwrap_or_default();
    let api: Api<Deployment> = ctx.api(&ns);
    let Some(d) = &ex.spec.deployment else {
        if api.get_opt(&deployment_name(ex)).await?.is_some() {
            api.delete(&deployment_name(ex), &DeleteParams::background())
                .await?;
        }
        return Ok((Progress::Ready, None));
    };
    let Some(server) = &ctx.config.executor_server_url else {
        let stalled = Progress::Stalled {
            reason: "DeploymentNotConfigured",
            message: format!(
                "Executor {} sets spec.deployment, but the controller was started without \
                 --executor-server-url, so it has no server address to give the executor.",
                full_name(ex)
            ),
        };
        return Ok((stalled, None));
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
    let mut deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": deployment_name(ex),
            "namespace": ns,
            "labels": labels,
            "ownerReferences": [owner],
        },
        "spec": {
            "selector": {"matchLabels": {"pullman.dev/executor": ex.name_any(), "app.kubernetes.io/name": "pullman-executor"}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": d.service_account_name,
                    // The restricted Pod Security Standard, so executors run in namespaces
                    // that enforce it (the image's user is 65532).
                    "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                    "nodeSelector": d.node_selector,
                    "tolerations": d.tolerations,
                    "containers": [{
                        "name": "executor",
                        "image": d.image,
                        "imagePullPolicy": d.image_pull_policy,
                        "args": args,
                        "volumeMounts": [{"name": "token", "mountPath": "/var/run/pullman", "readOnly": true}],
                        "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "runAsNonRoot": true, "capabilities": {"drop": ["ALL"]}},
                    }],
                    "volumes": [{"name": "token", "secret": {"secretName": token_secret_name(ex)}}],
                },
            },
        },
    });
    // `replicas` unset: the controller applies no `replicas`, so it owns none and leaves the
    // count to whoever scales the Deployment (KEDA's HPA, `kubectl scale`); the API server gives a
    // new Deployment 1. Applying a value would take the field back at each reconcile (forced
    // apply) and fight the autoscaler.
    if let Some(replicas) = d.replicas {
        deployment["spec"]["replicas"] = json!(replicas);
    }
    let applied = api
        .patch(
            &deployment_name(ex),
            &PatchParams::apply(CONTROLLER_FIELD_MANAGER).force(),
            &Patch::Apply(&deployment),
        )
        .await?;
    // The Deployment is owned, so each change of its status reconciles the Executor again.
    let progress = match deployment_waiting(&applied) {
        None => Progress::Ready,
        Some(message) => Progress::Waiting {
            reason: "DeploymentProgressing",
            message,
        },
    };
    // The API server defaults an unset count to 1, so a Deployment read back always has one.
    let replicas = applied.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    Ok((progress, Some(replicas)))
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
