//! The logs of the pods an order runs, sent as the order's output (docs/design.md §9): every
//! container of every pod of the watched Jobs (and BuildRuns), init containers included, each pod
//! of a Job's retries, from the moment a container starts. Each line's stream is
//! `<pod>/<container>` and its time the kubelet's own timestamp (asked for with `timestamps`), so
//! a restarted executor, or a new claim re-attaching to the same Job, starts each container just
//! after the last line the server already has for it ([`resume_points`]) and sends nothing twice.
//!
//! Bounded: the pods come from the executor's shared pod watches ([`super::PodWatches`]: one per
//! namespace and label, not one per followed object); one task and one log stream per run of a
//! container, all cancelled when the order ends. How one container's stream is read, cut,
//! reopened when it breaks, and said missing when it cannot be read is [`container_log`].

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::container_log::NOTICE_PREFIX;
use super::container_log::{self, KubeLog, LineSink, ResumePoint, Run, StreamSink};
use super::pods::container_statuses;
use super::podwatch::{PodSubscription, PodWatches};
use crate::client::{Client as ApiClient, ClientError};
use crate::pull::Backoff;
use crate::pull::output::OutputHandle;
use crate::wire::{MAX_OUTPUT_PAGE_LINES, OutputEntry, OutputQuery, WorkOrder};

/// After the Job's verdict, its containers' streams get this long to deliver their last lines.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(10);
/// How long a claim tries to read where its order's streams stopped before it starts them at
/// the claim's time instead ([`read_resume_points`]).
pub const RESUME_READ_LIMIT: Duration = Duration::from_secs(8);

/// The label that names a Job's pods.
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";
/// The label Shipwright (through Tekton) puts on a BuildRun's pods.
pub const BUILDRUN_LABEL: &str = "buildrun.shipwright.io/name";

/// Per stream (`<pod>/<container>`), where the server's copy of the order's output stopped
/// (all earlier claims), read once per claim in the background so the verdict's watch never
/// waits for it ([`read_resume_points`]).
pub type ResumeAt = Shared<BoxFuture<'static, Arc<Resumes>>>;

/// Where each stream of an order starts (see [`ResumeAt`]).
#[derive(Debug, Default)]
pub struct Resumes {
    known: HashMap<String, ResumePoint>,
    /// The stored output could not be read: every stream starts at this time (the claim's), so
    /// nothing is sent twice, and says why its earlier lines may be missing.
    unknown: Option<(DateTime<Utc>, String)>,
}

impl Resumes {
    /// Where `stream` starts, and a line to say first when its earlier lines may be missing.
    fn start(&self, stream: &str) -> (Option<ResumePoint>, Option<String>) {
        if let Some(p) = self.known.get(stream) {
            return (Some(*p), None);
        }
        match &self.unknown {
            None => (None, None),
            Some((at, why)) => (
                Some(ResumePoint {
                    at: *at,
                    lines_at: 0,
                }),
                Some(format!(
                    "{NOTICE_PREFIX}lines of this container before {} are not sent again: the output \
                     earlier attempts stored could not be read ({why})",
                    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                )),
            ),
        }
    }
}

/// Starts reading where the order's streams stopped on the server. A first claim (no retry, no
/// reclaim) has nothing stored and reads nothing. A read that fails is retried for at most
/// [`RESUME_READ_LIMIT`]; after that every stream starts at the claim's time: a line is never
/// sent twice, and a line printed before the claim that an earlier claim did not deliver is
/// said missing.
pub fn read_resume_points(client: ApiClient, order: &WorkOrder) -> ResumeAt {
    if order.retry_count == 0 && order.reclaim_count == 0 {
        return futures::future::ready(Arc::new(Resumes::default()))
            .boxed()
            .shared();
    }
    let claimed_at = order.claimed_at.unwrap_or_else(Utc::now);
    read_within(client, order.id, claimed_at, RESUME_READ_LIMIT)
}

/// [`read_resume_points`] for an order claimed at `claimed_at`, trying for at most `limit`. A
/// read that fails part-way starts again from the first page: a partial read is never used,
/// since it would start a stream before lines the server already has.
fn read_within(
    client: ApiClient,
    order_id: Uuid,
    claimed_at: DateTime<Utc>,
    limit: Duration,
) -> ResumeAt {
    async move {
        let mut backoff = Backoff::default();
        let read = tokio::time::timeout(limit, async {
            loop {
                match resume_points(&client, order_id).await {
                    Ok(known) => return known,
                    Err(error) => {
                        tracing::warn!(%error, "cannot read the order's output to resume; retrying");
                        tokio::time::sleep(backoff.failed()).await;
                    }
                }
            }
        })
        .await;
        Arc::new(match read {
            Ok(known) => Resumes {
                known,
                unknown: None,
            },
            Err(_) => Resumes {
                known: HashMap::new(),
                unknown: Some((claimed_at, "the server did not answer in time".into())),
            },
        })
    }
    .boxed()
    .shared()
}

