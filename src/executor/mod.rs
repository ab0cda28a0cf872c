//! `pullman executor`: the in-cluster agent (DESIGN.md §4). It claims work orders over the pull
//! API and carries them out in its cluster: `custom` orders are applied with server-side apply and
//! their Jobs watched to a verdict; `build` orders apply a Shipwright Build and watch a BuildRun.
//! Everything happens within the watch budget derived from the claim timeout.

mod apply;
mod verdict;
mod watch;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use kube::api::{DeleteParams, DynamicObject, ListParams, PropagationPolicy};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub use apply::{Applied, Applier, FIELD_MANAGER, WORK_ORDER_LABEL, apply_rank};
pub use verdict::{ObjectVerdict, buildrun_verdict, job_verdict};
pub use watch::{WatchEnd, watch_object};

use crate::agent::{self, Carrier, LoopConfig, Shutdown, Verdict};
use crate::manifest;
use crate::queue::rules::watch_budget;
use crate::queue::{WorkOrder, WorkType};

/// Longest a BuildRun is watched, whatever the budget (DESIGN.md §4).
pub const BUILD_WINDOW: Duration = Duration::from_secs(15 * 60);

/// Run work orders in this cluster.
///
/// Claims work orders with a lease, applies their objects with server-side apply (field manager
/// pullman-executor) and watches Jobs and Shipwright BuildRuns to a verdict within the watch
/// budget (claim timeout minus max(10 %, 60 s)). Uses the in-cluster service account, or
/// KUBECONFIG outside a cluster. SIGTERM: stop claiming, finish running orders; a second signal
/// abandons them to the reaper.
#[derive(Debug, Clone, Args)]
pub struct ExecutorArgs {
    /// Pullman server URL.
    #[arg(long, env = "PULLMAN_SERVER")]
    pub server: String,
    /// File holding this executor's agent token (the Executor's Secret, key `token`).
    #[arg(long, env = "PULLMAN_TOKEN_FILE")]
    pub token_file: PathBuf,
    /// Namespace for namespaced objects that name none. Default: the pod's namespace, else
    /// `default`.
    #[arg(long, env = "PULLMAN_TARGET_NAMESPACE")]
    pub target_namespace: Option<String>,
    /// Orders carried out at once.
    #[arg(long, env = "PULLMAN_CONCURRENCY", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=256))]
    pub concurrency: u32,
    /// Lease requested on each claim, in seconds (heartbeat every third of it).
    #[arg(long, env = "PULLMAN_LEASE_SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u32).range(5..=86400))]
    pub lease_seconds: u32,
}

/// `pullman executor`.
pub async fn run(args: ExecutorArgs) -> anyhow::Result<()> {
    use anyhow::Context;
    let (api, agent_id) = crate::worker::connect_as_agent(&args.server, &args.token_file).await?;
    let kube = Client::try_default()
        .await
        .context("connecting to Kubernetes (in-cluster config or KUBECONFIG)")?;
    let namespace = args.target_namespace.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "default".into())
    });
    tracing::info!(target_namespace = %namespace, concurrency = args.concurrency, "executor starting");
    let carrier = Arc::new(KubeCarrier::new(kube, namespace));
    let config = LoopConfig {
        agent_id,
        work_types: vec![],
        lease_seconds: args.lease_seconds,
        concurrency: args.concurrency as usize,
        max_wait_seconds: 30,
    };
    agent::run(api, config, carrier, Shutdown::on_signals()).await;
    tracing::info!("executor stopped");
    Ok(())
}

/// Carries orders out in a cluster.
pub struct KubeCarrier {
    applier: Applier,
}

fn terminal(message: impl Into<String>) -> Verdict {
    Verdict::Failure {
        message: message.into(),
        retryable: false,
    }
}

impl KubeCarrier {
    pub fn new(client: Client, target_namespace: String) -> Self {
        KubeCarrier {
            applier: Applier::new(client, target_namespace),
        }
    }

