//! Who may claim what, and which claims still hold: the two rules every claim path shares, each
//! written once in Rust and once in SQL, side by side (docs/design.md §2, §3).
//!
//! **Eligibility** (docs/design.md §3). [`agent_may_see`] (rules 1–3 and the retired half of 4),
//! [`narrowed_to`] (a claim's requested work types), [`claimable_now`] (rule 5) and
//! [`at_capacity`] (the other half of 4) are the Rust side; [`ELIGIBLE_SQL`] is the SQL side, the
//! `WHERE` of an order `w` for the agent of a one-row relation `a` (columns `id`, `name`,
//! `labels`, `annotation_pairs`, `work_types`, `tenant`, `retired_at`, `requested_types`). The
//! SQL predicate (`sql/eligible.sql`) is included (`-- @include eligible.sql`, expanded by
//! `build.rs`) by `sql/pending_for_agent.sql`, the claim-next statements (through
//! `sql/handout_walk.sql` and `sql/turn_walk.sql`), `sql/queue_position.sql` and
//! `sql/backlog.sql`;
//! `tests::every_statement_that_needs_a_rule_includes_it` fails when one leaves it out, and the property
//! test `eligibility_agreement` (`queue::eligibility_agreement`, run with feature `testing`: it
//! needs PostgreSQL) runs generated agents and orders through
//! the pending list, claim by id, claim-next and the wake filter against PostgreSQL and fails
//! when any two disagree. Claim by id, the wake filter and the reasons an order waits
//! (`queue::waiting`, docs/design.md §10) use the Rust side; `queue::waiting_agreement` checks the
//! reasons against what claims do.
//!
//! **Claim liveness** (docs/design.md §2): a claim holds while its deadline
//! (`claimed_at + claim_timeout_seconds`) and its lease, if any, lie in the future.
//! [`claim_is_live`] and [`LIVE_CLAIM_SQL`] (`sql/live_claim.sql`, over a claim row `c`); the
//! heartbeat, both completes, the output fence and (negated) the reaper include the SQL,
//! checked the same way, and the property test `claim_liveness_agreement` (same module, same feature) runs both
//! sides over generated deadlines and leases around PostgreSQL's `now()`.
//!
//! Rule 5's "a due retry" is also read by `sql/claim_candidate.sql` (claim by id, as `due`),
//! `sql/promote_due_retries.sql` and `sql/oldest_claimable_age.sql` (the lag metric): all as
//! `next_retry_after <= now()`, so a retry without a time is never due; the property test
//! generates that state too.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::model::{Targeting, WorkType};

/// The SQL side of eligibility: a condition on order `w` and agent relation `a` (see the module
/// docs). Its first conjunct repeats the partial index predicate of `work_orders_claimable` and
/// `work_orders_handout`, so the planner walks those (the claims walk `work_orders_handout`, in
/// hand-out order).
pub const ELIGIBLE_SQL: &str = include_str!("sql/eligible.sql");

/// The SQL side of claim liveness: a condition on claim row `c`.
pub const LIVE_CLAIM_SQL: &str = include_str!("sql/live_claim.sql");

/// An agent's side of eligibility (docs/design.md §3).
#[derive(Debug, Clone, Default)]
pub struct AgentProfile {
    pub id: Uuid,
    pub name: String,
    pub labels: Vec<String>,
    pub annotations: BTreeMap<String, String>,
    /// Empty = all types.
    pub work_types: Vec<WorkType>,
    pub tenant: Option<String>,
    pub retired: bool,
}

/// An order's side of eligibility (docs/design.md §3).
#[derive(Debug, Clone)]
pub struct OrderProfile<'a> {
    pub work_type: WorkType,
    pub tenant: Option<&'a str>,
    pub targeting: &'a Targeting,
}

