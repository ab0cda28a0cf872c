//! WorkOrder reconciler (DESIGN.md §6): creates the queue row (id = `metadata.uid`, idempotent),
//! mirrors the row into `status`, cancels the order when the resource is deleted.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType};
use kube::runtime::finalizer::{Event, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{CANCEL_FINALIZER, CONTROLLER_FIELD_MANAGER, Context, Error, cache, scoped, status};
use crate::crd::{WorkOrderPhase, WorkOrderResource, WorkOrderResourceSpec, WorkOrderStatus};
use crate::queue::validate::validate_work_order_off_thread;
use crate::queue::{Lookup, Notifications, QueueError};

/// Most WorkOrder reconciles at once. Each one makes at most a queue lookup, a read of the
/// object, a status patch and an Event, one after the other, so this bounds the controller's
/// in-flight writes to the API server under a burst (a thousand orders finishing at once);
/// requests for an object already waiting are coalesced by the scheduler, so a burst costs one
/// reconcile per object, not one per queue change (#16). Throughput is this over the time of one
/// reconcile: with the API server answering in 200–400 ms (the loaded test control plane,
/// bench/README.md) 16 capped the controller near 10 new orders/s, hence 64.
pub const RECONCILE_CONCURRENCY: u16 = 64;

pub(super) async fn run(ctx: Arc<Context>, notifications: Notifications, stop: CancellationToken) {
    let api: Api<WorkOrderResource> = scoped(&ctx.client, &ctx.config.namespace);
    let (objects, store, index) = cache::watch(api);
    let controller = Controller::for_stream(objects, store.clone())
        .with_config(controller::Config::default().concurrency(RECONCILE_CONCURRENCY));
    // Queue changes (LISTEN/NOTIFY) are mapped to the resource with that uid through the uid
    // index (O(1) each); a lost notification stream (None) resyncs everything.
    let changes = futures::stream::unfold(notifications.changed(), move |mut rx| {
        let store = store.clone();
        let index = index.clone();
        async move {
            let refs: Vec<ObjectRef<WorkOrderResource>> = match rx.recv().await {
                Ok(Some(id)) => index.get(id).into_iter().collect(),
                Ok(None) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => store
                    .state()
                    .iter()
                    .map(|o| ObjectRef::from_obj(o.as_ref()))
                    .collect(),
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            };
            Some((futures::stream::iter(refs), rx))
        }
    })
    .flatten();
    controller
        .reconcile_on(changes)
        .graceful_shutdown_on(stop.cancelled_owned())
        .run(
            |o, c| super::measured("workorder", reconcile(o, c)),
            error_policy,
            ctx,
        )
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "WorkOrder reconcile failed");
            }
        })
        .await;
}