    /// Carries one order out; `budget` counts from the moment the claim was received.
    pub async fn carry_out(&self, order: &WorkOrder, stop: &CancellationToken) -> Verdict {
        let started = Instant::now();
        let budget = watch_budget(order.claim_timeout_seconds.max(0) as u32);
        let deadline = started + budget;
        let yaml = order.yaml_content.as_deref().unwrap_or("");
        let docs = match manifest::parse_documents(yaml) {
            Ok(docs) => docs,
            Err(e) => return terminal(e.0),
        };
        if docs.is_empty() {
            return terminal("nothing to apply: yaml_content holds no Kubernetes object");
        }
        match order.work_type {
            WorkType::Custom => self.carry_custom(order, docs, deadline, budget, stop).await,
            WorkType::Build => self.carry_build(order, docs, deadline, budget, stop).await,
        }
    }

    async fn carry_custom(
        &self,
        order: &WorkOrder,
        mut docs: Vec<Value>,
        deadline: Instant,
        budget: Duration,
        stop: &CancellationToken,
    ) -> Verdict {
        // Jobs need explicit names so a re-delivered order finds the Job it created; checked
        // before anything is applied.
        for (i, doc) in docs.iter().enumerate() {
            let named = doc
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty());
            if manifest::is_job(doc) && !named {
                return terminal(format!(
                    "Job in document {} has no metadata.name (generateName is not supported: a \
                     re-delivered order must find the Job it already created); nothing was applied",
                    i + 1
                ));
            }
        }
        docs.sort_by_key(apply_rank);
        let id = order.id.to_string();
        let mut applied = Vec::new();
        let mut jobs = Vec::new();
        for doc in &docs {
            if stop.is_cancelled() {
                return terminal("stopped");
            }
            let target = match self.applier.apply(doc, &id).await {
                Ok(t) => t,
                Err(e) => {
                    return Verdict::Failure {
                        message: e.message,
                        retryable: e.retryable,
                    };
                }
            };
            if apply_rank(doc) == 1
                && let Err(e) = self
                    .applier
                    .wait_established(
                        &target.name,
                        deadline.min(Instant::now() + Duration::from_secs(120)),
                    )
                    .await
            {
                return Verdict::Failure {
                    message: e.message,
                    retryable: e.retryable,
                };
            }
            if manifest::is_job(doc) {
                jobs.push(target);
            } else {
                applied.push(target);
            }
        }
        let mut finished = Vec::new();
        for job in &jobs {
            let end = watch_object(
                job.api(self.applier.client()),
                &job.name,
                deadline,
                stop,
                job_verdict,
            )
            .await;
            match end {
                WatchEnd::Verdict(ObjectVerdict::Succeeded(_)) => finished.push(job.name.clone()),
                WatchEnd::Verdict(ObjectVerdict::Failed { reason, message }) => {
                    return terminal(format!("{} failed: {reason}: {message}", job.display()));
                }
                WatchEnd::Verdict(ObjectVerdict::Pending) => {
                    unreachable!("watch_object ends only on terminal verdicts")
                }
                WatchEnd::Deleted => {
                    return terminal(format!("{} was deleted before it finished", job.display()));
                }
                WatchEnd::DeadlineReached => {
                    return terminal(format!(
                        "{} still running when the watch budget of {} s ran out; the Job is left running",
                        job.display(),
                        budget.as_secs()
                    ));
                }
                WatchEnd::Stopped => return terminal("stopped"),
            }
        }
        let mut message = String::new();
        if !jobs.is_empty() {
            message.push_str(&format!("Jobs succeeded: {}", finished.join(", ")));
        }
        if !applied.is_empty() {
            let mut kinds: Vec<&str> = applied.iter().map(|a| a.kind.as_str()).collect();
            kinds.dedup();
            if !message.is_empty() {
                message.push_str("; ");
            }
            message.push_str(&format!(
                "applied without monitoring: {} ({})",
                kinds.join(", "),
                applied
                    .iter()
                    .map(Applied::display)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        Verdict::Success { message }
    }

    async fn carry_build(
        &self,
        order: &WorkOrder,
        docs: Vec<Value>,
        deadline: Instant,
        budget: Duration,
        stop: &CancellationToken,
    ) -> Verdict {
        let Some(build) = docs
            .first()
            .filter(|d| docs.len() == 1 && manifest::is_shipwright_build(d))
        else {
            return terminal(
                "a build work order holds exactly one Build (apiVersion shipwright.io/v1beta1)",
            );
        };
        let id = order.id.to_string();
        let build_target = match self.applier.apply(build, &id).await {
            Ok(t) => t,
            Err(e) => {
                return Verdict::Failure {
                    message: e.message,
                    retryable: e.retryable,
                };
            }
        };
        // Named by order and attempt: a reclaimed delivery re-attaches to its BuildRun, a retry
        // after a failure starts a new one.
        let run_name = buildrun_name(&build_target.name, order);
        let run = json!({
            "apiVersion": "shipwright.io/v1beta1",
            "kind": "BuildRun",
            "metadata": {"name": run_name, "namespace": build_target.namespace},
            "spec": {"build": {"name": build_target.name}},
        });
        let run_target = match self.applier.apply(&run, &id).await {
            Ok(t) => t,
            Err(e) => {
                return Verdict::Failure {
                    message: e.message,
                    retryable: e.retryable,
                };
            }
        };
        let window = BUILD_WINDOW.min(budget);
        let window_end = deadline.min(Instant::now() + window);
        match watch_object(
            run_target.api(self.applier.client()),
            &run_name,
            window_end,
            stop,
            buildrun_verdict,
        )
        .await
        {
            WatchEnd::Verdict(ObjectVerdict::Succeeded(digest)) => {
                Verdict::Success { message: digest }
            }
            WatchEnd::Verdict(ObjectVerdict::Failed { reason, message }) => Verdict::Failure {
                message: format!("{} failed: {reason}: {message}", run_target.display()),
                retryable: true,
            },
            WatchEnd::Verdict(ObjectVerdict::Pending) => {
                unreachable!("watch_object ends only on terminal verdicts")
            }
            WatchEnd::Deleted => terminal(format!(
                "{} was deleted before it finished",
                run_target.display()
            )),
            WatchEnd::DeadlineReached => terminal(format!(
                "{} still running after the build window of {} s; the BuildRun is left alone",
                run_target.display(),
                window.as_secs()
            )),
            WatchEnd::Stopped => terminal("stopped"),
        }
    }

    /// Deletes the Jobs and BuildRuns a cancelled order created (background propagation, so the
    /// pods go too).
    pub async fn delete_created(&self, order: &WorkOrder) {
        let selector = format!("{WORK_ORDER_LABEL}={}", order.id);
        let dp = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        };
        let docs = manifest::parse_documents(order.yaml_content.as_deref().unwrap_or(""))
            .unwrap_or_default();
        let mut targets = Vec::new();
        for doc in &docs {
            if (manifest::is_job(doc) || manifest::is_shipwright_build(doc))
                && let Ok(t) = self.applier.locate(doc).await
            {
                targets.push((t.namespace.clone(), manifest::is_job(doc)));
            }
        }
        for (namespace, is_job) in targets {
            let ns = namespace.unwrap_or_else(|| self.applier.target_namespace().to_string());
            let gvk = if is_job {
                kube::api::GroupVersionKind::gvk("batch", "v1", "Job")
            } else {
                kube::api::GroupVersionKind::gvk("shipwright.io", "v1beta1", "BuildRun")
            };
            let Ok((resource, _)) = self.applier.resolve(&gvk).await else {
                continue;
            };
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.applier.client().clone(), &ns, &resource);
            match api
                .delete_collection(&dp, &ListParams::default().labels(&selector))
                .await
            {
                Ok(_) => {
                    tracing::info!(work_order = %order.id, namespace = %ns, kind = %gvk.kind, "deleted what the cancelled order created")
                }
                Err(e) => {
                    tracing::warn!(work_order = %order.id, error = %e, "could not delete what the cancelled order created")
                }
            }
        }
    }
}

/// `<build>-<first 8 hex of the order id>-<attempt>`, at most 63 characters.
pub fn buildrun_name(build: &str, order: &WorkOrder) -> String {
    let suffix = format!(
        "-{}-{}",
        &order.id.simple().to_string()[..8],
        order.retry_count
    );
    let keep = 63usize.saturating_sub(suffix.len());
    let prefix: String = build.chars().take(keep).collect();
    format!("{}{suffix}", prefix.trim_end_matches('-'))
}

impl Carrier for KubeCarrier {
    async fn carry(&self, order: WorkOrder, stop: CancellationToken) -> Verdict {
        self.carry_out(&order, &stop).await
    }

    async fn cancelled(&self, order: &WorkOrder) {
        self.delete_created(order).await;
    }
}
