//! The logs of the pods an order runs, sent as the order's output (docs/design.md §9): every
//! container of every pod of the watched Jobs (and BuildRuns), init containers included, each pod
//! of a Job's retries, from the moment a container starts. Each line's stream is
//! `<pod>/<container>` and its time the kubelet's own timestamp (asked for with `timestamps`), so
//! a restarted executor, or a new claim re-attaching to the same Job, starts each container just
//! after the last line the server already has for it ([`resume_points`]) and sends nothing twice.
//!
//! Bounded: the pods come from the executor's shared pod watches ([`super::PodWatches`]: one per
//! namespace and label, not one per followed object); one task and one log stream per run of a
//! container, all cancelled when the order ends. A container whose logs cannot be read (kwok nodes have no
//! kubelet; the executor's Role may lack `pods/log`) is said once, as one line, and not retried.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};
use futures::{AsyncBufReadExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::LogParams;
use kube::{Api, Client};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::podwatch::{PodSubscription, PodWatches};
use crate::client::Client as ApiClient;
use crate::pull::output::{MAX_LINE_BYTES, OutputHandle};
use crate::wire::MAX_OUTPUT_PAGE_LINES;

/// After the Job's verdict, its containers' streams get this long to deliver their last lines.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(10);
/// Most pages of the order's stored output read to find where each stream stopped.
const RESUME_PAGES: usize = 100;

/// The label that names a Job's pods.
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";
/// The label Shipwright (through Tekton) puts on a BuildRun's pods.
pub const BUILDRUN_LABEL: &str = "buildrun.shipwright.io/name";

/// Where one container's stream stopped on the server: the time of its last stored line and how
/// many stored lines carry exactly that time (PostgreSQL keeps microseconds, and lines printed
/// within one microsecond share it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResumePoint {
    pub at: DateTime<Utc>,
    pub lines_at: usize,
}

impl ResumePoint {
    /// Adds one stored line of the stream.
    fn see(point: &mut Option<ResumePoint>, at: DateTime<Utc>) {
        match point {
            Some(p) if at < p.at => {}
            Some(p) if at == p.at => p.lines_at += 1,
            _ => *point = Some(ResumePoint { at, lines_at: 1 }),
        }
    }
}

/// Per stream (`<pod>/<container>`), where the server's copy of the order's output stopped, read
/// once (all claims). Errors leave the map empty, so every container starts from its beginning
/// (logged).
pub async fn resume_points(client: &ApiClient, order_id: Uuid) -> HashMap<String, ResumePoint> {
    let mut last: HashMap<String, Option<ResumePoint>> = HashMap::new();
    let mut after = None;
    for _ in 0..RESUME_PAGES {
        let query = match after {
            Some(cursor) => format!("limit={MAX_OUTPUT_PAGE_LINES}&after={cursor}"),
            None => format!("limit={MAX_OUTPUT_PAGE_LINES}"),
        };
        match client.read_output(order_id, &query).await {
            Ok(page) => {
                for l in page.lines.iter().filter(|l| l.marker.is_none()) {
                    ResumePoint::see(last.entry(l.stream.clone()).or_default(), l.at);
                }
                after = page.next_cursor;
                if !page.more {
                    break;
                }
            }
            Err(error) => {
                tracing::warn!(%error, "cannot read the order's output to resume; streams start from the beginning");
                break;
            }
        }
    }
    last.into_iter()
        .filter_map(|(stream, p)| Some((stream, p?)))
        .collect()
}

/// Decides, line by line, which lines of a container's log the server has already: those before
/// the resume point, and the first `lines_at` at its exact time.
#[derive(Debug)]
pub struct Resume {
    point: Option<ResumePoint>,
    skipped_at: usize,
}

impl Resume {
    pub fn new(point: Option<ResumePoint>) -> Self {
        Resume {
            point,
            skipped_at: 0,
        }
    }

    /// Whether the line stamped `at` (already cut to microseconds) was sent before.
    pub fn sent_before(&mut self, at: DateTime<Utc>) -> bool {
        let Some(p) = self.point else { return false };
        if at < p.at {
            return true;
        }
        if at == p.at && self.skipped_at < p.lines_at {
            self.skipped_at += 1;
            return true;
        }
        false
    }
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
        resume: Arc<HashMap<String, ResumePoint>>,
    ) -> Self {
        let stop = CancellationToken::new();
        let mut tasks = JoinSet::new();
        let subscription = watches.subscribe(namespace, label, value);
        let runs = Runs {
            pods: Api::namespaced(kube, namespace),
            out,
            resume,
            started: HashSet::new(),
            followers: JoinSet::new(),
        };
        tasks.spawn(follow_pods(subscription, runs, stop.clone()));
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
    resume: Arc<HashMap<String, ResumePoint>>,
    /// `<pod>/<container>#<restart count>` of each run followed.
    started: HashSet<String>,
    followers: JoinSet<()>,
}

