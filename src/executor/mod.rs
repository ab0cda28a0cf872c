//! `pullman executor`: the in-cluster agent (docs/design.md §4). It claims work orders over the pull
//! API and carries them out in its cluster: `custom` orders are applied with server-side apply and
//! their Jobs watched to a verdict; `build` orders apply a Shipwright Build and watch a BuildRun.
//! Everything happens within the watch budget derived from the claim timeout.
//!
//! - [`crate::pull::order`]: the life of one order (claimed → applying → watching → reporting, or
//!   abandoned); the executor supplies the applying and watching steps ([`KubeCarrier`]).
//! - `apply`: server-side apply with cached discovery; `plan`: what one order applies and
//!   then waits on; `watch`: one shared watch per kind and namespace that every order waits on;
//!   `podwatch`: one shared watch of pods per namespace and pod label that every order's log
//!   follower subscribes to;
//!   `verdict`: what a watched object says; [`disruption`]: whether a pod may still run on a node
//!   that does not report, so its Job's verdict must wait (docs/design.md §12), with `nodewatch`,
//!   the one watch of Nodes, and `held`, a Job's wait that holds such verdicts;
//!   `disrupted`: whether a failed Job's attempt was ended by a disruption; `pods`: which
//!   containers of a failed Job exited with what code; `cleanup`: deleting what a cancelled order created; [`logs`]: the logs of the
//!   order's pods sent as its output (docs/design.md §9).

mod apply;
mod build;
mod cleanup;
pub mod container_log;
mod disrupted;
pub mod disruption;
mod held;
pub mod logs;
mod nodewatch;
mod plan;
mod pods;
mod podwatch;
mod verdict;
mod watch;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use kube::Client;
use tokio_util::sync::CancellationToken;

pub use apply::{Applied, Applier, EXECUTOR_FIELD_MANAGER, WORK_ORDER_LABEL, apply_rank};
pub use build::{BUILD_WINDOW, buildrun_name};
use nodewatch::NodeWatch;
pub use plan::Plan;
pub use podwatch::{PodSubscription, PodWatches, keep_pod_fields};
pub use verdict::{ObjectVerdict, buildrun_verdict, job_verdict, keep_verdict_fields};
pub use watch::{WatchEnd, Watches};

use crate::pull::output::{FLUSH_TIMEOUT, OutputConfig, OutputSender, Redactor};
use crate::pull::{self, Carrier, ConnectError, LoopConfig, Progress, Shutdown, Verdict};
use crate::queue::limits;
use crate::wire::WorkOrder;

/// What `pullman executor --help` says after the flags.
pub const EXECUTOR_HELP: &str = "\
Claims work orders with a lease, applies their objects with server-side apply (field manager
pullman-executor) and watches Jobs and Shipwright BuildRuns to a verdict within the watch
budget (claim timeout minus max(10 %, 60 s)). One shared watch per kind and namespace serves
every running order, and one shared watch of pods per namespace every order's log output. Uses the in-cluster service account, or KUBECONFIG outside a cluster.
While the server is unreachable it retries with backoff (0.5 s doubling to 30 s). A refused
token (agent retired, token revoked) ends it with exit code 1. SIGTERM: stop claiming, finish
running orders for at most --drain-seconds; then, or at a second signal, abandon them to the
reaper, which hands each out again when its lease ends (the Jobs it applied keep running, and the
next executor to claim the order watches them again).";

/// Run work orders in this cluster (see [`EXECUTOR_HELP`]).
#[derive(Debug, Clone, Args)]
#[command(after_long_help = EXECUTOR_HELP)]
pub struct ExecutorArgs {
    /// Pullman server URL, scheme, host and port, e.g. http://pullman.pullman-system:8080.
    #[arg(long, env = "PULLMAN_SERVER", value_parser = crate::client::parse_server_url)]
    pub server: String,
    /// File holding this executor's agent token (the Executor's Secret, key `token`).
    #[arg(long, env = "PULLMAN_TOKEN_FILE")]
    pub token_file: PathBuf,
    /// Namespace for namespaced objects that name none. Default: the pod's namespace, else
    /// `default`.
    #[arg(long, env = "PULLMAN_TARGET_NAMESPACE")]
    pub target_namespace: Option<String>,
    /// Orders carried out at once (1-1024). Connections to the Kubernetes API do not grow with
    /// it: every order waits on one shared watch per kind, and its pods' logs are found through
    /// one shared watch of pods.
    #[arg(long, env = "PULLMAN_CONCURRENCY", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub concurrency: u32,
    /// Lease requested on each claim, in seconds (5-86400); a heartbeat goes out every third
    /// of it.
    #[arg(long, env = "PULLMAN_LEASE_SECONDS", default_value_t = limits::AGENT_LEASE_SECONDS as u32,
          value_parser = clap::value_parser!(u32).range(limits::LEASE_SECONDS.min..=limits::LEASE_SECONDS.max))]
    pub lease_seconds: u32,
    /// Seconds running orders get to finish after the first SIGTERM before they are abandoned to
    /// the reaper (0-86400). Keep it below the pod's terminationGracePeriodSeconds (Kubernetes'
    /// default is 30), so the executor exits on its own rather than by SIGKILL.
    #[arg(long, env = "PULLMAN_DRAIN_SECONDS", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(0..=86400))]
    pub drain_seconds: u32,
}

