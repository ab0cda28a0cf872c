//! WorkOrder status as a pure function of the queue row (docs/design.md §6), so the mirror and its
//! conditions are tested without a cluster.
//!
//! The conditions follow the table in docs/design.md §6, which is what `kubectl wait`, kstatus (Flux
//! health checks, Helm 4 `--wait`) and the Argo CD health script in `docs/health/argocd/` read:
//!
//! | phase | Ready | Completed | Reconciling | Stalled |
//! |---|---|---|---|---|
//! | not yet queued, Pending, Claimed, RetryPending | False (reason = phase) | False | True | — |
//! | Succeeded | True | True | — | — |
//! | Failed, Rejected, Cancelled | False (reason = outcome) | True | — | True (message = why) |
//!
//! Beside them, `Schedulable` (docs/design.md §10, `controller::schedulable`) says whether an agent can take the
//! order. kstatus, Flux and Argo CD read none of it: a waiting order stays in progress.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::crd::{WorkOrderPhase, WorkOrderStatus};
use crate::queue::{Lookup, OrderStatus, Outcome};

/// Reason of every condition while the queue row does not exist yet (the first reconcile, or the
/// queue was unreachable when the controller tried to create it).
pub const NOT_QUEUED: &str = "NotQueued";
/// Reason (and Event reason) of an order the queue refused: a problem the CRD schema cannot see.
pub const REJECTED: &str = "Rejected";
/// Longest condition message, in characters; the result message in `status.message` is kept whole.
const MAX_CONDITION_MESSAGE: usize = 2000;

