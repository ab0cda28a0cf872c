//! WorkOrder reconciler (docs/design.md §6): creates the queue row (id = `metadata.uid`, idempotent),
//! mirrors the row into `status`, cancels the order when the resource is deleted.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::finalizer::{Event, finalizer};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::written::Written;
use super::{
    CANCEL_FINALIZER, CONTROLLER_FIELD_MANAGER, Context, Error, cache, finalized, schedulable,
    scoped, status, transition,
};
use crate::crd::{WorkOrderPhase, WorkOrderResource, WorkOrderResourceSpec, WorkOrderStatus};
use crate::queue::validate::validate_work_order_off_thread;
use crate::queue::{Lookup, Notifications, OrderStatus, QueueError};

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
        schedulable::refreshes(ctx.queue.clone(), store),
    );
    controller
        .reconcile_on(changes)
        .graceful_shutdown_on(stop.cancelled_owned())
        .run(
            |o, r| super::measured("workorder", reconcile(o, r)),
            error_policy,
            Arc::new(Reconciler {
                ctx,
                payloads,
                written: Written::default(),
            }),
        )
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "WorkOrder reconcile failed");
            }
        })
        .await;
}

/// Queue changes that arrive within this long of the first are requested as one reconcile per
/// WorkOrder: an order claimed and finished within it (a ConfigMap order takes milliseconds) gets
/// one status write and one Event instead of two of each, which under a burst is a fifth of the
/// controller's requests to the API server (issue #16). It is also the most a queue change
/// waits before its reconcile is requested.
pub const CHANGE_WINDOW: Duration = Duration::from_millis(100);

