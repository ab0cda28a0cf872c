//! What one order applies, and what it then waits on (docs/design.md §4): the executor's `Applying`
//! step ([`Plan::apply`]) and `Watching` step ([`Plan::watch`]) of an order's life
//! ([`crate::pull::order`]).

use std::time::{Duration, Instant};

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::apply::{Applied, Applier, ApplyError, apply_rank};
use super::build::BuildPlan;
use super::disruption::Hold;
use super::held::{JobEnd, JobWatching};
use super::pods;
use super::verdict::{ObjectVerdict, terminal};
use super::watch::WatchEnd;
use crate::manifest;
use crate::pull::Verdict;
use crate::queue::rules::watch_budget;
use crate::wire::{RetryOnDisruption, WorkOrder, WorkType};

/// What an order applied and now waits on.
#[derive(Debug)]
pub enum Plan {
    /// A `custom` order: its Jobs to watch in turn, and what was applied without monitoring.
    Jobs(JobsPlan),
    /// A `build` order: its BuildRun ([`super::build`]).
    BuildRun(BuildPlan),
}

impl From<ApplyError> for Verdict {
    fn from(e: ApplyError) -> Self {
        Verdict::Failure {
            message: e.message,
            retryable: e.retryable,
        }
    }
}

impl Plan {
    /// Applies the order's objects; the budget counts from now (the moment the claim arrived).
    /// `Err` is the order's verdict when nothing is left to watch for (refused documents, an
    /// object the cluster rejected).
    pub async fn apply(
        applier: &Applier,
        order: &WorkOrder,
        stop: &CancellationToken,
    ) -> Result<Plan, Verdict> {
        let budget = watch_budget(order.claim_timeout_seconds.max(0) as u32);
        let deadline = Instant::now() + budget;
        let yaml = order.yaml_content.as_deref().unwrap_or("");
        let docs = manifest::parse_documents(yaml).map_err(|e| terminal(e.0))?;
        if docs.is_empty() {
            return Err(terminal(
                "nothing to apply: yaml_content holds no Kubernetes object",
            ));
        }
        match order.work_type {
            WorkType::Custom => apply_custom(applier, order, docs, deadline, budget, stop).await,
            WorkType::Build => BuildPlan::apply(applier, order, docs, deadline, budget, stop)
                .await
                .map(Plan::BuildRun),
        }
    }

    /// Waits on the shared watches for the verdict. `on_hold` is told whenever a pod that may
    /// still run where no kubelet reports holds a Job's verdict up, and `None` once none does
    /// (docs/design.md §12).
    pub async fn watch(
        self,
        watching: &JobWatching<'_>,
        stop: &CancellationToken,
        on_hold: impl FnMut(Option<&Hold>),
    ) -> Verdict {
        let watches = watching.watches;
        match self {
            Plan::Jobs(jobs) => jobs.watch(watching, stop, on_hold).await,
            Plan::BuildRun(build) => build.watch(watches, stop).await,
        }
    }
}

async fn apply_custom(
    applier: &Applier,
    order: &WorkOrder,
    mut docs: Vec<Value>,
    deadline: Instant,
    budget: Duration,
    stop: &CancellationToken,
) -> Result<Plan, Verdict> {
    // Jobs need explicit names so a re-delivered order finds the Job it created; checked
    // before anything is applied.
    for (i, doc) in docs.iter().enumerate() {
        let named = doc
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty());
        if manifest::is_job(doc) && !named {
            return Err(terminal(format!(
                "Job in document {} has no metadata.name (generateName is not supported: a \
                 re-delivered order must find the Job it already created); nothing was applied",
                i + 1
            )));
        }
    }
    docs.sort_by_key(apply_rank);
    let id = order.id.to_string();
    let mut unmonitored = Vec::new();
    let mut jobs = Vec::new();
    for doc in &docs {
        if stop.is_cancelled() {
            return Err(terminal("stopped"));
        }
        let target = applier.apply(doc, &id).await?;
        if apply_rank(doc) == 1 {
            applier
                .wait_established(
                    &target.name,
                    deadline.min(Instant::now() + Duration::from_secs(120)),
                )
                .await?;
        }
        if manifest::is_job(doc) {
            jobs.push(target);
        } else {
            unmonitored.push(target);
        }
    }
    Ok(Plan::Jobs(JobsPlan {
        jobs,
        unmonitored,
        deadline,
        budget,
        // Only when the queue will run it again: a last reclaim keeps the Job as evidence.
        rerun_safe: order.retry_on_disruption == RetryOnDisruption::Safe
            && order.reclaim_count < order.max_reclaims,
    }))
}

