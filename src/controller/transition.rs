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
//! | `Succeeded` | Normal | `Succeeded` | the result message |
//! | `Failed` | Warning | `Failed`, or `Rejected` when the queue refused the spec | the message |
//! | `Cancelled` | Normal | `Cancelled` | the message |
//!
//! No Event when the phase is unchanged or absent (not yet queued).

use kube::runtime::events::{Event as KubeEvent, EventType};

use super::status;
use crate::crd::{WorkOrderPhase, WorkOrderStatus};

/// Longest Event note, in bytes: the API server refuses a longer one (events.k8s.io/v1
/// `note`), and the Event would be lost.
const MAX_NOTE_BYTES: usize = 1024;

/// `text` cut at a character boundary to at most [`MAX_NOTE_BYTES`].
fn cut(mut text: String) -> String {
    if text.len() > MAX_NOTE_BYTES {
        let mut end = MAX_NOTE_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// The Event for the change from `prev` to `new`, or `None` when the phase did not change.
pub fn phase_event(prev: Option<&WorkOrderStatus>, new: &WorkOrderStatus) -> Option<KubeEvent> {
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
        note: Some(cut(note)),
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

    #[test]
    fn long_notes_are_cut_to_what_the_api_server_takes() {
        let mut s = at(Some(Failed));
        s.message = Some(format!("a{}", "é".repeat(5000)));
        let note = phase_event(None, &s).unwrap().note.unwrap();
        // 1 byte, then two-byte characters: 1023 bytes is the last boundary within the limit.
        assert_eq!(note.len(), MAX_NOTE_BYTES - 1);
        assert!(note.ends_with('é'));
        assert_eq!(cut("short".into()), "short");
    }
}
