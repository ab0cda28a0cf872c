//! WorkOrder reconciler (docs/design.md §6): creates the queue row (id = `metadata.uid`, idempotent),
//! mirrors the row into `status`, cancels the order when the resource is deleted.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::finalizer::{Event, finalizer};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::burst::{Burst, queue_changes};
use super::schedulable::ExecutorCaches;
use super::{
    CANCEL_FINALIZER, CONTROLLER_FIELD_MANAGER, Context, Error, cache, finalized, schedulable,
    scoped, status, transition,
};
use crate::crd::{WorkOrderPhase, WorkOrderResource, WorkOrderResourceSpec, WorkOrderStatus};
use crate::queue::validate::validate_work_order_off_thread;
use crate::queue::{Lookup, Notifications, QueueError};

/// Most WorkOrder reconciles at once. A reconcile is a few requests one after the other (a
/// queue lookup, perhaps a read of the object, a status patch, an Event), so this bounds the
/// controller's in-flight writes to the API server, and the controller's throughput is this over
/// the time of one reconcile (chosen with `cargo bench --bench k8s_scale`, bench/README.md).
pub const RECONCILE_CONCURRENCY: u16 = 64;

/// How long the first reconciles wait for the Executors' first listing (see [`run`]).
const EXECUTORS_FIRST_LIST: Duration = Duration::from_secs(30);

/// Runs the WorkOrder controller until `stop` fires. `executors` are the Executor controllers'
/// caches, read for the `AwaitingScaleUp` condition (`schedulable::ScaleUps`).
pub(super) async fn run(
    ctx: Arc<Context>,
    notifications: Notifications,
    executors: ExecutorCaches,
    stop: CancellationToken,
) {
    // Before the first reconcile, so that an order waiting for an Executor at zero replicas is
    // not called unschedulable (with a Warning Event) only because the cache is still empty. A
    // cache that does not fill in time (the API server, RBAC) holds nothing else up.
    if !executors.ready_within(EXECUTORS_FIRST_LIST).await {
        tracing::warn!(
            "the Executors were not listed within {} s; WorkOrders reconcile without them, so an \
             order waiting for an Executor at zero replicas may say NoAgentConnected until they are",
            EXECUTORS_FIRST_LIST.as_secs()
        );
    }
    let api: Api<WorkOrderResource> = scoped(&ctx.client, &ctx.config.namespace);
    let cache::Watched {
        objects,
        store,
        index,
        payloads,
    } = cache::watch(api);
    let controller = Controller::for_stream(objects, store.clone())
        .with_config(controller::Config::default().concurrency(RECONCILE_CONCURRENCY));
    let changes = futures::stream::select(
        queue_changes(notifications.changed(), store.clone(), index),
        schedulable::refreshes(ctx.queue.clone(), store, executors.clone()),
    );
    controller
        .reconcile_on(changes)
        .graceful_shutdown_on(stop.cancelled_owned())
        .run(
            |o, r| super::measured("workorder", reconcile(o, r)),
            error_policy,
            Arc::new(Reconciler {
                ctx,
                burst: Burst::new(payloads),
                executors,
            }),
        )
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "WorkOrder reconcile failed");
            }
        })
        .await;
}

/// What every WorkOrder reconcile of one watch shares.
struct Reconciler {
    ctx: Arc<Context>,
    /// What keeps a burst cheap; correct to ignore, so the reconcile reads without it.
    burst: Burst,
    /// The Executors, for `schedulable::ScaleUps`.
    executors: ExecutorCaches,
}

