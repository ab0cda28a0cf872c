//! A Job's verdict under docs/design.md §12: what the Job's conditions say is taken only once no
//! pod of the Job may still run where no kubelet reports (`super::disruption`). While one may,
//! the verdict waits: until the kubelet reports, the pod is gone, its node is deleted or marked
//! out-of-service, or the budget ends (then the order fails naming the node).
//!
//! The pods come from the shared pod watch (`super::podwatch`) and the nodes from the one node
//! watch (`super::nodewatch`), so holding costs no connection per Job.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::apply::Applied;
use super::disruption::{Gone, Hold, holds, pick, with_gone};
use super::logs::JOB_NAME_LABEL;
use super::nodewatch::NodeWatch;
use super::podwatch::{PodSubscription, PodWatches};
use super::verdict::job_verdict;
use super::watch::{WatchEnd, Watches};

/// Longest a verdict waits for the first list of the pods and of the nodes.
const LISTED_WAIT: Duration = Duration::from_secs(10);

/// How often the pods are looked at again without an event: a pod's deletion sends none.
const RECHECK: Duration = Duration::from_secs(10);

/// What a Job's verdict is read through.
pub struct JobWatching<'a> {
    /// The Jobs themselves (one shared watch per namespace).
    pub watches: &'a Watches,
    /// Their pods (the shared pod watch by `batch.kubernetes.io/job-name`).
    pub pods: &'a PodWatches,
    /// The nodes under the pods.
    pub nodes: &'a NodeWatch,
}

/// How the wait for one Job ended.
#[derive(Debug)]
pub enum JobEnd {
    /// As [`Watches::wait_for`] ended, with no pod left that may run where no kubelet reports.
    Watched(WatchEnd),
    /// The deadline passed while a pod may still run on a node that does not report.
    HeldAtDeadline(Hold),
}

impl JobWatching<'_> {
    /// Waits for `job`'s verdict until `deadline` or `stop`, holding a terminal one while a pod
    /// of the Job may still run where no kubelet reports. `on_hold` is told the pod that holds
    /// it up whenever that changes (`None` once nothing does while the Job runs on; not at the
    /// verdict, which ends the claim anyway), for the order to say so.
    pub async fn job_end(
        &self,
        job: &Applied,
        deadline: Instant,
        stop: &CancellationToken,
        mut on_hold: impl FnMut(Option<&Hold>),
    ) -> JobEnd {
        let Some(ns) = job.namespace.as_deref() else {
            return JobEnd::Watched(
                self.watches
                    .wait_for(job, deadline, stop, job_verdict)
                    .await,
            );
        };
        let mut pods = self.pods.subscribe(ns, JOB_NAME_LABEL, &job.name);
        let mut nodes = self.nodes.changes();
        let until = tokio::time::Instant::from_std(deadline);
        let mut said: Option<Hold> = None;
        let mut gone = Gone::new();
        // One wait on the Job for as long as it gives no verdict, so that what it counts (how
        // long the Job has been out of the store) is not reset by pod or node events.
        let mut watch = Box::pin(self.watches.wait_for(job, deadline, stop, job_verdict));
        loop {
            let hold = self.hold(&pods, &mut gone);
            if hold != said {
                on_hold(hold.as_ref());
                said = hold.clone();
            }
            let end = tokio::select! {
                end = &mut watch => end,
                // A pod or a node changed, or a pod went (the pod watch says nothing of that):
                // whether one holds the verdict may have changed too.
                Some(_) = pods.next() => continue,
                Ok(()) = nodes.changed() => continue,
                _ = tokio::time::sleep(RECHECK) => continue,
            };
            let WatchEnd::Verdict(verdict) = end else {
                if end == WatchEnd::DeadlineReached
                    && let Some(hold) = hold.filter(|h| h.unreachable)
                {
                    return JobEnd::HeldAtDeadline(hold);
                }
                return JobEnd::Watched(end);
            };
            // The verdict is there: before it is taken, the pods and nodes are listed, so a pod
            // on a lost node is not missed for want of a first list (bounded: a list that does
            // not come leaves the pods' own conditions to go by).
            tokio::select! {
                _ = tokio::time::timeout(LISTED_WAIT, async {
                    tokio::join!(pods.listed(), self.nodes.listed())
                }) => {}
                _ = stop.cancelled() => return JobEnd::Watched(WatchEnd::Stopped),
            }
            // Taken without telling `on_hold` that nothing holds it any more: the claim ends
            // with the report, and a heartbeat sent now would only race the complete.
            let Some(hold) = self.hold(&pods, &mut gone) else {
                return JobEnd::Watched(WatchEnd::Verdict(verdict));
            };
            if said.as_ref() != Some(&hold) {
                on_hold(Some(&hold));
                said = Some(hold.clone());
            }
            tracing::info!(job = %job.display(), pod = %hold.pod, node = %hold.node,
                "the Job has a verdict, but its pod may still run where no kubelet reports; holding it (docs/design.md §12)");
            tokio::select! {
                _ = pods.next() => {}
                _ = nodes.changed() => {}
                _ = tokio::time::sleep(RECHECK) => {}
                _ = stop.cancelled() => return JobEnd::Watched(WatchEnd::Stopped),
                _ = tokio::time::sleep_until(until) => return JobEnd::HeldAtDeadline(hold),
            }
            // The verdict is read again (at once, from the store) after the next look.
            watch = Box::pin(self.watches.wait_for(job, deadline, stop, job_verdict));
        }
    }

    /// The hold the order says now, remembering in `gone` the held pods that may still run
    /// after they are gone from the API server (`disruption::with_gone`).
    fn hold(&self, pods: &PodSubscription, gone: &mut Gone) -> Option<Hold> {
        let current = pods.current();
        let state = |node: &str| self.nodes.state(node);
        let held = holds(current.iter().map(|p| p.as_ref()), state);
        let present = current
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        let (held, remember) = with_gone(held, &present, gone, state);
        *gone = remember;
        pick(held)
    }
}