/// What a `custom` order applied: its Jobs, watched in turn, and the rest.
#[derive(Debug)]
pub struct JobsPlan {
    /// The Jobs, in the order they were applied and are watched.
    pub jobs: Vec<Applied>,
    /// Applied without monitoring (docs/design.md §4).
    unmonitored: Vec<Applied>,
    /// End of the watch budget, counted from the claim.
    deadline: Instant,
    budget: Duration,
    /// The order has `retryOnDisruption: safe` and a reclaim left: a disrupted Job is cleared
    /// away for the next attempt (docs/design.md §12).
    rerun_safe: bool,
}

/// Longest a disrupted Job's pods are waited on to stop, and the Job to be deleted, before the
/// order is reported without clearing the way for a new run (docs/design.md §12).
const CLEAR_WAIT: Duration = Duration::from_secs(120);

impl JobsPlan {
    async fn watch(
        self,
        watching: &JobWatching<'_>,
        stop: &CancellationToken,
        mut on_hold: impl FnMut(Option<&Hold>),
    ) -> Verdict {
        let JobsPlan {
            jobs,
            unmonitored,
            deadline,
            budget,
            rerun_safe,
        } = self;
        let mut finished = Vec::new();
        let pods: Vec<_> = jobs.iter().map(|job| watching.subscribe(job)).collect();
        for (job, pods) in jobs.iter().zip(pods) {
            let (end, record) = watching
                .job_end(job, pods, deadline, stop, &mut on_hold)
                .await;
            let end = match end {
                JobEnd::Watched(end) => end,
                JobEnd::HeldAtDeadline(hold) => {
                    // Ended by a lost node, and not known to have stopped: never run again.
                    return Verdict::Disrupted {
                        message: format!(
                            "{}: {}, when the watch budget of {} s ran out; the Job is left as it is",
                            job.display(),
                            hold.describe(),
                            budget.as_secs()
                        ),
                        stopped: false,
                    };
                }
            };
            match end {
                WatchEnd::Verdict(ObjectVerdict::Succeeded(_)) => {
                    finished.push(job.name.clone());
                    // What held this Job up is not said of the next one.
                    on_hold(None);
                }
                WatchEnd::Verdict(ObjectVerdict::Failed { reason, message }) => {
                    let mut text = format!("{} failed: {reason}: {message}", job.display());
                    if let Some(pods) =
                        pods::failed_containers(watching.watches.client(), job).await
                    {
                        text.push_str(&format!(": {pods}"));
                    }
                    let Some(disruption) = record.ended_by(&reason) else {
                        return terminal(text);
                    };
                    text.push_str(&format!(
                        "; the attempt was ended by a disruption, not by the work: {}",
                        disruption.describe()
                    ));
                    return disrupted(watching, job, text, rerun_safe, deadline, stop).await;
                }
                WatchEnd::Verdict(ObjectVerdict::Pending) => {
                    unreachable!("wait_for ends only on terminal verdicts")
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
        success_message(&jobs, &finished, &unmonitored)
    }
}

/// The verdict of a Job whose attempt a disruption ended (docs/design.md §12). With
/// `retryOnDisruption: safe` the way is cleared for a new run first
/// ([`JobWatching::clear_for_rerun`]), and the order may run again only if that was done.
async fn disrupted(
    watching: &JobWatching<'_>,
    job: &Applied,
    text: String,
    rerun_safe: bool,
    deadline: Instant,
    stop: &CancellationToken,
) -> Verdict {
    if !rerun_safe {
        return Verdict::Disrupted {
            message: text,
            stopped: false,
        };
    }
    let until = deadline.min(Instant::now() + CLEAR_WAIT);
    match watching.clear_for_rerun(job, until, stop).await {
        Ok(()) => {
            tracing::info!(job = %job.display(), "disrupted: its pods stopped and the Job was deleted, for the next attempt");
            Verdict::Disrupted {
                message: format!(
                    "{text}; its pods stopped and the Job was deleted for the next attempt"
                ),
                stopped: true,
            }
        }
        Err(why) => Verdict::Disrupted {
            message: format!("{text}; the way was not cleared for a new run: {why}"),
            stopped: false,
        },
    }
}

fn success_message(jobs: &[Applied], finished: &[String], unmonitored: &[Applied]) -> Verdict {
    let mut message = String::new();
    if !jobs.is_empty() {
        message.push_str(&format!("Jobs succeeded: {}", finished.join(", ")));
    }
    if !unmonitored.is_empty() {
        let mut kinds: Vec<&str> = unmonitored.iter().map(|a| a.kind.as_str()).collect();
        kinds.dedup();
        if !message.is_empty() {
            message.push_str("; ");
        }
        message.push_str(&format!(
            "applied without monitoring: {} ({})",
            kinds.join(", "),
            unmonitored
                .iter()
                .map(Applied::display)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Verdict::Success { message }
}
