//! The WorkOrder / Executor controller (docs/design.md §6, §7). It runs inside `pullman serve` when a
//! Kubernetes API is reachable; with leader election on a `coordination.k8s.io` Lease, every
//! replica serves the API while exactly one reconciles.

mod burst;
mod cache;
pub mod contact;
pub mod events;
pub mod executor_status;
mod executors;
pub mod schedulable;
pub mod status;
pub mod transition;
mod workorders;

pub use events::Events;
pub use workorders::RECONCILE_CONCURRENCY;

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use kube::runtime::events::Reporter;
use kube::runtime::finalizer;
use kube::{Api, Client, Resource};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::crd::Executor;
use crate::queue::{Notifications, Queue, QueueError};

/// Field manager of everything the controller writes (docs/design.md §1).
pub const CONTROLLER_FIELD_MANAGER: &str = "pullman-controller";
/// Finalizer that cancels a deleted WorkOrder's active order (docs/design.md §6).
pub const CANCEL_FINALIZER: &str = "pullman.dev/cancel";
/// Finalizer that retires a deleted Executor's agent (docs/design.md §6).
pub const RETIRE_FINALIZER: &str = "pullman.dev/retire";

/// Controller settings.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Reconcile only these namespaces: one name, or several separated by commas (`None`: all
    /// namespaces). See [`watched_namespaces`].
    pub namespace: Option<String>,
    /// Namespace of the leader-election Lease.
    pub lease_namespace: String,
    /// Name of the leader-election Lease.
    pub lease_name: String,
    /// This replica's identity in the Lease.
    pub identity: String,
    /// Pull-API URL given to executors the controller deploys (`spec.deployment`).
    pub executor_server_url: Option<String>,
    /// Backstop resync of every resource.
    pub resync: Duration,
}

/// What a reconcile can fail with; each variant is counted and logged, then retried.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("queue: {0}")]
    Queue(#[from] QueueError),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    /// Short label for logs and metrics: one of `telemetry::RECONCILE_ERRORS` (a new variant
    /// adds its label there).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Queue(_) => "queue",
            Error::Finalizer(_) => "finalizer",
            Error::Invalid(_) => "invalid",
        }
    }
}

/// A reconcile's result through kube-runtime's `finalizer` helper, less one outcome that is no
/// failure: the patch adding or removing the finalizer found the object gone (404). Two
/// reconciles of a deleted object race whenever a queue change and the deletion both ask for
/// one (each cancelled order notifies); the first removes the finalizer, the API server then
/// deletes the object, and the second's patch finds nothing. Nothing is left to retry, so it is
/// not logged as a failure (it was, as a warning per object, whenever a namespace went).
fn finalized(result: Result<Action, finalizer::Error<Error>>) -> Result<Action, Error> {
    use finalizer::Error as F;
    match result {
        Err(F::AddFinalizer(kube::Error::Api(s)) | F::RemoveFinalizer(kube::Error::Api(s)))
            if s.is_not_found() =>
        {
            tracing::debug!("the object was gone when its finalizer was patched; nothing to do");
            Ok(Action::await_change())
        }
        other => other.map_err(|e| Error::Finalizer(Box::new(e))),
    }
}

/// Shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub queue: Queue,
    /// Where reconciles hand their Kubernetes Events ([`events`]).
    pub events: Events,
    pub config: ControllerConfig,
}

impl Context {
    fn api<K>(&self, namespace: &str) -> Api<K>
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), namespace)
    }
}

fn scoped<K>(client: &Client, namespace: &Option<String>) -> Api<K>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The namespaces `--watch-namespace` names: `[None]` (every namespace) when unset, else each
/// comma-separated name once, in order (empty names ignored). A Kubernetes watch covers one
/// namespace or all, so several namespaces get one pair of controllers each; that is what lets
/// the Helm chart's `watchNamespaces` mode grant Roles only.
pub fn watched_namespaces(namespace: &Option<String>) -> Vec<Option<String>> {
    let Some(list) = namespace else {
        return vec![None];
    };
    let mut names: Vec<Option<String>> = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !names.iter().any(|n| n.as_deref() == Some(name)) {
            names.push(Some(name.to_string()));
        }
    }
    if names.is_empty() { vec![None] } else { names }
}