/// Whether `agent` may see `order` at all (docs/design.md §3 rules 1–3 and the retired half of 4).
/// Claimability right now is [`claimable_now`] and [`at_capacity`].
pub fn agent_may_see(agent: &AgentProfile, order: &OrderProfile<'_>) -> bool {
    if agent.retired {
        return false;
    }
    let t = order.targeting;
    let targeted = t.agent_ids.contains(&agent.id)
        || t.agent_names.contains(&agent.name)
        || t.labels.iter().any(|l| agent.labels.contains(l))
        || t.annotations
            .iter()
            .any(|(k, v)| agent.annotations.get(k) == Some(v));
    let capable = agent.work_types.is_empty() || agent.work_types.contains(&order.work_type);
    let tenant_ok = match &agent.tenant {
        None => true,
        Some(tenant) => order.tenant == Some(tenant.as_str()),
    };
    targeted && capable && tenant_ok
}

/// Whether a claim that asked for `requested` work types (empty = any) takes `work_type`.
pub fn narrowed_to(requested: &[WorkType], work_type: WorkType) -> bool {
    requested.is_empty() || requested.contains(&work_type)
}

/// docs/design.md §3 rule 5: `PENDING`, or `RETRY_PENDING` whose `next_retry_after` has passed (`due`).
pub fn claimable_now(status: super::OrderStatus, due: bool) -> bool {
    match status {
        super::OrderStatus::Pending => true,
        super::OrderStatus::RetryPending => due,
        super::OrderStatus::Claimed => false,
    }
}

/// docs/design.md §3 rule 4: an agent holding `held` claims may take no more (`None` = unlimited).
pub fn at_capacity(max_concurrency: Option<i32>, held: i64) -> bool {
    max_concurrency.is_some_and(|max| held >= i64::from(max))
}

/// docs/design.md §3 rule 4, for a multi-claim: how many more claims an agent holding `held` may
/// take (`usize::MAX` without `max_concurrency`); 0 exactly when [`at_capacity`].
pub fn room(max_concurrency: Option<i32>, held: i64) -> usize {
    match max_concurrency {
        None => usize::MAX,
        Some(max) => usize::try_from(i64::from(max) - held).unwrap_or(0),
    }
}