/// `pullman executor`.
pub async fn run(args: ExecutorArgs) -> anyhow::Result<()> {
    let shutdown = Shutdown::on_signals();
    abandon_after_drain(&shutdown, Duration::from_secs(args.drain_seconds.into()));
    let (api, agent_id) =
        match pull::connect_as_agent(&args.server, &args.token_file, &shutdown.drain, None).await {
            Ok(c) => c,
            Err(ConnectError::Stopped) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
    let kube = Client::try_default()
        .await
        .context("connecting to Kubernetes (in-cluster config or KUBECONFIG)")?;
    let namespace = args.target_namespace.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "default".into())
    });
    tracing::info!(target_namespace = %namespace, concurrency = args.concurrency, "executor starting");
    let output = OutputConfig {
        client: api.clone(),
        agent_id,
        buffer_bytes: pull::output::DEFAULT_BUFFER_BYTES,
        redactor: Redactor::new([api.token().to_string()]),
    };
    let carrier = Arc::new(KubeCarrier::new(kube, namespace).with_output(output));
    let config = LoopConfig {
        agent_id,
        work_types: vec![],
        lease_seconds: args.lease_seconds,
        concurrency: args.concurrency as usize,
        max_wait_seconds: limits::MAX_WAIT_SECONDS,
        heartbeat_every: None,
    };
    pull::run(api, config, carrier, shutdown).await?;
    tracing::info!("executor stopped");
    Ok(())
}

/// How long the output already read may take to go out when an order is stopped rather than
/// finished (its claim abandoned or cancelled).
const STOPPED_FLUSH: Duration = Duration::from_secs(1);

/// Bounds the drain: a pod's SIGTERM is followed by SIGKILL after its grace period, and an order
/// still running then would stay claimed, unreported, until its lease ends anyway. Abandoning it
/// first lets the executor stop cleanly and says so in its log.
fn abandon_after_drain(shutdown: &Shutdown, limit: Duration) {
    let s = shutdown.clone();
    tokio::spawn(async move {
        s.drain.cancelled().await;
        tokio::select! {
            _ = s.abandon.cancelled() => {}
            _ = tokio::time::sleep(limit) => {
                tracing::warn!(
                    drain_seconds = limit.as_secs(),
                    "running orders did not finish within the drain time; abandoning them to the \
                     reaper, which hands them out again when their lease ends"
                );
                s.abandon.cancel();
            }
        }
    });
}

/// Carries orders out in a cluster: applying is [`Plan::apply`], watching is [`Plan::watch`].
pub struct KubeCarrier {
    applier: Applier,
    watches: Watches,
    pod_watches: PodWatches,
    nodes: NodeWatch,
    /// Where the pods' logs go; `None`: nowhere.
    output: Option<OutputConfig>,
}

impl KubeCarrier {
    pub fn new(client: Client, target_namespace: String) -> Self {
        KubeCarrier {
            watches: Watches::new(client.clone()),
            pod_watches: PodWatches::new(client.clone()),
            nodes: NodeWatch::new(client.clone()),
            applier: Applier::new(client, target_namespace),
            output: None,
        }
    }

    /// Sends the logs of each order's pods as its output (docs/design.md §9).
    pub fn with_output(mut self, output: OutputConfig) -> Self {
        self.output = Some(output);
        self
    }

