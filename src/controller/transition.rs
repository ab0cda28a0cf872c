//! The Kubernetes Event a WorkOrder gets when its phase changes (docs/design.md §6), as a pure
//! function of the status before and after, beside `status` which computes the status itself.
//! The WorkOrder reconcile records what this returns after writing the status.
//!
//! | new phase | type | reason | note |
//! |---|---|---|---|
//! | `Pending`, first status | Normal | `Queued` | the queue's order id |
//! | `Pending`, after a claim | Normal | `Requeued` | the claim was released |
//! | `Claimed` | Normal | `Claimed` | the agent |
//! | `RetryPending` | Warning | `AttemptFailed` | attempt, error, retry time |
//! | not finished, retries unchanged, reclaims up, a new `lastErrorAt` | Warning | `AttemptDisrupted` | error (§12) |
//! | `Succeeded` | Normal | `Succeeded` | the result message |
//! | `Failed` | Warning | `Failed`, or `Rejected` when the queue refused the spec | the message |
//! | `Cancelled` | Normal | `Cancelled` | the message |
//!
//! No Event when the phase is unchanged or absent (not yet queued), but for `AttemptDisrupted`: a
//! disrupted attempt run again is due at once, so the controller often sees `Claimed` again and
//! never `RetryPending`; the counters tell it (only a disrupted re-run moves the reclaims and the
//! last error together, the reaper's reclaims leave the error alone).

use kube::runtime::events::{Event as KubeEvent, EventType};

use super::status;
use crate::crd::{WorkOrderPhase, WorkOrderStatus};

/// The Event for the change from `prev` to `new`, or `None` when the phase did not change.
pub fn phase_event(prev: Option<&WorkOrderStatus>, new: &WorkOrderStatus) -> Option<KubeEvent> {
    if let Some(event) = prev.and_then(|prev| disrupted_rerun(prev, new)) {
        return Some(event);
    }
    let old_phase = prev.and_then(|p| p.phase);
    if old_phase == new.phase {
        return None;
    }
    let message = || new.message.clone().unwrap_or_default();
    let rejected = new.conditions.iter().any(|c| c.reason == status::REJECTED);
    let (type_, reason, note) = match new.phase? {
        WorkOrderPhase::Claimed => (
            EventType::Normal,
            "Claimed",
            format!(
                "claimed by agent {}",
                new.claimed_by.as_deref().unwrap_or("?")
            ),
        ),
        WorkOrderPhase::RetryPending => (
            EventType::Warning,
            "AttemptFailed",
            format!(
                "attempt {} failed: {}; retry after {}",
                new.retry_count.unwrap_or(0),
                new.last_error.as_deref().unwrap_or(""),
                new.next_retry_after.as_deref().unwrap_or("?")
            ),
        ),
        WorkOrderPhase::Succeeded => (EventType::Normal, "Succeeded", message()),
        WorkOrderPhase::Failed if rejected => (EventType::Warning, "Rejected", message()),
        WorkOrderPhase::Failed => (EventType::Warning, "Failed", message()),
        WorkOrderPhase::Cancelled => (EventType::Normal, "Cancelled", message()),
        WorkOrderPhase::Pending if old_phase.is_none() => (
            EventType::Normal,
            "Queued",
            format!(
                "queued as work order {}",
                new.work_order_id.as_deref().unwrap_or("")
            ),
        ),
        WorkOrderPhase::Pending => (
            EventType::Normal,
            "Requeued",
            "the claim was released; waiting for an agent".to_string(),
        ),
    };
    Some(KubeEvent {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    })
}

