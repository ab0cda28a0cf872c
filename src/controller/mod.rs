//! The WorkOrder / Executor controller (DESIGN.md §6, §7). It runs inside `pullman serve` when a
//! Kubernetes API is reachable; with leader election on a `coordination.k8s.io` Lease, every
//! replica serves the API while exactly one reconciles.

pub mod contact;
pub mod executor_status;
mod executors;
pub mod status;
mod workorders;

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::events::{Recorder, Reporter};
use kube::{Api, Client, Resource};
use kube_lease_manager::LeaseManagerBuilder;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::queue::{Notifications, Queue, QueueError};

/// Field manager of everything the controller writes (DESIGN.md §1).
pub const FIELD_MANAGER: &str = "pullman-controller";
/// Finalizer that cancels a deleted WorkOrder's active order (DESIGN.md §6).
pub const CANCEL_FINALIZER: &str = "pullman.dev/cancel";
/// Finalizer that retires a deleted Executor's agent (DESIGN.md §6).
pub const RETIRE_FINALIZER: &str = "pullman.dev/retire";

/// Controller settings.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Reconcile only this namespace (`None`: all namespaces).
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
    /// Short label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Queue(_) => "queue",
            Error::Finalizer(_) => "finalizer",
            Error::Invalid(_) => "invalid",
        }
    }
}

/// Shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub queue: Queue,
    pub recorder: Recorder,
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

/// Runs both controllers until `stop` fires.
pub async fn run_controllers(
    ctx: Arc<Context>,
    notifications: Notifications,
    stop: CancellationToken,
) {
    tracing::info!(namespace = ?ctx.config.namespace, "controllers starting");
    tokio::join!(
        workorders::run(ctx.clone(), notifications, stop.clone()),
        executors::run(ctx.clone(), stop.clone()),
    );
    tracing::info!("controllers stopped");
}

/// Campaigns for the Lease and runs the controllers while leading, until `shutdown` fires.
pub async fn run_with_leader_election(
    client: Client,
    queue: Queue,
    notifications: Notifications,
    config: ControllerConfig,
    shutdown: CancellationToken,
) {
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(config.identity.clone()),
        },
    );
    let ctx = Arc::new(Context {
        client: client.clone(),
        queue,
        recorder,
        config: config.clone(),
    });
    loop {
        let manager = LeaseManagerBuilder::new(client.clone(), &config.lease_name)
            .with_namespace(&config.lease_namespace)
            .with_identity(&config.identity)
            .with_duration(15)
            .with_grace(5)
            .with_field_manager(FIELD_MANAGER)
            .build()
            .await;
        let manager = match manager {
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