/// How long to hold back the status of a claim younger than [`CHANGE_WINDOW`], if at all: the
/// order is likely to finish within it, and then one status write and one Event say both. The
/// queue-change window alone folds them only when the claim's notification starts the
/// reconcile; a reconcile started otherwise (the watch event of the controller's own `Pending`
/// write, typically) would see the claim a few milliseconds old and write it on its own. At 30
/// orders/s that was 0.7 status writes and 0.7 Events per order (issue #16). Never on the first
/// reconcile (`prev` is `None`: a status then, docs/design.md §6). `claimed_at` is the database's
/// clock and `now` this process's: only an age in `[0, window)` on this clock holds, so all holds
/// of one claim end within one window of this clock; a claim that looks younger than zero (the
/// database's clock ahead) is written at once, as before the hold.
fn claim_settling(
    found: &Lookup,
    prev: Option<&WorkOrderStatus>,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<Duration> {
    let Lookup::Active(order) = found else {
        return None;
    };
    let claimed_at = order
        .claimed_at
        .filter(|_| order.status == OrderStatus::Claimed)?;
    if prev?.phase == Some(WorkOrderPhase::Claimed) {
        return None;
    }
    let age = (now - claimed_at).to_std().ok()?;
    CHANGE_WINDOW
        .checked_sub(age)
        .filter(|left| !left.is_zero())
}

/// The WorkOrders to reconcile for queue changes (LISTEN/NOTIFY), gathered over
/// [`CHANGE_WINDOW`]: each changed id mapped to its resource through the uid index (O(1)), each
/// resource once per window; a lost notification stream (`None`, or this receiver lagging)
/// resyncs everything in the cache.
fn queue_changes(
    rx: broadcast::Receiver<Option<Uuid>>,
    store: Store<WorkOrderResource>,
    index: cache::UidIndex,
) -> impl futures::Stream<Item = ObjectRef<WorkOrderResource>> {
    futures::stream::unfold(rx, move |mut rx| {
        let store = store.clone();
        let index = index.clone();
        async move {
            let mut ids: HashSet<Uuid> = HashSet::new();
            let mut everything = false;
            let mut next = rx.recv().await;
            let window_ends = tokio::time::Instant::now() + CHANGE_WINDOW;
            loop {
                match next {
                    Ok(Some(id)) => {
                        ids.insert(id);
                    }
                    Ok(None) | Err(RecvError::Lagged(_)) => everything = true,
                    Err(RecvError::Closed) if ids.is_empty() && !everything => return None,
                    Err(RecvError::Closed) => break,
                }
                match tokio::time::timeout_at(window_ends, rx.recv()).await {
                    Ok(received) => next = received,
                    Err(_) => break,
                }
            }
            let refs: Vec<ObjectRef<WorkOrderResource>> = if everything {
                store
                    .state()
                    .iter()
                    .map(|o| ObjectRef::from_obj(o.as_ref()))
                    .collect()
            } else {
                ids.into_iter().filter_map(|id| index.get(id)).collect()
            };
            Some((futures::stream::iter(refs), rx))
        }
    })
    .flatten()
}

/// What every WorkOrder reconcile of one watch shares.
struct Reconciler {
    ctx: Arc<Context>,
    /// Payloads of WorkOrders waiting to be queued, set aside by the watch.
    payloads: cache::Payloads,
    /// Statuses written that the cache may not show yet.
    written: Written,
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
    let name = wo.name_any();
    // The status last written when the cache lags behind it (`written`): compared against the
    // cached one, it would be written again, with a second Event.
    let prev = r.written.previous(id, wo.status.as_ref());
    let prev = prev.as_ref();
    let now = status::now();
    let generation = wo.metadata.generation;
    let found = match ctx.queue.lookup(id, false).await {
        Ok(found) => found,
        Err(e) => return Err(first_status_then(e.into(), &wo, prev, ctx, &now).await),
    };
    if let Some(hold) = claim_settling(&found, prev, chrono::Utc::now()) {
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
    let new_status = match &row {
        Ok(row) => {
            let wait = waiting_reason(id, row, ctx).await;
            let mut s = status::from_queue(&name, row, prev, generation, &now);
            s.conditions.extend(schedulable::condition_of(
                &name,
                row,
                wait.as_ref(),
                prev,
                generation,
                &now,
            ));
            s
        }
        Err(why) => status::rejected(&name, why, prev, generation, &now),
    };
    if prev != Some(&new_status) {
        // The status first: it is what `kubectl wait` and GitOps tools read; the Events follow.
        patch_status(&wo, &new_status, ctx).await?;
        let events = transition::phase_event(prev, &new_status)
            .into_iter()
            .chain(schedulable::unschedulable_event(prev, &new_status));
        for event in events {
            ctx.events.record(event, wo.object_ref(&()));
        }
        r.written.record(id, new_status.clone());
    }
    let wake_after = next_wake(&wo, &new_status, ctx, &now).await?;
    // Took its own write over the cache: look again once that stops, in case the cache's
    // differing status is someone else's newer one.
    let wake_after = match (wake_after, r.written.recheck_in(id, wo.status.as_ref())) {
        (Some(after), Some(recheck)) => Some(after.min(recheck)),
        (after, recheck) => after.or(recheck),
    };
    Ok(wake_after.map_or_else(Action::await_change, Action::requeue))
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
    let spec = match r.payloads.take(id) {
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

/// Why the unclaimed order `row` waits, for its `Schedulable` condition; `None` for a claimed
/// order, or when the queue cannot say now (the condition then stays as it was until the next
/// refresh, `schedulable::REFRESH_EVERY`, rather than failing a reconcile that has the rest).
async fn waiting_reason(
    id: Uuid,
    row: &Lookup,
    ctx: &Context,
) -> Option<crate::queue::waiting::Wait> {
    if !schedulable::waits(row) {
        return None;
    }
    match ctx.queue.waits(&[id]).await {
        Ok(mut waits) => waits.remove(&id),
        Err(error) => {
            tracing::debug!(work_order = %id, %error, "could not tell why the order waits");
            None
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
    r.written.forget(id);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn order(status: OrderStatus, claimed_ms_ago: Option<i64>) -> Lookup {
        let mut o = status::tests::active(status);
        o.claimed_at =
            claimed_ms_ago.map(|ms| chrono::Utc::now() - chrono::Duration::milliseconds(ms));
        Lookup::Active(Box::new(o))
    }

    fn phase(p: WorkOrderPhase) -> WorkOrderStatus {
        WorkOrderStatus {
            phase: Some(p),
            ..Default::default()
        }
    }

    #[test]
    fn a_young_claim_waits_out_the_window_once_a_status_exists() {
        let pending = phase(WorkOrderPhase::Pending);
        let now = chrono::Utc::now();
        let young = order(OrderStatus::Claimed, Some(10));
        let hold = claim_settling(&young, Some(&pending), now).expect("held back");
        assert!(hold > Duration::ZERO && hold <= CHANGE_WINDOW, "{hold:?}");
        // The first reconcile writes a status whatever the queue says.
        assert_eq!(claim_settling(&young, None, now), None);
        // Claimed already written: nothing to fold.
        let claimed = phase(WorkOrderPhase::Claimed);
        assert_eq!(claim_settling(&young, Some(&claimed), now), None);
        // Older than the window: written now.
        let old = order(OrderStatus::Claimed, Some(250));
        assert_eq!(claim_settling(&old, Some(&pending), now), None);
        // A claimed_at ahead of this clock is not held at all: holding it would start the
        // window anew on every reconcile until this clock caught up.
        let ahead = order(OrderStatus::Claimed, Some(-5_000));
        assert_eq!(claim_settling(&ahead, Some(&pending), now), None);
        // Not a claim: nothing held.
        let waiting = order(OrderStatus::Pending, None);
        assert_eq!(claim_settling(&waiting, Some(&pending), now), None);
        assert_eq!(claim_settling(&Lookup::Unknown, Some(&pending), now), None);
    }
}
