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
use super::disrupted::Record;
use super::disruption::{Gone, Hold, NodeState, holds, pick, stopped_by_kubelet, with_gone};
use super::logs::JOB_NAME_LABEL;
use super::nodewatch::NodeWatch;
use super::podwatch::{PodSubscription, PodWatches};
use super::verdict::{ObjectVerdict, api_message, job_verdict};
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
    /// The pods of `job` (`None` for a Job without a namespace, which cannot be), subscribed to
    /// from now on: an order's Jobs are subscribed to together when their watch begins, so that
    /// a later Job's pod evicted and gone before its turn is still recorded (every state of a
    /// pod waits in the subscription).
    pub fn subscribe(&self, job: &Applied) -> Option<PodSubscription> {
        let ns = job.namespace.as_deref()?;
        Some(self.pods.subscribe(ns, JOB_NAME_LABEL, &job.name))
    }

    /// Waits for `job`'s verdict until `deadline` or `stop`, holding a terminal one while a pod
    /// of the Job may still run where no kubelet reports. `on_hold` is told the pod that holds
    /// it up whenever that changes (`None` once nothing does while the Job runs on; not at the
    /// verdict, which ends the claim anyway), for the order to say so. With the end comes the
    /// record of the disruptions its pods went through (`super::disrupted`).
    pub async fn job_end(
        &self,
        job: &Applied,
        pods: Option<PodSubscription>,
        deadline: Instant,
        stop: &CancellationToken,
        mut on_hold: impl FnMut(Option<&Hold>),
    ) -> (JobEnd, Record) {
        let mut record = Record::default();
        let Some(mut pods) = pods else {
            let end = self
                .watches
                .wait_for(job, deadline, stop, job_verdict)
                .await;
            return (JobEnd::Watched(end), record);
        };
        let mut nodes = self.nodes.changes();
        let until = tokio::time::Instant::from_std(deadline);
        let mut said: Option<Hold> = None;
        let mut gone = Gone::new();
        // One wait on the Job for as long as it gives no verdict, so that what it counts (how
        // long the Job has been out of the store) is not reset by pod or node events.
        let mut watch = Box::pin(self.watches.wait_for(job, deadline, stop, job_verdict));
        loop {
            let hold = self.hold(&pods, &mut gone, &mut record);
            if hold != said {
                on_hold(hold.as_ref());
                said = hold.clone();
            }
            let end = tokio::select! {
                end = &mut watch => end,
                // A pod or a node changed, or a pod went (the pod watch says nothing of that):
                // whether one holds the verdict may have changed too. Every state of a pod is
                // recorded: an evicted pod may be gone at the next look.
                Some(pod) = pods.next() => {
                    record.look(&pod);
                    continue;
                }
                Ok(()) = nodes.changed() => continue,
                _ = tokio::time::sleep(RECHECK) => continue,
            };
            let WatchEnd::Verdict(verdict) = end else {
                if end == WatchEnd::DeadlineReached
                    && let Some(hold) = hold.filter(|h| h.unreachable)
                {
                    return (JobEnd::HeldAtDeadline(hold), record);
                }
                return (JobEnd::Watched(end), record);
            };
            // The verdict is there: before it is taken, the pods and nodes are listed, so a pod
            // on a lost node is not missed for want of a first list (bounded: a list that does
            // not come leaves the pods' own conditions to go by).
            tokio::select! {
                _ = tokio::time::timeout(LISTED_WAIT, async {
                    tokio::join!(pods.listed(), self.nodes.listed())
                }) => {}
                _ = stop.cancelled() => return (JobEnd::Watched(WatchEnd::Stopped), record),
            }
            // Taken without telling `on_hold` that nothing holds it any more: the claim ends
            // with the report, and a heartbeat sent now would only race the complete.
            while let Some(pod) = pods.try_next() {
                record.look(&pod);
            }
            let Some(hold) = self.hold(&pods, &mut gone, &mut record) else {
                return (JobEnd::Watched(WatchEnd::Verdict(verdict)), record);
            };
            if said.as_ref() != Some(&hold) {
                on_hold(Some(&hold));
                said = Some(hold.clone());
            }
            tracing::info!(job = %job.display(), pod = %hold.pod, node = %hold.node,
                "the Job has a verdict, but its pod may still run where no kubelet reports; holding it (docs/design.md §12)");
            tokio::select! {
                Some(pod) = pods.next() => record.look(&pod),
                _ = nodes.changed() => {}
                _ = tokio::time::sleep(RECHECK) => {}
                _ = stop.cancelled() => return (JobEnd::Watched(WatchEnd::Stopped), record),
                _ = tokio::time::sleep_until(until) => {
                    return (JobEnd::HeldAtDeadline(hold), record);
                }
            }
            // The verdict is read again (at once, from the store) after the next look.
            watch = Box::pin(self.watches.wait_for(job, deadline, stop, job_verdict));
        }
    }

    /// The hold the order says now, remembering in `gone` the held pods that may still run
    /// after they are gone from the API server (`disruption::with_gone`), and in `record` what
    /// the pods say of disruptions, with the held pods lost with their nodes.
    fn hold(&self, pods: &PodSubscription, gone: &mut Gone, record: &mut Record) -> Option<Hold> {
        let current = pods.current();
        for pod in &current {
            record.look(pod);
        }
        let state = |node: &str| self.nodes.state(node);
        let held = holds(current.iter().map(|p| p.as_ref()), state);
        let present: std::collections::BTreeSet<String> = current
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        for (pod, node) in gone.iter() {
            if !present.contains(pod) && state(node) == NodeState::Stopped {
                record.lost_with_node(pod, node);
            }
        }
        let (held, remember) = with_gone(held, &present, gone, state);
        *gone = remember;
        pick(held)
    }

    /// Makes way for a new run of a disrupted Job (docs/design.md §12 `retryOnDisruption:
    /// safe`): waits until no pod of `job` may still run (each one never bound, reported stopped
    /// by its kubelet, or on a node deleted or out-of-service), then deletes the Job in the
    /// foreground and waits until it is gone, so that the next attempt's Job of the same name
    /// starts anew and cannot overlap this one. All before `until`; `Err` says what was not done.
    pub async fn clear_for_rerun(
        &self,
        job: &Applied,
        until: Instant,
        stop: &CancellationToken,
    ) -> Result<(), String> {
        if let Some(ns) = job.namespace.as_deref() {
            let mut pods = self.pods.subscribe(ns, JOB_NAME_LABEL, &job.name);
            let mut nodes = self.nodes.changes();
            let by = tokio::time::Instant::from_std(until);
            tokio::select! {
                _ = pods.listed() => {}
                _ = stop.cancelled() => return Err("stopped".into()),
                _ = tokio::time::sleep_until(by) => {
                    return Err("the Job's pods could not be listed in time".into());
                }
            }
            loop {
                let running: Vec<String> = pods
                    .current()
                    .iter()
                    .filter(|p| self.may_run(p))
                    .filter_map(|p| p.metadata.name.clone())
                    .collect();
                if running.is_empty() {
                    break;
                }
                tokio::select! {
                    Some(_) = pods.next() => {}
                    Ok(()) = nodes.changed() => {}
                    _ = tokio::time::sleep(RECHECK) => {}
                    _ = stop.cancelled() => return Err("stopped".into()),
                    _ = tokio::time::sleep_until(by) => {
                        return Err(format!(
                            "pod(s) {} had not stopped in time",
                            running.join(", ")
                        ));
                    }
                }
            }
        }
        let api = job.api(self.watches.client());
        match api
            .delete(&job.name, &kube::api::DeleteParams::foreground())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(format!("deleting the Job failed: {}", api_message(&e))),
        }
        let gone = |_: &serde_json::Value| ObjectVerdict::Pending;
        match self.watches.wait_for(job, until, stop, gone).await {
            WatchEnd::Deleted => Ok(()),
            WatchEnd::Stopped => Err("stopped".into()),
            _ => Err("the Job was still being deleted".into()),
        }
    }

    /// Whether `pod` may still run: bound to a node that is not stopped, and not reported
    /// stopped by its kubelet.
    fn may_run(&self, pod: &k8s_openapi::api::core::v1::Pod) -> bool {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
            return false;
        };
        !stopped_by_kubelet(pod) && self.nodes.state(node) != NodeState::Stopped
    }
}
