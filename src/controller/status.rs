//! WorkOrder status as a pure function of the queue row (DESIGN.md §6), so the mirror is tested
//! without a cluster.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::crd::{WorkOrderPhase, WorkOrderStatus};
use crate::queue::{Lookup, OrderStatus, Outcome};

fn rfc3339(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// A condition that keeps its `lastTransitionTime` when its status did not change.
fn condition(
    prev: Option<&WorkOrderStatus>,
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let status = if status { "True" } else { "False" }.to_string();
    let last = prev
        .and_then(|p| p.conditions.iter().find(|c| c.type_ == type_))
        .filter(|c| c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: type_.to_string(),
        status,
        reason: reason.to_string(),
        message,
        last_transition_time: last,
        observed_generation: generation,
    }
}

/// Status for a WorkOrder whose queue row is `lookup` (`Unknown` does not occur once created).
pub fn from_queue(
    lookup: &Lookup,
    prev: Option<&WorkOrderStatus>,
    generation: Option<i64>,
    now: &Time,
) -> WorkOrderStatus {
    let mut s = WorkOrderStatus {
        observed_generation: generation,
        ..Default::default()
    };
    let (phase, reason) = match lookup {
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
            match o.status {
                OrderStatus::Pending => (WorkOrderPhase::Pending, "Pending"),
                OrderStatus::Claimed => (WorkOrderPhase::Claimed, "Claimed"),
                OrderStatus::RetryPending => (WorkOrderPhase::RetryPending, "RetryPending"),
            }
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
            match e.outcome {
                Outcome::Succeeded => (WorkOrderPhase::Succeeded, "Succeeded"),
                Outcome::Failed => (WorkOrderPhase::Failed, "Failed"),
                Outcome::Cancelled => (WorkOrderPhase::Cancelled, "Cancelled"),
            }
        }
        Lookup::Unknown => (WorkOrderPhase::Pending, "Pending"),
    };
    s.phase = Some(phase);
    let id = s.work_order_id.clone().unwrap_or_default();
    let finished = matches!(lookup, Lookup::Finished(_));
    s.conditions = vec![
        condition(
            prev,
            "Ready",
            true,
            "Queued",
            format!("accepted into the queue as work order {id}"),
            generation,
            now,
        ),
        condition(
            prev,
            "Completed",
            finished,
            reason,
            match (finished, &s.message) {
                (true, Some(m)) => m.clone(),
                (true, None) => format!("work order {}", reason.to_lowercase()),
                (false, _) => format!("work order is {reason}"),
            },
            generation,
            now,
        ),
    ];
    s
}

/// Status for a WorkOrder the server rejected (a problem the schema cannot see, e.g. YAML).
pub fn rejected(
    message: &str,
    prev: Option<&WorkOrderStatus>,
    generation: Option<i64>,
    now: &Time,
) -> WorkOrderStatus {
    WorkOrderStatus {
        phase: Some(WorkOrderPhase::Failed),
        message: Some(message.to_string()),
        observed_generation: generation,
        conditions: vec![
            condition(
                prev,
                "Ready",
                false,
                "Rejected",
                message.to_string(),
                generation,
                now,
            ),
            condition(
                prev,
                "Completed",
                true,
                "Rejected",
                message.to_string(),
                generation,
                now,
            ),
        ],
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::{LogEntry, Targeting, WorkOrder, WorkType};

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::now())
    }

    fn active(status: OrderStatus) -> WorkOrder {
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
            tenant: None,
            targeting: Targeting::default(),
            retry_count: 1,
            reclaim_count: 0,
            last_error: Some("boom".into()),
            last_error_at: Some(t),
            next_retry_after: Some(t),
            claimed_by: None,
            claimed_at: None,
            claim_id: None,
            lease_seconds: None,
            lease_expires_at: None,
            created_at: t,
            updated_at: t,
        }
    }

    #[test]
    fn retry_pending_shows_next_retry_after_and_keeps_transition_times() {
        let first = from_queue(
            &Lookup::Active(Box::new(active(OrderStatus::RetryPending))),
            None,
            Some(1),
            &now(),
        );
        assert_eq!(first.phase, Some(WorkOrderPhase::RetryPending));
        assert!(first.next_retry_after.is_some());
        assert_eq!(first.last_error.as_deref(), Some("boom"));
        let later = Time(
            k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(60),
        );
        let again = from_queue(
            &Lookup::Active(Box::new(active(OrderStatus::Pending))),
            Some(&first),
            Some(1),
            &later,
        );
        assert_eq!(again.phase, Some(WorkOrderPhase::Pending));
        assert!(again.next_retry_after.is_none());
        assert_eq!(
            again.conditions[0].last_transition_time, first.conditions[0].last_transition_time,
            "Ready stayed True"
        );
    }

    #[test]
    fn finished_orders_complete_with_their_message() {
        let o = active(OrderStatus::Claimed);
        let entry = LogEntry {
            id: o.id,
            work_type: o.work_type,
            yaml_content: None,
            outcome: Outcome::Succeeded,
            success: true,
            message: Some("Jobs succeeded: pi".into()),
            max_retries: 3,
            backoff_seconds: 10,
            claim_timeout_seconds: 3600,
            max_reclaims: 5,
            tenant: None,
            targeting: Targeting::default(),
            retry_count: 0,
            reclaim_count: 0,
            last_error: None,
            last_error_at: None,
            claimed_by: Some(uuid::Uuid::from_u128(9)),
            claim_id: None,
            claimed_at: Some(o.created_at),
            created_at: o.created_at,
            completed_at: o.created_at,
        };
        let s = from_queue(&Lookup::Finished(Box::new(entry)), None, Some(1), &now());
        assert_eq!(s.phase, Some(WorkOrderPhase::Succeeded));
        let completed = s
            .conditions
            .iter()
            .find(|c| c.type_ == "Completed")
            .unwrap();
        assert_eq!(
            (completed.status.as_str(), completed.reason.as_str()),
            ("True", "Succeeded")
        );
        assert_eq!(completed.message, "Jobs succeeded: pi");
        let r = rejected("yaml_content document 1 has no kind", None, Some(1), &now());
        assert_eq!(r.phase, Some(WorkOrderPhase::Failed));
        assert_eq!(r.conditions[0].status, "False");
    }
}