/// Runs a reconcile and records it in the controller metrics (`pullman_controller_*`): count,
/// duration, and on failure the error's `metric_label()`.
pub(crate) async fn measured(
    controller: &'static str,
    reconcile: impl std::future::Future<Output = Result<kube::runtime::controller::Action, Error>>,
) -> Result<kube::runtime::controller::Action, Error> {
    let started = std::time::Instant::now();
    let result = reconcile.await;
    crate::telemetry::controller_metrics().observe(
        controller,
        started.elapsed(),
        result.as_ref().err().map(Error::metric_label),
    );
    result
}

/// Runs both controllers, for each watched namespace, until `stop` fires.
pub async fn run_controllers(
    ctx: Arc<Context>,
    notifications: Notifications,
    stop: CancellationToken,
) {
    let namespaces = watched_namespaces(&ctx.config.namespace);
    tracing::info!(?namespaces, "controllers starting");
    // Every WorkOrder controller reads the Executors of every watched namespace: an order may
    // wait for an Executor of another one (`schedulable::ScaleUps`).
    let (caches, writers): (Vec<_>, Vec<_>) = namespaces
        .iter()
        .map(|_| kube::runtime::reflector::store::<Executor>())
        .unzip();
    let caches = schedulable::ExecutorCaches(caches);
    let runs = namespaces
        .into_iter()
        .zip(writers)
        .map(|(namespace, writer)| {
            let ctx = Arc::new(Context {
                client: ctx.client.clone(),
                queue: ctx.queue.clone(),
                events: ctx.events.clone(),
                config: ControllerConfig {
                    namespace,
                    ..ctx.config.clone()
                },
            });
            let notifications = notifications.clone();
            let stop = stop.clone();
            let executors = caches.clone();
            async move {
                tokio::join!(
                    workorders::run(ctx.clone(), notifications, executors, stop.clone()),
                    executors::run(ctx, writer, stop),
                );
            }
        });
    futures::future::join_all(runs).await;
    tracing::info!("controllers stopped");
}

/// The leader-election Lease `config.lease_namespace/lease_name` held as `config.identity`:
/// 15 s, renewed 5 s before it ends. The Lease is taken with a server-side apply that must not
/// take `holderIdentity` from another field manager, so each replica applies under its own name
/// (`pullman-controller-<identity>`): under one shared name, two replicas starting together both
/// "took" the Lease and both reconciled until the next renewal (seen on the real node).
///
/// Errors: the Lease cannot be read or created (the API server, RBAC).
pub async fn lease_manager(
    client: Client,
    config: &ControllerConfig,
) -> Result<LeaseManager, kube_lease_manager::LeaseManagerError> {
    LeaseManagerBuilder::new(client, &config.lease_name)
        .with_namespace(&config.lease_namespace)
        .with_identity(&config.identity)
        .with_duration(15)
        .with_grace(5)
        .with_field_manager(format!("{CONTROLLER_FIELD_MANAGER}-{}", config.identity))
        .build()
        .await
}