/// The Event of a disrupted attempt run again (docs/design.md §12), whatever the phase moved to
/// meanwhile: it spent no retry, took a reclaim and left its error. `None` otherwise, and once
/// the order finished (its own Event says the end).
fn disrupted_rerun(prev: &WorkOrderStatus, new: &WorkOrderStatus) -> Option<KubeEvent> {
    let active = matches!(
        new.phase?,
        WorkOrderPhase::Pending | WorkOrderPhase::Claimed | WorkOrderPhase::RetryPending
    );
    let rerun = active
        && prev.retry_count == new.retry_count
        && prev.reclaim_count < new.reclaim_count
        && new.last_error_at.is_some()
        && prev.last_error_at != new.last_error_at;
    rerun.then(|| KubeEvent {
        type_: EventType::Warning,
        reason: "AttemptDisrupted".into(),
        note: Some(format!(
            "the attempt was disrupted, not failed: {}; it runs again (no retry spent)",
            new.last_error.as_deref().unwrap_or("")
        )),
        action: "Reconcile".into(),
        secondary: None,
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    use super::*;
    use WorkOrderPhase::*;

    fn at(phase: Option<WorkOrderPhase>) -> WorkOrderStatus {
        WorkOrderStatus {
            phase,
            work_order_id: Some("0f0f".into()),
            claimed_by: Some("agent-1".into()),
            retry_count: Some(2),
            last_error: Some("exit 1".into()),
            next_retry_after: Some("2026-12-03T10:00:00Z".into()),
            message: Some("the message".into()),
            ..Default::default()
        }
    }

    /// `(type, reason, note)` of the Event, if any.
    fn event(
        from: Option<WorkOrderPhase>,
        to: &WorkOrderStatus,
    ) -> Option<(String, String, String)> {
        let prev = from.map(|p| at(Some(p)));
        phase_event(prev.as_ref(), to).map(|e| {
            let kind = match e.type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            };
            (kind.to_string(), e.reason, e.note.unwrap_or_default())
        })
    }

    fn row(t: &str, r: &str, n: &str) -> Option<(String, String, String)> {
        Some((t.into(), r.into(), n.into()))
    }

    #[test]
    fn every_phase_change_has_the_event_of_the_table() {
        let table = [
            (
                None,
                Pending,
                row("Normal", "Queued", "queued as work order 0f0f"),
            ),
            (
                Some(Claimed),
                Pending,
                row(
                    "Normal",
                    "Requeued",
                    "the claim was released; waiting for an agent",
                ),
            ),
            (
                Some(Pending),
                Claimed,
                row("Normal", "Claimed", "claimed by agent agent-1"),
            ),
            (
                Some(Claimed),
                RetryPending,
                row(
                    "Warning",
                    "AttemptFailed",
                    "attempt 2 failed: exit 1; retry after 2026-12-03T10:00:00Z",
                ),
            ),
            (
                Some(Claimed),
                Succeeded,
                row("Normal", "Succeeded", "the message"),
            ),
            (
                Some(Claimed),
                Failed,
                row("Warning", "Failed", "the message"),
            ),
            (
                Some(Pending),
                Cancelled,
                row("Normal", "Cancelled", "the message"),
            ),
            // Unchanged phases say nothing, whatever else changed.
            (Some(Pending), Pending, None),
            (Some(Claimed), Claimed, None),
        ];
        for (from, to, want) in table {
            assert_eq!(event(from, &at(Some(to))), want, "{from:?} -> {to:?}");
        }
    }

    #[test]
    fn a_disrupted_attempt_run_again_is_not_a_failed_one() {
        let claimed = WorkOrderStatus {
            reclaim_count: Some(0),
            last_error_at: None,
            ..at(Some(Claimed))
        };
        let disrupted = |phase| WorkOrderStatus {
            reclaim_count: Some(1),
            last_error: Some("pod p was evicted".into()),
            last_error_at: Some("2026-12-03T10:00:00Z".into()),
            ..at(Some(phase))
        };
        // Seen waiting, or already claimed again: the same Event.
        for phase in [RetryPending, Claimed, Pending] {
            let e = phase_event(Some(&claimed), &disrupted(phase)).unwrap();
            assert_eq!(e.reason, "AttemptDisrupted", "{phase:?}");
            assert_eq!(
                e.note.as_deref(),
                Some(
                    "the attempt was disrupted, not failed: pod p was evicted; it runs again (no retry spent)"
                )
            );
        }
        // A failure spends a retry, whatever the reclaims did.
        let failed = WorkOrderStatus {
            retry_count: Some(3),
            ..disrupted(RetryPending)
        };
        assert_eq!(
            phase_event(Some(&claimed), &failed).unwrap().reason,
            "AttemptFailed"
        );
        // The reaper's reclaim leaves the error as it was.
        let reclaimed = WorkOrderStatus {
            reclaim_count: Some(1),
            last_error_at: None,
            ..at(Some(Pending))
        };
        assert_eq!(
            phase_event(Some(&claimed), &reclaimed).unwrap().reason,
            "Requeued"
        );
        // The end of the order says itself.
        assert_eq!(
            phase_event(Some(&claimed), &disrupted(Failed))
                .unwrap()
                .reason,
            "Failed"
        );
    }

    #[test]
    fn a_refused_spec_is_rejected_and_no_phase_is_no_event() {
        let mut rejected = at(Some(Failed));
        rejected.conditions.push(Condition {
            type_: "Ready".into(),
            status: "False".into(),
            reason: status::REJECTED.into(),
            message: String::new(),
            last_transition_time: status::now(),
            observed_generation: None,
        });
        assert_eq!(
            event(None, &rejected),
            row("Warning", "Rejected", "the message")
        );
        assert_eq!(event(None, &at(None)), None, "not yet queued");
    }
}