/// Every page of the order's stored output, read to its end (bounded by the per-order cap).
async fn resume_points(
    client: &ApiClient,
    order_id: Uuid,
) -> Result<HashMap<String, ResumePoint>, ClientError> {
    let mut last: HashMap<String, Option<ResumePoint>> = HashMap::new();
    let mut after = None;
    loop {
        let query = OutputQuery {
            limit: Some(MAX_OUTPUT_PAGE_LINES),
            after,
            ..OutputQuery::default()
        };
        let page = client.read_output(order_id, &query).await?;
        // Server markers and the executor's own notices (stamped with its clock, not the
        // kubelet's) say nothing of where a container's log stands.
        let read = |l: &&OutputEntry| l.marker.is_none() && !l.text.starts_with(NOTICE_PREFIX);
        for l in page.lines.iter().filter(read) {
            ResumePoint::see(last.entry(l.stream.clone()).or_default(), l.at);
        }
        after = page.next_cursor;
        if !page.more {
            break;
        }
    }
    Ok(last
        .into_iter()
        .filter_map(|(stream, p)| Some((stream, p?)))
        .collect())
}

/// The followers of one order's pods.
pub struct PodLogs {
    stop: CancellationToken,
    tasks: JoinSet<()>,
}

impl PodLogs {
    /// Follows the pods in `namespace` whose `label` is `value`, as the executor's shared pod
    /// watch reports them.
    pub fn follow(
        watches: &PodWatches,
        kube: Client,
        namespace: &str,
        (label, value): (&'static str, &str),
        out: OutputHandle,
        resume: ResumeAt,
    ) -> Self {
        let stop = CancellationToken::new();
        let mut tasks = JoinSet::new();
        let subscription = watches.subscribe(namespace, label, value);
        let pods = Api::namespaced(kube, namespace);
        let stopped = stop.clone();
        tasks.spawn(async move {
            let runs = Runs {
                pods,
                out,
                resume: resume.await,
                started: HashSet::new(),
                followers: JoinSet::new(),
                stop: stopped.clone(),
            };
            follow_pods(subscription, runs, stopped).await;
        });
        PodLogs { stop, tasks }
    }

    /// The order's verdict is in: lets the containers' streams end on their own (a finished
    /// container's log ends) for at most `limit`, then stops every task.
    pub async fn finish(mut self, limit: Duration) {
        self.stop.cancel();
        let drained = tokio::time::timeout(limit, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::debug!("container logs still open after the verdict; stopping them");
            self.tasks.abort_all();
        }
    }
}

impl Drop for PodLogs {
    fn drop(&mut self) {
        self.stop.cancel();
        self.tasks.abort_all();
    }
}

/// Takes the pods from the subscription until `stop`, then (the verdict is in) those the shared
/// watch has listed by then: a Job that ended before the watch's first list has its pods only
/// there. Returns when every container's stream has ended.
async fn follow_pods(mut subscription: PodSubscription, mut runs: Runs, stop: CancellationToken) {
    for pod in subscription.current() {
        runs.start(&pod);
    }
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            Some(pod) = subscription.next() => runs.start(&pod),
        }
    }
    subscription.listed().await;
    while let Some(pod) = subscription.try_next() {
        runs.start(&pod);
    }
    for pod in subscription.current() {
        runs.start(&pod);
    }
    drop(subscription);
    while runs.followers.join_next().await.is_some() {}
}

/// The runs of containers started so far for one order, and their followers.
struct Runs {
    pods: Api<Pod>,
    out: OutputHandle,
    resume: Arc<Resumes>,
    /// `<pod>/<container>#<restart count>` of each run followed.
    started: HashSet<String>,
    followers: JoinSet<()>,
    /// The order's verdict is in (see [`container_log::follow`]).
    stop: CancellationToken,
}

impl Runs {
    /// Starts one follower per run of each container of `pod` that has started and is not
    /// followed yet: a container restarted in its pod (`restartPolicy: OnFailure`) is a new run,
    /// whose log the kubelet gives from its own beginning, under the same stream name.
    fn start(&mut self, pod: &Pod) {
        let Some(name) = pod.metadata.name.as_deref() else {
            return;
        };
        for c in container_statuses(pod) {
            let state = c.state.as_ref();
            let has_started = state.is_some_and(|s| s.running.is_some() || s.terminated.is_some());
            let stream = format!("{name}/{}", c.name);
            // A run that ended and was replaced before this watch saw it: the kubelet keeps the
            // previous run's log (only that one), read whole.
            if c.restart_count > 0
                && self
                    .started
                    .insert(format!("{stream}#{}", c.restart_count - 1))
            {
                self.spawn(name, &c.name, &stream, Run::Previous, c.restart_count - 1);
            }
            if has_started && self.started.insert(format!("{stream}#{}", c.restart_count)) {
                self.spawn(name, &c.name, &stream, Run::Current, c.restart_count);
            }
        }
    }

    fn spawn(&mut self, pod: &str, container: &str, stream: &str, run: Run, restart_count: i32) {
        let source = KubeLog {
            pods: self.pods.clone(),
            pod: pod.to_string(),
            container: container.to_string(),
            restart_count,
        };
        let sink = StreamSink {
            out: self.out.clone(),
            stream: stream.to_string(),
        };
        let (start, notice) = self.resume.start(stream);
        let stop = self.stop.clone();
        self.followers.spawn(async move {
            if let Some(text) = notice {
                sink.line(text, Utc::now()).await;
            }
            let redactor = sink.out.redactor().clone();
            container_log::follow(&source, run, &sink, &redactor, start, &stop).await;
        });
    }
}

#[cfg(test)]
#[path = "logs_tests.rs"]
mod tests;