    /// Starts following the pods of what `plan` watches: the sender, and one follower per Job or
    /// BuildRun (by their pods' label), each subscribed to the shared pod watch.
    fn follow_logs(
        &self,
        order: &WorkOrder,
        plan: &Plan,
    ) -> Option<(OutputSender, Vec<logs::PodLogs>)> {
        let config = self.output.as_ref()?;
        let claim = order.claim_id?;
        let targets: Vec<(&Applied, &str)> = match plan {
            Plan::Jobs(plan) => plan
                .jobs
                .iter()
                .map(|j| (j, logs::JOB_NAME_LABEL))
                .collect(),
            Plan::BuildRun(build) => vec![(&build.run, logs::BUILDRUN_LABEL)],
        };
        // Nothing runs in a pod (only objects applied): no output, and no request to resume it.
        if targets.is_empty() {
            return None;
        }
        let resume = logs::read_resume_points(config.client.clone(), order);
        let sender = OutputSender::start(config, order.id, claim, 0);
        let followers = targets
            .into_iter()
            .filter_map(|(object, label)| {
                let ns = object.namespace.as_deref()?;
                Some(logs::PodLogs::follow(
                    &self.pod_watches,
                    self.watches.client().clone(),
                    ns,
                    (label, &object.name),
                    sender.handle(),
                    resume.clone(),
                ))
            })
            .collect();
        Some((sender, followers))
    }

    /// The shared watches (one per kind and namespace waited on so far).
    pub fn watches(&self) -> &Watches {
        &self.watches
    }

    /// The shared pod watches (one per namespace and pod label whose logs were followed so far).
    pub fn pod_watches(&self) -> &PodWatches {
        &self.pod_watches
    }
}

impl Carrier for KubeCarrier {
    type Started = Plan;

    async fn start(&self, order: &WorkOrder, stop: &CancellationToken) -> Result<Plan, Verdict> {
        Plan::apply(&self.applier, order, stop).await
    }

    async fn finish(
        &self,
        order: &WorkOrder,
        plan: Plan,
        stop: &CancellationToken,
        progress: &Progress,
    ) -> Verdict {
        let following = self.follow_logs(order, &plan);
        let watching = held::JobWatching {
            watches: &self.watches,
            pods: &self.pod_watches,
            nodes: &self.nodes,
        };
        // Said when it changes: between Jobs `watch` says `None` again, which is news only
        // after a hold.
        let mut said: Option<disruption::Hold> = None;
        let verdict = plan
            .watch(&watching, stop, |hold| {
                if hold != said.as_ref() {
                    say_hold(hold);
                    progress.set(hold.and_then(disruption::Hold::waiting));
                    said = hold.cloned();
                }
            })
            .await;
        if let Some((sender, followers)) = following {
            // Finished: the last lines are in before the order completes (docs/design.md §9), within
            // bounds. Stopped (abandoned at the drain limit, or cancelled): the Job may still be
            // running, so its streams would not end; stop them at once and send what is read
            // within a second, inside the pod's grace period. The next claim resumes after it.
            let (drain, flush) = if stop.is_cancelled() {
                (Duration::ZERO, STOPPED_FLUSH)
            } else {
                (logs::DRAIN_LIMIT, FLUSH_TIMEOUT)
            };
            futures::future::join_all(followers.into_iter().map(|f| f.finish(drain))).await;
            sender.finish(flush).await;
        }
        verdict
    }

    async fn cancelled(&self, order: &WorkOrder) {
        cleanup::delete_created(&self.applier, order).await;
    }
}

/// Says in the executor's log when a pod that may still run where no kubelet reports starts,
/// changes or stops holding an order's verdict up (docs/design.md §12).
fn say_hold(hold: Option<&disruption::Hold>) {
    match hold {
        Some(h) => tracing::warn!(pod = %h.pod, node = %h.node, unreachable = h.unreachable,
            "{}", h.describe()),
        None => tracing::info!("no pod of the order is on a node that does not report any more"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_drain_ends_in_abandon_after_its_limit_and_not_before_a_signal() {
        let limit = Duration::from_millis(300);
        let s = Shutdown::default();
        abandon_after_drain(&s, limit);
        tokio::time::sleep(limit * 2).await;
        assert!(
            !s.abandon.is_cancelled(),
            "no signal, no drain: nothing is abandoned"
        );
        s.drain.cancel();
        tokio::time::sleep(limit / 3).await;
        assert!(
            !s.abandon.is_cancelled(),
            "running orders get the whole drain time"
        );
        tokio::time::timeout(Duration::from_secs(10), s.abandon.cancelled())
            .await
            .expect("abandoned once the drain time has passed");
    }
}