/// Campaigns for the Lease and runs the controllers while leading, until `shutdown` fires.
pub async fn run_with_leader_election(
    client: Client,
    queue: Queue,
    notifications: Notifications,
    config: ControllerConfig,
    shutdown: CancellationToken,
) {
    let events = Events::start(
        client.clone(),
        Reporter {
            controller: CONTROLLER_FIELD_MANAGER.into(),
            instance: Some(config.identity.clone()),
        },
    );
    let ctx = Arc::new(Context {
        client: client.clone(),
        queue,
        events,
        config: config.clone(),
    });
    loop {
        let manager = match lease_manager(client.clone(), &config).await {
            Ok(m) => m,
            Err(error) => {
                tracing::warn!(%error, "leader election could not start; retrying in 5 s");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(5)) => continue,
                }
            }
        };
        let (mut leading, task) = manager.watch().await;
        // Aborted if this campaign is dropped or aborted, so a replica never keeps reconciling after
        // its leader-election loop is gone.
        let mut running: Option<(CancellationToken, AbortOnDropHandle<()>)> = None;
        loop {
            let is_leader = *leading.borrow_and_update();
            match (is_leader, running.is_some()) {
                (true, false) => {
                    tracing::info!(identity = %config.identity, lease = %config.lease_name, "became leader; reconciling");
                    let stop = shutdown.child_token();
                    let handle = tokio::spawn(run_controllers(
                        ctx.clone(),
                        notifications.clone(),
                        stop.clone(),
                    ));
                    running = Some((stop, AbortOnDropHandle::new(handle)));
                }
                (false, true) => {
                    tracing::warn!(identity = %config.identity, "lost leadership; stopping reconcilers");
                    if let Some((stop, handle)) = running.take() {
                        stop.cancel();
                        let _ = handle.await;
                    }
                }
                _ => {}
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                changed = leading.changed() => if changed.is_err() { break },
            }
        }
        if let Some((stop, handle)) = running.take() {
            stop.cancel();
            let _ = handle.await;
        }
        // Closing the channel makes the manager release the Lease. An unreachable API server
        // must not hold up shutdown: the Lease then simply expires.
        drop(leading);
        let task = AbortOnDropHandle::new(task);
        match tokio::time::timeout(Duration::from_secs(5), task).await {
            Ok(Ok(Ok(_))) => {}
            Ok(Ok(Err(error))) => tracing::warn!(%error, "leader election ended with an error"),
            Ok(Err(error)) => tracing::warn!(%error, "leader election task failed"),
            Err(_) => tracing::warn!("could not release the Lease within 5 s; it will expire"),
        }
        if shutdown.is_cancelled() {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::watched_namespaces;

    #[test]
    fn a_finalizer_patch_that_finds_the_object_gone_is_done_not_failed() {
        use super::{Action, Error, finalized};
        use kube::core::response::Status;
        use kube::runtime::finalizer::Error as F;
        let api = |code: u16, reason: &str| {
            kube::Error::Api(Status::failure("x", reason).with_code(code).boxed())
        };
        assert_eq!(
            finalized(Err(F::RemoveFinalizer(api(404, "NotFound")))).unwrap(),
            Action::await_change()
        );
        assert_eq!(
            finalized(Err(F::AddFinalizer(api(404, "NotFound")))).unwrap(),
            Action::await_change()
        );
        // Anything else stays a failure, retried: a conflict, or the reconcile's own error.
        assert!(finalized(Err(F::RemoveFinalizer(api(409, "Conflict")))).is_err());
        assert!(finalized(Err(F::ApplyFailed(Error::Kube(api(404, "NotFound"))))).is_err());
        assert!(finalized(Err(F::CleanupFailed(Error::Invalid("x".into())))).is_err());
        assert_eq!(
            finalized(Ok(Action::await_change())).unwrap(),
            Action::await_change()
        );
    }

    fn some(names: &[&str]) -> Vec<Option<String>> {
        names.iter().map(|n| Some(n.to_string())).collect()
    }

    #[test]
    fn error_labels_are_all_listed() {
        use super::Error;
        let samples = [
            Error::Kube(kube::Error::Api(
                kube::core::response::Status::failure("x", "InternalError").boxed(),
            )),
            Error::Queue(crate::queue::QueueError::Database(sqlx::Error::PoolClosed)),
            Error::Finalizer("x".into()),
            Error::Invalid("x".into()),
        ];
        let labels: Vec<&str> = samples.iter().map(Error::metric_label).collect();
        assert_eq!(labels, crate::telemetry::RECONCILE_ERRORS);
    }

    #[test]
    fn unset_means_every_namespace() {
        assert_eq!(watched_namespaces(&None), vec![None]);
        assert_eq!(watched_namespaces(&Some(" , ".into())), vec![None]);
    }

    #[test]
    fn a_comma_separated_list_names_each_namespace_once() {
        assert_eq!(
            watched_namespaces(&Some("team-a, team-b,team-a,".into())),
            some(&["team-a", "team-b"])
        );
        assert_eq!(watched_namespaces(&Some("solo".into())), some(&["solo"]));
    }
}