impl Runs {
    /// Starts one follower per run of each container of `pod` that has started and is not
    /// followed yet: a container restarted in its pod (`restartPolicy: OnFailure`) is a new run,
    /// whose log the kubelet gives from its own beginning, under the same stream name.
    fn start(&mut self, pod: &Pod) {
        let Some(name) = pod.metadata.name.as_deref() else {
            return;
        };
        let Some(status) = &pod.status else { return };
        let statuses = status.init_container_statuses.iter().flatten();
        for c in statuses.chain(status.container_statuses.iter().flatten()) {
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
                self.spawn(name, &c.name, &stream, Run::Previous);
            }
            if has_started && self.started.insert(format!("{stream}#{}", c.restart_count)) {
                self.spawn(name, &c.name, &stream, Run::Current);
            }
        }
    }

    fn spawn(&mut self, pod: &str, container: &str, stream: &str, run: Run) {
        self.followers.spawn(follow_container(
            self.pods.clone(),
            pod.to_string(),
            container.to_string(),
            stream.to_string(),
            run,
            self.resume.clone(),
            self.out.clone(),
        ));
    }
}

/// Which run of a container to read.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Run {
    /// The one running (or ended and not yet restarted), followed to its end.
    Current,
    /// The one before it, ended: its log as the kubelet kept it.
    Previous,
}

/// Streams one run of a container's log until it ends, skipping the lines the server already
/// has ([`Resume`]).
async fn follow_container(
    pods: Api<Pod>,
    pod: String,
    container: String,
    stream: String,
    run: Run,
    resume: Arc<HashMap<String, ResumePoint>>,
    out: OutputHandle,
) {
    let point = resume.get(&stream).copied();
    let params = LogParams {
        container: Some(container),
        follow: run == Run::Current,
        previous: run == Run::Previous,
        timestamps: true,
        since_time: point
            .and_then(|p| k8s_openapi::jiff::Timestamp::from_second(p.at.timestamp()).ok()),
        ..LogParams::default()
    };
    let reader = match pods.log_stream(&pod, &params).await {
        Ok(r) => r,
        Err(error) => {
            // Said once per container: a fake kubelet (kwok) or a missing `pods/log` right will
            // not answer differently on a retry.
            out.push(
                &stream,
                &format!("[pullman] no logs from this container: {error}"),
                Utc::now(),
            )
            .await;
            return;
        }
    };
    let mut resume = Resume::new(point);
    let mut lines = reader.lines();
    while let Some(line) = lines.next().await {
        let line = match line {
            Ok(l) => l,
            Err(error) => {
                tracing::debug!(%error, stream, "container log broke off");
                break;
            }
        };
        let (at, text) = split_timestamp(&line);
        // Cut to what the server stores, so a resumed stream compares like with like.
        let at = at.unwrap_or_else(Utc::now).trunc_subsecs(6);
        if resume.sent_before(at) {
            continue;
        }
        let mut text = text.trim_end_matches('\r');
        if text.len() > MAX_LINE_BYTES {
            let mut cut = MAX_LINE_BYTES;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text = &text[..cut];
        }
        out.push(&stream, text, at).await;
    }
}

/// `2026-01-02T03:04:05.123456789Z text` → the time and the text. A line without a timestamp
/// (should not happen with `timestamps`) is kept whole.
pub fn split_timestamp(line: &str) -> (Option<DateTime<Utc>>, &str) {
    if let Some((ts, text)) = line.split_once(' ')
        && let Ok(at) = DateTime::parse_from_rfc3339(ts)
    {
        return (Some(at.with_timezone(&Utc)), text);
    }
    (None, line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_timestamps_are_split_off_with_their_nanoseconds() {
        let (at, text) = split_timestamp("2026-01-02T03:04:05.123456789Z hello world");
        assert_eq!(text, "hello world");
        let at = at.unwrap();
        assert_eq!(at.timestamp_subsec_nanos(), 123_456_789);
        let (at2, _) = split_timestamp("2026-01-02T03:04:05.123456790Z next");
        assert!(at2.unwrap() > at);
        assert_eq!(split_timestamp("no stamp here"), (None, "no stamp here"));
        assert_eq!(split_timestamp("2026-01-02T03:04:05Z ").1, "");
    }

    #[test]
    fn a_resumed_stream_skips_exactly_the_lines_stored_before() {
        let t =
            |micros: i64| DateTime::from_timestamp_micros(1_800_000_000_000_000 + micros).unwrap();
        // Stored: lines at 1, 2, 2 (two within one microsecond). The log gives 1, 2, 2, 2, 3.
        let mut point = None;
        for at in [t(1), t(2), t(2)] {
            ResumePoint::see(&mut point, at);
        }
        assert_eq!(
            point,
            Some(ResumePoint {
                at: t(2),
                lines_at: 2
            })
        );
        let mut resume = Resume::new(point);
        let sent: Vec<bool> = [t(1), t(2), t(2), t(2), t(3)]
            .into_iter()
            .map(|at| !resume.sent_before(at))
            .collect();
        assert_eq!(sent, [false, false, false, true, true]);
        // Nothing stored: everything goes.
        let mut fresh = Resume::new(None);
        assert!(!fresh.sent_before(t(0)));
    }

    #[test]
    fn a_kubelet_time_cut_to_microseconds_equals_the_stored_one() {
        let (at, _) = split_timestamp("2026-01-02T03:04:05.123456789Z x");
        let cut = at.unwrap().trunc_subsecs(6);
        assert_eq!(cut.timestamp_subsec_nanos(), 123_456_000);
        let stored: DateTime<Utc> = "2026-01-02T03:04:05.123456Z".parse().unwrap();
        assert_eq!(cut, stored);
    }
}