fn error_policy(wo: Arc<WorkOrderResource>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(workorder = %wo.name_any(), namespace = ?wo.namespace(), kind = error.metric_label(), %error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

async fn reconcile(wo: Arc<WorkOrderResource>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = wo.namespace().unwrap_or_default();
    let api: Api<WorkOrderResource> = ctx.api(&ns);
    finalizer(&api, CANCEL_FINALIZER, wo, |event| async {
        match event {
            Event::Apply(wo) => apply(wo, &ctx).await,
            Event::Cleanup(wo) => cleanup(wo, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

fn uid_of(wo: &WorkOrderResource) -> Result<Uuid, Error> {
    wo.uid()
        .and_then(|u| Uuid::parse_str(&u).ok())
        .ok_or_else(|| Error::Invalid(format!("WorkOrder {} has no uid", wo.name_any())))
}

async fn apply(wo: Arc<WorkOrderResource>, ctx: &Context) -> Result<Action, Error> {
    let id = uid_of(&wo)?;
    let name = wo.name_any();
    let prev = wo.status.as_ref();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let generation = wo.metadata.generation;
    let found = match ctx.queue.lookup(id, false).await {
        Ok(found) => found,
        Err(e) => return Err(first_status_then(e.into(), &wo, ctx, &now).await),
    };
    let new_status = match found {
        Lookup::Unknown => {
            // The cache holds no payload (see `cache`): read the object once to queue it.
            let Some(spec) = full_spec(&wo, ctx).await? else {
                return Ok(Action::await_change());
            };
            let body = spec.to_create_body();
            drop(spec);
            let checked = match body {
                Err(invalid) => Err(invalid.message),
                Ok(body) => validate_work_order_off_thread(body)
                    .await
                    .map_err(|e| e.to_string()),
            };
            match checked {
                Err(why) => status::rejected(&name, &why, prev, generation, &now),
                Ok(spec) => {
                    match ctx
                        .queue
                        .create_work_order(&spec, id, crate::queue::SOURCE_KUBERNETES)
                        .await
                    {
                        Ok(created) => {
                            tracing::info!(workorder = %name, work_order = %id, "queued");
                            status::from_queue(&name, &created, prev, generation, &now)
                        }
                        Err(e) if is_refusal(&e) => {
                            status::rejected(&name, &e.to_string(), prev, generation, &now)
                        }
                        Err(e) => return Err(first_status_then(e.into(), &wo, ctx, &now).await),
                    }
                }
            }
        }
        found => status::from_queue(&name, &found, prev, generation, &now),
    };
    if prev != Some(&new_status) {
        // The status first: it is what `kubectl wait` and GitOps tools read; the Event follows.
        patch_status(&wo, &new_status, ctx).await?;
        publish_transition(&wo, prev, &new_status, ctx).await;
    }
    if let Some(at) = status::delete_at(wo.spec.ttl_seconds_after_finished, &new_status) {
        let left = at.duration_since(now.0);
        if left.is_positive() {
            // Wake up when the TTL ends (a whole second later, so the deadline has surely passed).
            return Ok(Action::requeue(Duration::from_secs(
                left.as_secs().unsigned_abs() + 1,
            )));
        }
        delete_expired(&wo, ctx).await?;
        return Ok(Action::await_change());
    }
    let finished = matches!(
        new_status.phase,
        Some(WorkOrderPhase::Succeeded | WorkOrderPhase::Failed | WorkOrderPhase::Cancelled)
    );
    Ok(if finished {
        Action::await_change()
    } else {
        Action::requeue(ctx.config.resync)
    })
}

/// The whole spec of `wo`, `yamlContent` included, read from the API server; `None` when the
/// resource is gone or was replaced by a new one of the same name (another uid).
async fn full_spec(
    wo: &WorkOrderResource,
    ctx: &Context,
) -> Result<Option<WorkOrderResourceSpec>, Error> {
    let api: Api<WorkOrderResource> = ctx.api(&wo.namespace().unwrap_or_default());
    match api.get_opt(&wo.name_any()).await? {
        Some(current) if current.metadata.uid == wo.metadata.uid => Ok(Some(current.spec)),
        _ => Ok(None),
    }
}

/// Errors from the queue that are a verdict on the spec, not a passing failure: the order is
/// `Rejected` instead of retried forever.
fn is_refusal(e: &QueueError) -> bool {
    matches!(
        e,
        QueueError::Invalid { .. }
            | QueueError::UnknownWorkType { .. }
            | QueueError::TooLarge { .. }
    )
}

/// A WorkOrder that has no status yet gets the not-yet-queued one before `error` is retried, so
/// no tool reads it as done meanwhile (DESIGN.md §6: a status on the very first reconcile).
async fn first_status_then(
    error: Error,
    wo: &WorkOrderResource,
    ctx: &Context,
    now: &Time,
) -> Error {
    if wo.status.is_none() {
        let why = error.to_string();
        let s = status::not_queued(
            &wo.name_any(),
            Some(&why),
            None,
            wo.metadata.generation,
            now,
        );
        if let Err(e) = patch_status(wo, &s, ctx).await {
            tracing::debug!(error = %e, "could not write the not-yet-queued status");
        }
    }
    error
}

async fn patch_status(
    wo: &WorkOrderResource,
    status: &WorkOrderStatus,
    ctx: &Context,
) -> Result<(), Error> {
    let api: Api<WorkOrderResource> = ctx.api(&wo.namespace().unwrap_or_default());
    let patch = json!({
        "apiVersion": "pullman.dev/v1alpha1",
        "kind": "WorkOrder",
        "status": status,
    });
    api.patch_status(
        &wo.name_any(),
        &PatchParams::apply(CONTROLLER_FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

/// Deletes a WorkOrder whose `ttlSecondsAfterFinished` has passed. The uid precondition keeps a
/// new WorkOrder of the same name safe; the finalizer then finds the order already in the log,
/// which keeps its record.
async fn delete_expired(wo: &WorkOrderResource, ctx: &Context) -> Result<(), Error> {
    let api: Api<WorkOrderResource> = ctx.api(&wo.namespace().unwrap_or_default());
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: wo.uid(),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match api.delete(&wo.name_any(), &params).await {
        Ok(_) => {
            tracing::info!(workorder = %wo.name_any(), "deleted: ttlSecondsAfterFinished passed");
            Ok(())
        }
        // Already gone, or replaced by a new WorkOrder of that name.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Records an Event on the resource when its phase changes (claims, completions, failures).
async fn publish_transition(
    wo: &WorkOrderResource,
    prev: Option<&WorkOrderStatus>,
    new: &WorkOrderStatus,
    ctx: &Context,
) {
    let old_phase = prev.and_then(|p| p.phase);
    if old_phase == new.phase {
        return;
    }
    let rejected = new.conditions.iter().any(|c| c.reason == status::REJECTED);
    let (type_, reason, note) = match new.phase {
        Some(WorkOrderPhase::Claimed) => (
            EventType::Normal,
            "Claimed",
            format!(
                "claimed by agent {}",
                new.claimed_by.as_deref().unwrap_or("?")
            ),
        ),
        Some(WorkOrderPhase::RetryPending) => (
            EventType::Warning,
            "AttemptFailed",
            format!(
                "attempt {} failed: {}; retry after {}",
                new.retry_count.unwrap_or(0),
                new.last_error.as_deref().unwrap_or(""),
                new.next_retry_after.as_deref().unwrap_or("?")
            ),
        ),
        Some(WorkOrderPhase::Succeeded) => (
            EventType::Normal,
            "Succeeded",
            new.message.clone().unwrap_or_default(),
        ),
        Some(WorkOrderPhase::Failed) if rejected => (
            EventType::Warning,
            "Rejected",
            new.message.clone().unwrap_or_default(),
        ),
        Some(WorkOrderPhase::Failed) => (
            EventType::Warning,
            "Failed",
            new.message.clone().unwrap_or_default(),
        ),
        Some(WorkOrderPhase::Cancelled) => (
            EventType::Normal,
            "Cancelled",
            new.message.clone().unwrap_or_default(),
        ),
        Some(WorkOrderPhase::Pending) if old_phase.is_none() => (
            EventType::Normal,
            "Queued",
            format!(
                "queued as work order {}",
                new.work_order_id.as_deref().unwrap_or("")
            ),
        ),
        Some(WorkOrderPhase::Pending) => (
            EventType::Normal,
            "Requeued",
            "the claim was released; waiting for an agent".to_string(),
        ),
        None => return,
    };
    let note: String = note.chars().take(1000).collect();
    let event = KubeEvent {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(error) = ctx.recorder.publish(&event, &wo.object_ref(&())).await {
        tracing::debug!(%error, "could not record an event");
    }
}

async fn cleanup(wo: Arc<WorkOrderResource>, ctx: &Context) -> Result<Action, Error> {
    let id = uid_of(&wo)?;
    match ctx
        .queue
        .cancel_work_order(id, "the WorkOrder resource was deleted")
        .await
    {
        Ok(_) => {
            tracing::info!(workorder = %wo.name_any(), work_order = %id, "cancelled: resource deleted")
        }
        Err(QueueError::NotFound { .. } | QueueError::Conflict { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}