/// docs/design.md §2: a claim holds while `now` is before its `deadline` and before its lease end,
/// if it has a lease.
pub fn claim_is_live(
    deadline: DateTime<Utc>,
    lease_expires_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> bool {
    deadline > now && lease_expires_at.is_none_or(|lease| lease > now)
}

/// Encodes annotations as `key=value` strings, so "any annotation matches" is an array overlap
/// in SQL (`target_annotation_pairs && annotation_pairs`). Keys are validated to hold no `=`, so
/// the encoding is unambiguous.
pub fn annotation_pairs(annotations: &BTreeMap<String, String>) -> Vec<String> {
    annotations
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::sql::{self, squash};

    /// Statements that must apply [`ELIGIBLE_SQL`] (by file name).
    const ELIGIBLE_IN: &[(&str, &str)] = &[
        ("pending_for_agent", sql::PENDING_FOR_AGENT),
        ("claim_next", sql::CLAIM_NEXT),
        ("claim_next_capped", sql::CLAIM_NEXT_CAPPED),
        ("claim_next_fair", sql::CLAIM_NEXT_FAIR),
        ("claim_next_capped_fair", sql::CLAIM_NEXT_CAPPED_FAIR),
        ("queue_position", sql::QUEUE_POSITION),
        ("backlog", sql::BACKLOG),
    ];

    /// Statements that must apply [`LIVE_CLAIM_SQL`] (the reaper as `NOT (…)`).
    const LIVE_CLAIM_IN: &[(&str, &str)] = &[
        ("heartbeat", sql::HEARTBEAT),
        ("complete_success", sql::COMPLETE_SUCCESS),
        ("end_live_claim", sql::END_LIVE_CLAIM),
        ("find_expired_claims", sql::FIND_EXPIRED_CLAIMS),
        ("output_fence", sql::OUTPUT_FENCE),
        ("output_reader_holds", sql::OUTPUT_READER_HOLDS),
    ];

    #[test]
    fn every_statement_that_needs_a_rule_includes_it() {
        let rule = squash(ELIGIBLE_SQL);
        for (name, sql) in ELIGIBLE_IN {
            assert!(
                squash(sql).contains(&rule),
                "sql/{name}.sql does not include sql/eligible.sql"
            );
        }
        let rule = squash(LIVE_CLAIM_SQL);
        for (name, sql) in LIVE_CLAIM_IN {
            assert!(
                squash(sql).contains(&rule),
                "sql/{name}.sql does not include sql/live_claim.sql"
            );
        }
    }

    fn agent() -> AgentProfile {
        AgentProfile {
            id: Uuid::from_u128(1),
            name: "team-a/builder".into(),
            labels: vec!["gpu".into(), "eu".into()],
            annotations: BTreeMap::from([("zone".into(), "a".into())]),
            work_types: vec![WorkType::Custom],
            tenant: None,
            retired: false,
        }
    }

    fn sees(agent: &AgentProfile, work_type: WorkType, tenant: Option<&str>, t: Targeting) -> bool {
        agent_may_see(
            agent,
            &OrderProfile {
                work_type,
                tenant,
                targeting: &t,
            },
        )
    }

    #[test]
    fn any_targeting_criterion_is_enough() {
        let a = agent();
        let by_id = Targeting {
            agent_ids: vec![a.id],
            ..Default::default()
        };
        let by_name = Targeting {
            agent_names: vec!["team-a/builder".into()],
            ..Default::default()
        };
        let by_label = Targeting {
            labels: vec!["cpu".into(), "eu".into()],
            ..Default::default()
        };
        let by_annotation = Targeting {
            annotations: BTreeMap::from([("zone".into(), "a".into()), ("x".into(), "y".into())]),
            ..Default::default()
        };
        let wrong_value = Targeting {
            annotations: BTreeMap::from([("zone".into(), "b".into())]),
            ..Default::default()
        };
        for t in [by_id, by_name, by_label, by_annotation] {
            assert!(sees(&a, WorkType::Custom, None, t));
        }
        assert!(!sees(&a, WorkType::Custom, None, wrong_value));
    }

    #[test]
    fn capabilities_tenant_and_retirement_gate() {
        let mut a = agent();
        let t = Targeting {
            labels: vec!["gpu".into()],
            ..Default::default()
        };
        assert!(!sees(&a, WorkType::Build, None, t.clone()));
        a.work_types.clear();
        assert!(sees(&a, WorkType::Build, None, t.clone()));
        a.tenant = Some("team-a".into());
        assert!(!sees(&a, WorkType::Build, None, t.clone()));
        assert!(!sees(&a, WorkType::Build, Some("team-b"), t.clone()));
        assert!(sees(&a, WorkType::Build, Some("team-a"), t.clone()));
        a.tenant = None;
        assert!(sees(&a, WorkType::Build, Some("team-b"), t.clone()));
        a.retired = true;
        assert!(!sees(&a, WorkType::Build, None, t));
    }

    #[test]
    fn a_claim_lives_until_its_deadline_or_lease_end() {
        let now = Utc::now();
        let later = now + chrono::Duration::seconds(1);
        let earlier = now - chrono::Duration::seconds(1);
        assert!(claim_is_live(later, None, now));
        assert!(claim_is_live(later, Some(later), now));
        assert!(!claim_is_live(later, Some(earlier), now));
        assert!(!claim_is_live(later, Some(now), now));
        assert!(!claim_is_live(now, None, now));
        assert!(!claim_is_live(earlier, Some(later), now));
    }

    #[test]
    fn capacity_and_narrowing() {
        assert!(!at_capacity(None, 1_000));
        assert!(!at_capacity(Some(2), 1));
        assert!(at_capacity(Some(2), 2));
        assert!(at_capacity(Some(0), 0));
        assert_eq!(room(None, 1_000), usize::MAX);
        assert_eq!(room(Some(3), 1), 2);
        for (max, held) in [(2, 2), (2, 5), (0, 0)] {
            assert_eq!(room(Some(max), held), 0);
            assert!(at_capacity(Some(max), held));
        }
        assert!(narrowed_to(&[], WorkType::Build));
        assert!(narrowed_to(&[WorkType::Build], WorkType::Build));
        assert!(!narrowed_to(&[WorkType::Custom], WorkType::Build));
    }
}