fn rfc3339(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// A condition of the standard shape that keeps its `lastTransitionTime` while its status does
/// not change (the Kubernetes API conventions' meaning of the field).
pub(super) fn condition(
    prev: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let status = if status { "True" } else { "False" }.to_string();
    let last = prev
        .iter()
        .find(|c| c.type_ == type_)
        .filter(|c| c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: type_.to_string(),
        status,
        reason: reason.to_string(),
        message: message.chars().take(MAX_CONDITION_MESSAGE).collect(),
        last_transition_time: last,
        observed_generation: generation,
    }
}

/// Where an order stands, as the conditions see it.
enum Stage {
    /// Not finished: not yet queued, Pending, Claimed or RetryPending.
    Running,
    Succeeded,
    /// Failed, Rejected or Cancelled: finished without success; retrying the same spec will not help.
    Ended,
}

/// The conditions of docs/design.md §6 for `stage`, all with the same reason and message.
fn conditions(
    stage: Stage,
    reason: &str,
    message: &str,
    prev: Option<&WorkOrderStatus>,
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    let prev = prev.map(|p| p.conditions.as_slice()).unwrap_or_default();
    let c = |type_: &str, status: bool| {
        condition(prev, type_, status, reason, message, generation, now)
    };
    match stage {
        Stage::Running => vec![
            c("Ready", false),
            c("Completed", false),
            c("Reconciling", true),
        ],
        Stage::Succeeded => vec![c("Ready", true), c("Completed", true)],
        Stage::Ended => vec![c("Ready", false), c("Completed", true), c("Stalled", true)],
    }
}

/// `text` as the end of a sentence: `": text"`, or `"."` when there is nothing to add.
fn because(text: Option<&str>) -> String {
    match text.map(str::trim).filter(|t| !t.is_empty()) {
        Some(t) => format!(": {t}"),
        None => ".".to_string(),
    }
}

/// The current time as the API server keeps it: whole seconds (`metav1.Time` is written without
/// a fraction). A status stamped with it reads back equal to what was written, which is how the
/// controller tells that its cache has caught up with its own write (`controller::burst`, its record of written statuses).
pub fn now() -> Time {
    Time(Timestamp::from_second(Timestamp::now().as_second()).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// Status of WorkOrder `name` whose queue row is `lookup`. `Lookup::Unknown` is an order not
/// queued yet (see [`not_queued`]).
pub fn from_queue(
    name: &str,
    lookup: &Lookup,
    prev: Option<&WorkOrderStatus>,
    generation: Option<i64>,
    now: &Time,
) -> WorkOrderStatus {
    let mut s = WorkOrderStatus {
        observed_generation: generation,
        ..Default::default()
    };
    let (phase, stage, reason, message) = match lookup {
        Lookup::Unknown => return not_queued(name, None, prev, generation, now),
        Lookup::Active(o) => {
            s.work_order_id = Some(o.id.to_string());
            s.claimed_by = o.claimed_by.map(|a| a.to_string());
            s.claimed_at = o.claimed_at.map(rfc3339);
            s.retry_count = Some(o.retry_count);
            s.reclaim_count = Some(o.reclaim_count);
            s.last_error = o.last_error.clone();
            s.last_error_at = o.last_error_at.map(rfc3339);
            s.next_retry_after = (o.status == OrderStatus::RetryPending)
                .then_some(o.next_retry_after)
                .flatten()
                .map(rfc3339);
            let (phase, reason, message) = match o.status {
                OrderStatus::Pending => (
                    WorkOrderPhase::Pending,
                    "Pending",
                    format!("WorkOrder {name} is waiting in the queue for an agent to claim it."),
                ),
                OrderStatus::Claimed => (
                    WorkOrderPhase::Claimed,
                    "Claimed",
                    format!(
                        "WorkOrder {name} was claimed by agent {} at {} and is being worked on.",
                        s.claimed_by.as_deref().unwrap_or("(unknown)"),
                        s.claimed_at.as_deref().unwrap_or("(unknown time)"),
                    ),
                ),
                // A disrupted attempt run again is due the moment its error was written
                // (`sql/requeue_disrupted.sql`); a failed one waits at least a second of backoff.
                OrderStatus::RetryPending
                    if o.next_retry_after.is_some() && o.next_retry_after == o.last_error_at =>
                {
                    (
                        WorkOrderPhase::RetryPending,
                        "RetryPending",
                        format!(
                            "WorkOrder {name}'s attempt was disrupted, not failed, and runs again \
                             at once (reclaim {} of {}; no retry spent){}",
                            o.reclaim_count,
                            o.max_reclaims,
                            because(o.last_error.as_deref()),
                        ),
                    )
                }
                OrderStatus::RetryPending => (
                    WorkOrderPhase::RetryPending,
                    "RetryPending",
                    format!(
                        "WorkOrder {name} failed attempt {} of {} and will be retried after {}{}",
                        o.retry_count,
                        o.max_retries + 1,
                        s.next_retry_after.as_deref().unwrap_or("(unknown time)"),
                        because(o.last_error.as_deref()),
                    ),
                ),
            };
            (phase, Stage::Running, reason, message)
        }
        Lookup::Finished(e) => {
            s.work_order_id = Some(e.id.to_string());
            s.claimed_by = e.claimed_by.map(|a| a.to_string());
            s.claimed_at = e.claimed_at.map(rfc3339);
            s.retry_count = Some(e.retry_count);
            s.reclaim_count = Some(e.reclaim_count);
            s.last_error = e.last_error.clone();
            s.last_error_at = e.last_error_at.map(rfc3339);
            s.completed_at = Some(rfc3339(e.completed_at));
            s.message = e.message.clone();
            let why = because(e.message.as_deref());
            match e.outcome {
                Outcome::Succeeded => (
                    WorkOrderPhase::Succeeded,
                    Stage::Succeeded,
                    "Succeeded",
                    format!("WorkOrder {name} succeeded{why}"),
                ),
                Outcome::Failed => (
                    WorkOrderPhase::Failed,
                    Stage::Ended,
                    "Failed",
                    format!("WorkOrder {name} failed{why}"),
                ),
                Outcome::Cancelled => (
                    WorkOrderPhase::Cancelled,
                    Stage::Ended,
                    "Cancelled",
                    format!("WorkOrder {name} was cancelled{why}"),
                ),
            }
        }
    };
    s.phase = Some(phase);
    s.conditions = conditions(stage, reason, &message, prev, generation, now);
    s
}

/// Status of WorkOrder `name` before its queue row exists: written on the first reconcile that
/// cannot create the row (`why`: the queue's error), so no tool mistakes a fresh order for a
/// finished one (kstatus reads an object without conditions as Current).
pub fn not_queued(
    name: &str,
    why: Option<&str>,
    prev: Option<&WorkOrderStatus>,
    generation: Option<i64>,
    now: &Time,
) -> WorkOrderStatus {
    let message = match why {
        Some(why) => format!("WorkOrder {name} is not in the queue yet; will retry: {why}"),
        None => format!("WorkOrder {name} is not in the queue yet."),
    };
    WorkOrderStatus {
        observed_generation: generation,
        conditions: conditions(Stage::Running, NOT_QUEUED, &message, prev, generation, now),
        ..Default::default()
    }
}

/// Status of WorkOrder `name` that the queue refused (`why`: a problem the CRD schema cannot
/// see, e.g. YAML that does not parse). Phase `Failed`, reason `Rejected`; nothing was queued.
pub fn rejected(
    name: &str,
    why: &str,
    prev: Option<&WorkOrderStatus>,
    generation: Option<i64>,
    now: &Time,
) -> WorkOrderStatus {
    let message = format!(
        "WorkOrder {name} was rejected by the queue{}",
        because(Some(why))
    );
    // The first rejection's time stays the finish time (spec is immutable, so it never changes).
    let completed_at = prev
        .filter(|p| p.phase == Some(WorkOrderPhase::Failed))
        .and_then(|p| p.completed_at.clone())
        .unwrap_or_else(|| rfc3339_time(now));
    WorkOrderStatus {
        phase: Some(WorkOrderPhase::Failed),
        message: Some(why.to_string()),
        completed_at: Some(completed_at),
        observed_generation: generation,
        conditions: conditions(Stage::Ended, REJECTED, &message, prev, generation, now),
        ..Default::default()
    }
}

fn rfc3339_time(t: &Time) -> String {
    t.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// When a finished WorkOrder is due for deletion under `spec.ttlSecondsAfterFinished`
/// (docs/design.md §6, like a Job's TTL): `status.completedAt` plus the TTL. `None` while the order
/// runs, or without a TTL.
pub fn delete_at(ttl_seconds: Option<i32>, status: &WorkOrderStatus) -> Option<Timestamp> {
    let ttl = ttl_seconds?;
    let finished = matches!(
        status.phase,
        Some(WorkOrderPhase::Succeeded | WorkOrderPhase::Failed | WorkOrderPhase::Cancelled)
    );
    if !finished {
        return None;
    }
    let completed: Timestamp = status.completed_at.as_deref()?.parse().ok()?;
    Some(completed + SignedDuration::from_secs(i64::from(ttl.max(0))))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::queue::{LogEntry, Targeting, WorkOrder, WorkType};

    fn now() -> Time {
        Time(Timestamp::now())
    }

    #[test]
    fn a_status_stamped_now_reads_back_as_written() {
        let s = from_queue(
            "wo",
            &queued(OrderStatus::Pending),
            None,
            Some(1),
            &super::now(),
        );
        let read: WorkOrderStatus =
            serde_json::from_value(serde_json::to_value(&s).unwrap()).unwrap();
        assert_eq!(read, s);
    }

    /// An active order in `status`, every time field set to now (shared with the other
    /// controller tests).
    pub(crate) fn active(status: OrderStatus) -> WorkOrder {
        let t = chrono::Utc::now();
        WorkOrder {
            id: uuid::Uuid::from_u128(7),
            work_type: WorkType::Custom,
            yaml_content: None,
            status,
            max_retries: 3,
            backoff_seconds: 10,
            claim_timeout_seconds: 3600,
            max_reclaims: 5,
            priority: 0,
            concurrency: None,
            tenant: None,
            targeting: Targeting::default(),
            retry_on_disruption: Default::default(),
            retry_count: 1,
            reclaim_count: 0,
            last_error: Some("boom".into()),
            last_error_at: Some(t),
            // A failed attempt's backoff: a retry due when its error was written is a
            // disrupted re-run.
            next_retry_after: Some(t + chrono::Duration::seconds(60)),
            claimed_by: Some(uuid::Uuid::from_u128(9)),
            claimed_at: Some(t),
            claim_id: None,
            lease_seconds: None,
            lease_expires_at: None,
            rerun_of: None,
            attempts: None,
            waiting: None,
            created_at: t,
            updated_at: t,
        }
    }

    /// [`active`]'s order as the log holds it once it ended in `outcome`.
    pub(crate) fn finished(outcome: Outcome, message: Option<&str>) -> Lookup {
        let o = active(OrderStatus::Claimed);
        Lookup::Finished(Box::new(LogEntry {
            id: o.id,
            work_type: o.work_type,
            yaml_content: None,
            outcome,
            success: outcome == Outcome::Succeeded,
            message: message.map(str::to_string),
            max_retries: o.max_retries,
            backoff_seconds: o.backoff_seconds,
            claim_timeout_seconds: o.claim_timeout_seconds,
            max_reclaims: o.max_reclaims,
            priority: o.priority,
            concurrency: o.concurrency,
            tenant: o.tenant,
            targeting: o.targeting,
            retry_on_disruption: o.retry_on_disruption,
            retry_count: 0,
            reclaim_count: 0,
            last_error: None,
            last_error_at: None,
            claimed_by: o.claimed_by,
            claim_id: None,
            claimed_at: o.claimed_at,
            rerun_of: None,
            attempts: None,
            created_at: o.created_at,
            completed_at: o.created_at,
        }))
    }

    /// `(type, status, reason)` of every condition, in order.
    fn table(s: &WorkOrderStatus) -> Vec<(String, String, String)> {
        s.conditions
            .iter()
            .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
            .collect()
    }

    fn row(t: &str, s: &str, r: &str) -> (String, String, String) {
        (t.into(), s.into(), r.into())
    }

    /// The status of WorkOrder `demo` (generation 1, no status before) for `lookup`, now.
    fn fresh(lookup: &Lookup) -> WorkOrderStatus {
        from_queue("demo", lookup, None, Some(1), &now())
    }

    /// An order in the queue in `status`.
    fn queued(status: OrderStatus) -> Lookup {
        Lookup::Active(Box::new(active(status)))
    }

    #[test]
    fn every_phase_gets_the_conditions_of_the_design_table() {
        let active_cases = [
            (OrderStatus::Pending, "Pending"),
            (OrderStatus::Claimed, "Claimed"),
            (OrderStatus::RetryPending, "RetryPending"),
        ];
        for (status, reason) in active_cases {
            let s = fresh(&queued(status));
            assert_eq!(
                table(&s),
                vec![
                    row("Ready", "False", reason),
                    row("Completed", "False", reason),
                    row("Reconciling", "True", reason)
                ],
                "{reason}"
            );
        }
        let s = not_queued("demo", Some("database unavailable"), None, Some(1), &now());
        assert_eq!(
            table(&s),
            vec![
                row("Ready", "False", NOT_QUEUED),
                row("Completed", "False", NOT_QUEUED),
                row("Reconciling", "True", NOT_QUEUED)
            ]
        );
        assert_eq!(s.phase, None);
        let s = fresh(&finished(Outcome::Succeeded, Some("Jobs succeeded: pi")));
        assert_eq!(
            table(&s),
            vec![
                row("Ready", "True", "Succeeded"),
                row("Completed", "True", "Succeeded")
            ]
        );
        for (outcome, reason) in [
            (Outcome::Failed, "Failed"),
            (Outcome::Cancelled, "Cancelled"),
        ] {
            let s = fresh(&finished(outcome, Some("why")));
            assert_eq!(
                table(&s),
                vec![
                    row("Ready", "False", reason),
                    row("Completed", "True", reason),
                    row("Stalled", "True", reason)
                ]
            );
        }
        let s = rejected("demo", "yaml_content does not parse", None, Some(1), &now());
        assert_eq!(
            table(&s),
            vec![
                row("Ready", "False", REJECTED),
                row("Completed", "True", REJECTED),
                row("Stalled", "True", REJECTED)
            ]
        );
        assert_eq!(s.phase, Some(WorkOrderPhase::Failed));
        assert!(
            s.completed_at.is_some(),
            "a rejection is a finish time for the TTL"
        );
    }

    #[test]
    fn messages_are_sentences_naming_the_work_order() {
        let s = from_queue(
            "demo",
            &finished(Outcome::Failed, Some("the Job pi failed")),
            None,
            Some(3),
            &now(),
        );
        let stalled = s.conditions.iter().find(|c| c.type_ == "Stalled").unwrap();
        assert_eq!(stalled.message, "WorkOrder demo failed: the Job pi failed");
        assert_eq!(stalled.observed_generation, Some(3));
        assert_eq!(
            s.observed_generation,
            Some(3),
            "in the same status as the conditions"
        );
        assert_eq!(
            s.message.as_deref(),
            Some("the Job pi failed"),
            "the result message is kept as is"
        );
        let s = fresh(&finished(Outcome::Succeeded, None));
        assert_eq!(s.conditions[0].message, "WorkOrder demo succeeded.");
        let s = fresh(&queued(OrderStatus::RetryPending));
        assert!(
            s.conditions[0]
                .message
                .starts_with("WorkOrder demo failed attempt 1 of 4 and will be retried after ")
                && s.conditions[0].message.ends_with(": boom"),
            "{}",
            s.conditions[0].message
        );
        let mut rerun = active(OrderStatus::RetryPending);
        rerun.next_retry_after = rerun.last_error_at;
        rerun.reclaim_count = 1;
        let s = fresh(&Lookup::Active(Box::new(rerun)));
        assert_eq!(
            s.conditions[0].message,
            "WorkOrder demo's attempt was disrupted, not failed, and runs again at once \
             (reclaim 1 of 5; no retry spent): boom"
        );
        let long = "x".repeat(5000);
        let s = rejected("demo", &long, None, Some(1), &now());
        assert_eq!(
            s.conditions[0].message.chars().count(),
            MAX_CONDITION_MESSAGE
        );
        assert_eq!(s.message.as_deref(), Some(long.as_str()));
    }

    #[test]
    fn transition_times_move_only_when_a_status_changes() {
        let first = fresh(&queued(OrderStatus::RetryPending));
        assert!(first.next_retry_after.is_some());
        assert_eq!(first.last_error.as_deref(), Some("boom"));
        let later = Time(Timestamp::now() + SignedDuration::from_secs(60));
        let again = from_queue(
            "demo",
            &queued(OrderStatus::Pending),
            Some(&first),
            Some(1),
            &later,
        );
        assert_eq!(again.phase, Some(WorkOrderPhase::Pending));
        assert!(again.next_retry_after.is_none());
        assert_eq!(
            again.conditions[0].last_transition_time, first.conditions[0].last_transition_time,
            "Ready stayed False"
        );
        let done = from_queue(
            "demo",
            &finished(Outcome::Succeeded, None),
            Some(&again),
            Some(1),
            &later,
        );
        assert_eq!(
            done.conditions[0].last_transition_time, later,
            "Ready turned True"
        );
    }

    #[test]
    fn the_ttl_counts_from_completion() {
        let s = fresh(&finished(Outcome::Succeeded, None));
        let completed: Timestamp = s.completed_at.as_deref().unwrap().parse().unwrap();
        assert_eq!(
            delete_at(Some(5), &s),
            Some(completed + SignedDuration::from_secs(5))
        );
        assert_eq!(delete_at(None, &s), None);
        let running = fresh(&queued(OrderStatus::Claimed));
        assert_eq!(delete_at(Some(5), &running), None);
        let r = rejected("demo", "bad", None, Some(1), &now());
        assert!(delete_at(Some(0), &r).is_some());
    }
}