fn error_policy(wo: Arc<WorkOrderResource>, error: &Error, _r: Arc<Reconciler>) -> Action {
    tracing::warn!(workorder = %wo.name_any(), namespace = ?wo.namespace(), kind = error.metric_label(), %error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

async fn reconcile(wo: Arc<WorkOrderResource>, r: Arc<Reconciler>) -> Result<Action, Error> {
    let ns = wo.namespace().unwrap_or_default();
    let api: Api<WorkOrderResource> = r.ctx.api(&ns);
    let result = finalizer(&api, CANCEL_FINALIZER, wo, |event| async {
        match event {
            Event::Apply(wo) => apply(wo, &r).await,
            Event::Cleanup(wo) => cleanup(wo, &r).await,
        }
    })
    .await;
    finalized(result)
}

fn uid_of(wo: &WorkOrderResource) -> Result<Uuid, Error> {
    wo.uid()
        .and_then(|u| Uuid::parse_str(&u).ok())
        .ok_or_else(|| Error::Invalid(format!("WorkOrder {} has no uid", wo.name_any())))
}

/// One WorkOrder: look up its order → queue it if unknown → compute its status (pure, in
/// `status` and `schedulable`) → write it and its Events if it changed → when to look again.
async fn apply(wo: Arc<WorkOrderResource>, r: &Reconciler) -> Result<Action, Error> {
    let ctx = &*r.ctx;
    let id = uid_of(&wo)?;
    let prev = r.burst.previous(id, wo.status.as_ref());
    let prev = prev.as_ref();
    let now = status::now();
    let found = match ctx.queue.lookup(id, false).await {
        Ok(found) => found,
        Err(e) => return Err(first_status_then(e.into(), &wo, prev, ctx, &now).await),
    };
    if let Some(hold) = r.burst.hold(&found, prev, chrono::Utc::now()) {
        return Ok(Action::requeue(hold));
    }
    let row = match found {
        Lookup::Unknown => match queue_it(&wo, id, r).await {
            Ok(Queued::Row(row)) => Ok(row),
            Ok(Queued::Refused(why)) => Err(why),
            Ok(Queued::Gone) => return Ok(Action::await_change()),
            Err(e) => return Err(first_status_then(e, &wo, prev, ctx, &now).await),
        },
        found => Ok(found),
    };
    let (wait, unsure) = match &row {
        Ok(row) => waiting_reason(id, row, ctx).await,
        Err(_) => (None, false),
    };
    let scale_ups = match &wait {
        Some(_) => schedulable::ScaleUps::of(&r.executors.state(), &now),
        None => schedulable::ScaleUps::default(),
    };
    let mut new_status = status_of(&wo, &row, wait.as_ref(), &scale_ups, prev, &now);
    if unsure {
        schedulable::keep_condition(&mut new_status, prev);
    }
    if prev != Some(&new_status) {
        write_status(&wo, prev, &new_status, ctx).await?;
        r.burst.wrote(id, new_status.clone());
    }
    let wake_after = next_wake(&wo, &new_status, ctx, &now).await?;
    let wake_after = r.burst.wake(id, wo.status.as_ref(), wake_after);
    Ok(wake_after.map_or_else(Action::await_change, Action::requeue))
}

/// The status of `wo` (pure): its queue row's (`Ok`), with why it waits if it does (`wait`), or
/// `Rejected` with the reason its spec was refused (`Err`). `prev` keeps transition times and
/// Events of conditions that did not change (docs/design.md §6).
fn status_of(
    wo: &WorkOrderResource,
    row: &Result<Lookup, String>,
    wait: Option<&crate::queue::waiting::Wait>,
    scale_ups: &schedulable::ScaleUps,
    prev: Option<&WorkOrderStatus>,
    now: &Time,
) -> WorkOrderStatus {
    let name = wo.name_any();
    let generation = wo.metadata.generation;
    match row {
        Ok(row) => {
            let mut s = status::from_queue(&name, row, prev, generation, now);
            s.conditions.extend(schedulable::condition_of(
                &name, row, wait, scale_ups, prev, generation, now,
            ));
            s
        }
        Err(why) => status::rejected(&name, why, prev, generation, now),
    }
}

/// Writes `new` as the status of `wo`, then the Events of its change from `prev`: the status
/// first, as it is what `kubectl wait` and GitOps tools read.
async fn write_status(
    wo: &WorkOrderResource,
    prev: Option<&WorkOrderStatus>,
    new: &WorkOrderStatus,
    ctx: &Context,
) -> Result<(), Error> {
    patch_status(wo, new, ctx).await?;
    let events = transition::phase_event(prev, new)
        .into_iter()
        .chain(schedulable::unschedulable_event(prev, new))
        .chain(schedulable::node_unreachable_event(prev, new));
    for event in events {
        ctx.events.record(event, wo.object_ref(&()));
    }
    Ok(())
}

/// What queueing a WorkOrder that has no queue row came to.
enum Queued {
    /// Created (or found created by an earlier attempt: the id is the WorkOrder's uid).
    Row(Lookup),
    /// The spec is one the queue refuses (`Rejected`): why, for the status.
    Refused(String),
    /// The resource is gone, or replaced by another of the same name.
    Gone,
}

/// Creates the order of `wo` (docs/design.md §6: id = `metadata.uid`, idempotent). Errors are the
/// passing kind (API server, database), to be retried.
async fn queue_it(wo: &WorkOrderResource, id: Uuid, r: &Reconciler) -> Result<Queued, Error> {
    // The cache holds no payload (see `cache`): the one the watch set aside, or else the object
    // read once.
    let spec = match r.burst.payload(id) {
        Some(yaml_content) => WorkOrderResourceSpec {
            yaml_content,
            ..wo.spec.clone()
        },
        None => match full_spec(wo, &r.ctx).await? {
            Some(spec) => spec,
            None => return Ok(Queued::Gone),
        },
    };
    let body = spec.to_create_body();
    drop(spec);
    let spec = match body {
        Err(invalid) => return Ok(Queued::Refused(invalid.message)),
        Ok(body) => match validate_work_order_off_thread(body).await {
            Ok(spec) => spec,
            Err(e) => return Ok(Queued::Refused(e.to_string())),
        },
    };
    let created = r
        .ctx
        .queue
        .create_work_order(&spec, id, crate::queue::SOURCE_KUBERNETES)
        .await;
    match created {
        Ok(row) => {
            tracing::info!(workorder = %wo.name_any(), work_order = %id, "queued");
            Ok(Queued::Row(row))
        }
        Err(e) if is_refusal(&e) => Ok(Queued::Refused(e.to_string())),
        Err(e) => Err(e.into()),
    }
}

/// Why the order `row` waits, for its `Schedulable` condition: an unclaimed order's reason, or
/// what a claimed order's agent says holds it up (`node_unreachable`, docs/design.md §12); `None`
/// for a claimed order nothing holds up. `true` beside it when the queue cannot say now: the
/// condition then stays as it was (until the next refresh, `schedulable::REFRESH_EVERY`, or the
/// claim's next change) rather than failing a reconcile that has the rest.
async fn waiting_reason(
    id: Uuid,
    row: &Lookup,
    ctx: &Context,
) -> (Option<crate::queue::waiting::Wait>, bool) {
    let read = if schedulable::waits(row) {
        ctx.queue.waits(&[id]).await.map(|mut w| w.remove(&id))
    } else if schedulable::claimed(row) {
        ctx.queue.claim_wait(id).await
    } else {
        return (None, false);
    };
    match read {
        Ok(wait) => (wait, false),
        Err(error) => {
            tracing::debug!(work_order = %id, %error, "could not tell why the order waits");
            (None, true)
        }
    }
}

/// When to reconcile a WorkOrder again, its status written (`None`: on its next change): once
/// its TTL has passed (deleting it if that is now), never when it is finished, else at the
/// next resync.
async fn next_wake(
    wo: &WorkOrderResource,
    new_status: &WorkOrderStatus,
    ctx: &Context,
    now: &Time,
) -> Result<Option<Duration>, Error> {
    if let Some(at) = status::delete_at(wo.spec.ttl_seconds_after_finished, new_status) {
        let left = at.duration_since(now.0);
        if left.is_positive() {
            // Wake up when the TTL ends (a whole second later, so the deadline has surely passed).
            return Ok(Some(Duration::from_secs(left.as_secs().unsigned_abs() + 1)));
        }
        delete_expired(wo, ctx).await?;
        return Ok(None);
    }
    let finished = matches!(
        new_status.phase,
        Some(WorkOrderPhase::Succeeded | WorkOrderPhase::Failed | WorkOrderPhase::Cancelled)
    );
    Ok((!finished).then_some(ctx.config.resync))
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

/// A WorkOrder that has no status yet (`prev`: none cached, none written) gets the
/// not-yet-queued one before `error` is retried, so no tool reads it as done meanwhile
/// (docs/design.md §6: a status on the very first reconcile).
async fn first_status_then(
    error: Error,
    wo: &WorkOrderResource,
    prev: Option<&WorkOrderStatus>,
    ctx: &Context,
    now: &Time,
) -> Error {
    if prev.is_none() {
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

async fn cleanup(wo: Arc<WorkOrderResource>, r: &Reconciler) -> Result<Action, Error> {
    let ctx = &*r.ctx;
    let id = uid_of(&wo)?;
    r.burst.forget(id);
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
