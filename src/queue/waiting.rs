//! Why an order waits (docs/design.md §10), as a pure function of the order and the live agents, so
//! it can be tested without I/O; `queue::explain` reads the inputs and answers the API.
//!
//! Which agents may take the order is decided by the eligibility rule of `queue::eligibility`
//! (the Rust side, the one claim by id uses) on the order as it will be once due; contact by
//! `rules::agent_health`; room by `eligibility::at_capacity`. The reasons, first that applies:
//!
//! | reason | when |
//! |---|---|
//! | `no_matching_agent` | no live (non-retired) agent may see it (targeting, work type, tenant) |
//! | `backing_off` | it is `RETRY_PENDING` and its retry is not due |
//! | `concurrency_limited` | its concurrency key's slots are all held (docs/design.md §3) |
//! | `no_agent_connected` | matching agents exist, none `active` (never seen, or stale) |
//! | `agents_busy` | every active matching agent holds `max_concurrency` claims |
//! | `queued` | an active matching agent has room; `position` says how many go first |
//!
//! `no_matching_agent` comes before `backing_off` because it says the order will never run
//! unless an agent is registered, which a person needs to know more than when its retry is due.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::eligibility::{self, AgentProfile, OrderProfile};
use super::limits::MAX_POSITION_COUNTED;
use super::model::{AgentHealth, Explanation, KeyWait, OrderStatus, WaitReason};

/// Most agent names an explanation lists (docs/design.md §10).
pub const MATCHING_AGENTS_SHOWN: usize = 10;

/// A live agent as the reasons see it: its side of eligibility, its derived health and the
/// claims it holds.
#[derive(Debug, Clone)]
pub struct AgentState {
    pub profile: AgentProfile,
    pub health: AgentHealth,
    /// `None` = unlimited.
    pub max_concurrency: Option<i32>,
    /// Claims it holds now.
    pub held: i64,
}

impl AgentState {
    /// In contact within its health window (docs/design.md §5 `active`).
    pub fn connected(&self) -> bool {
        self.health == AgentHealth::Active
    }

    /// Could claim one more order now (docs/design.md §3 rule 4).
    pub fn has_room(&self) -> bool {
        !eligibility::at_capacity(self.max_concurrency, self.held)
    }
}

/// An unclaimed order's reason, with the agents it was decided from.
#[derive(Debug, Clone)]
pub struct Verdict<'a> {
    pub reason: WaitReason,
    /// Live agents that may take the order once it is due, in the order given.
    pub matching: Vec<&'a AgentState>,
    /// Ids of the matching agents that could claim it now (connected, with room): the agents
    /// whose earlier orders decide its position. Empty unless `reason` is `queued`.
    pub takers: Vec<Uuid>,
}

/// The reason `order` waits (docs/design.md §10), given its `status`, whether its retry is `due`
/// (read by `sql/waiting_order.sql` and `waiting_orders.sql` as a claim by id,
/// `sql/claim_candidate.sql`, reads it), whether its concurrency key is `limited` (every slot
/// held, as `sql/key_full.sql` reads it) and every live agent. `None` for a claimed order,
/// which does not wait.
pub fn classify<'a>(
    order: &OrderProfile<'_>,
    status: OrderStatus,
    due: bool,
    limited: bool,
    agents: &'a [AgentState],
) -> Option<Verdict<'a>> {
    if status == OrderStatus::Claimed {
        return None;
    }
    let matching: Vec<&AgentState> = agents
        .iter()
        .filter(|a| eligibility::agent_may_see(&a.profile, order))
        .collect();
    let connected = || matching.iter().filter(|a| a.connected());
    let takers: Vec<Uuid> = connected()
        .filter(|a| a.has_room())
        .map(|a| a.profile.id)
        .collect();
    let reason = if matching.is_empty() {
        WaitReason::NoMatchingAgent
    } else if !eligibility::claimable_now(status, due) {
        WaitReason::BackingOff
    } else if limited {
        WaitReason::ConcurrencyLimited
    } else if connected().next().is_none() {
        WaitReason::NoAgentConnected
    } else if takers.is_empty() {
        WaitReason::AgentsBusy
    } else {
        WaitReason::Queued
    };
    let takers = if reason == WaitReason::Queued {
        takers
    } else {
        vec![]
    };
    Some(Verdict {
        reason,
        matching,
        takers,
    })
}

/// Unclaimed orders of one reason (docs/design.md §10 metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReasonCount {
    pub orders: i64,
    /// The longest wait among them, in seconds (0 when there are none).
    pub oldest_seconds: f64,
}

/// What the sentence of an [`Explanation`] needs about the order.
#[derive(Debug, Clone)]
pub struct OrderFacts {
    pub id: Uuid,
    pub retry_count: i32,
    pub next_retry_after: Option<DateTime<Utc>>,
    pub waiting_seconds: i64,
    /// For `concurrency_limited`: its key and the holders (`None` where only the reason is
    /// needed, as for the WorkOrder condition).
    pub key: Option<KeyWait>,
}

/// Builds the answer from a [`Verdict`] and, for `queued`, the `position` (1-based).
pub fn explanation(
    order: &OrderFacts,
    verdict: &Verdict<'_>,
    position: Option<i64>,
) -> Explanation {
    let mut names: Vec<&str> = verdict
        .matching
        .iter()
        .map(|a| a.profile.name.as_str())
        .collect();
    names.sort_unstable();
    let shown: Vec<String> = names
        .iter()
        .take(MATCHING_AGENTS_SHOWN)
        .map(|n| n.to_string())
        .collect();
    let list = name_list(&shown, names.len());
    let id = order.id;
    let message = match verdict.reason {
        WaitReason::NoMatchingAgent => format!(
            "No live agent may take work order {id}: none matches its targeting, work type and \
             tenant. It waits until such an agent is registered."
        ),
        WaitReason::BackingOff => match order.next_retry_after {
            Some(t) => format!(
                "Work order {id} failed attempt {} and is backing off until {}; then {list} may \
                 take it.",
                order.retry_count,
                t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
            None => format!("Work order {id} is waiting for a retry with no time set."),
        },
        WaitReason::ConcurrencyLimited => match &order.key {
            Some(k) => format!(
                "Work order {id} waits for a slot of its concurrency key {:?}: {} of {} held{}. \
                 It is claimed when one of them ends.",
                k.key,
                k.held,
                k.max,
                match k.holders.as_slice() {
                    [] => String::new(),
                    holders => format!(
                        " (by work order{} {})",
                        if holders.len() == 1 { "" } else { "s" },
                        holders
                            .iter()
                            .map(Uuid::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                }
            ),
            None => format!(
                "Work order {id} waits for a free slot of its concurrency key; then {list} may \
                 take it."
            ),
        },
        WaitReason::NoAgentConnected => format!(
            "Work order {id} matches {list}, but none of them is in contact (never seen, or \
             stale). It waits until one connects."
        ),
        WaitReason::AgentsBusy => format!(
            "Work order {id} matches {list}; every one in contact holds its max_concurrency \
             claims. It waits until one finishes a claim."
        ),
        WaitReason::Queued => {
            let line = match position {
                Some(1) => format!("Work order {id} is next in line for {list}."),
                None => format!(
                    "Work order {id} is in line for {list} (`pullman work-orders explain` counts \
                     its place)."
                ),
                Some(p) if p - 1 > MAX_POSITION_COUNTED => format!(
                    "Work order {id} is in line for {list}: more than {MAX_POSITION_COUNTED} \
                     orders go first."
                ),
                Some(p) => format!(
                    "Work order {id} is number {p} in line for {list}: {} order(s) go first.",
                    p - 1
                ),
            };
            format!("{line}{}", takers_running(verdict))
        }
        // Not from `classify`: a claimed order's agent says it (`queue::explain`).
        WaitReason::NodeUnreachable => format!(
            "Work order {id} is claimed, and a pod of it may still run on a node that does not \
             report; its verdict waits for the node's kubelet."
        ),
    };
    Explanation {
        reason: verdict.reason,
        message,
        matching_agents: shown,
        matching_agent_count: names.len(),
        position: match position {
            _ if verdict.reason != WaitReason::Queued => None,
            Some(p) if p - 1 > MAX_POSITION_COUNTED => None,
            p => p,
        },
        position_past: (verdict.reason == WaitReason::Queued
            && position.is_some_and(|p| p - 1 > MAX_POSITION_COUNTED))
        .then_some(MAX_POSITION_COUNTED),
        backing_off_until: if verdict.reason == WaitReason::BackingOff {
            order.next_retry_after
        } else {
            None
        },
        concurrency: if verdict.reason == WaitReason::ConcurrencyLimited {
            order.key.clone()
        } else {
            None
        },
        node: None,
        waiting_seconds: order.waiting_seconds.max(0),
    }
}

/// For `queued`, when every agent that could take the order now already runs orders: what they
/// run. An agent with room by its `max_concurrency` (or none registered) may still be full by
/// its own count (`worker --concurrency 1`), so "next in line" alone would read as "starts now".
fn takers_running(verdict: &Verdict<'_>) -> String {
    let takers: Vec<&AgentState> = verdict
        .matching
        .iter()
        .copied()
        .filter(|a| verdict.takers.contains(&a.profile.id))
        .collect();
    if takers.is_empty() || takers.iter().any(|a| a.held == 0) {
        return String::new();
    }
    let running: i64 = takers.iter().map(|a| a.held).sum();
    let orders = if running == 1 { "order" } else { "orders" };
    match takers.as_slice() {
        [one] => format!(
            " {} is running {running} {orders} now; it starts when {} takes another.",
            one.profile.name, one.profile.name
        ),
        _ => format!(
            " Those agents are running {running} {orders} now; it starts when one of them takes \
             another."
        ),
    }
}

/// Why an unclaimed order waits, in the words that change only when the cause does (an agent
/// registered, retired, in or out of contact; the retry time): what the WorkOrder's
/// `Schedulable` condition says (docs/design.md §10). Unlike [`Explanation`] it leaves out the place in
/// line and the time waited, which move on their own, and says `agents_busy` and `queued` in one
/// sentence, since they trade places whenever a matching agent takes or finishes a claim; the
/// reason itself stays exact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wait {
    pub reason: WaitReason,
    /// A sentence for people.
    pub message: String,
    /// Ids of the live agents that may take the order, in contact or not: the controller asks
    /// whether they are Executors waiting for their autoscaler (`AwaitingScaleUp`).
    pub matching: Vec<Uuid>,
}

/// The [`Wait`] of `order` from its [`Verdict`]: the explanation's sentence for
/// `no_matching_agent`, `no_agent_connected` and `backing_off`; for `agents_busy` and `queued`
/// one sentence naming the matching agents.
pub fn wait(order: &OrderFacts, verdict: &Verdict<'_>) -> Wait {
    let id = order.id;
    // No agent names or counts: registering, retiring or reaching an agent must not rewrite the
    // status of every waiting WorkOrder. `explain` names them.
    let message = match verdict.reason {
        WaitReason::NoMatchingAgent | WaitReason::NodeUnreachable => {
            explanation(order, verdict, None).message
        }
        WaitReason::BackingOff => match order.next_retry_after {
            Some(t) => format!(
                "Work order {id} failed attempt {} and is backing off until {}; then a matching \
                 agent may take it.",
                order.retry_count,
                t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
            None => format!("Work order {id} is waiting for a retry with no time set."),
        },
        WaitReason::ConcurrencyLimited => format!(
            "Work order {id} waits for a free slot of its concurrency key (pullman work-orders \
             explain names the orders holding them)."
        ),
        WaitReason::NoAgentConnected => format!(
            "Work order {id} matches registered agents, but none of them is in contact (never \
             seen, or stale). It waits until one connects (pullman work-orders explain names \
             them)."
        ),
        WaitReason::AgentsBusy | WaitReason::Queued => format!(
            "Work order {id} waits for a matching agent in contact to claim it when it has room \
             (pullman work-orders explain names them and gives its place in line)."
        ),
    };
    Wait {
        reason: verdict.reason,
        message,
        matching: verdict.matching.iter().map(|a| a.profile.id).collect(),
    }
}

/// `agent a`, `agents a and b`, `agents a, b and 3 more`.
fn name_list(shown: &[String], total: usize) -> String {
    match shown {
        [] => "no agent".into(),
        [one] if total == 1 => format!("agent {one}"),
        _ if total > shown.len() => {
            format!(
                "agents {} and {} more",
                shown.join(", "),
                total - shown.len()
            )
        }
        [init @ .., last] => format!("agents {} and {last}", init.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::queue::model::{Targeting, WorkType};

    /// Targeting by one label.
    fn labelled(label: &str) -> Targeting {
        Targeting {
            labels: vec![label.into()],
            ..Default::default()
        }
    }

    /// A custom order of no tenant with targeting `t`.
    fn custom(t: &Targeting) -> OrderProfile<'_> {
        OrderProfile {
            work_type: WorkType::Custom,
            tenant: None,
            targeting: t,
        }
    }

    fn agent(n: u128, health: AgentHealth, max: Option<i32>, held: i64) -> AgentState {
        AgentState {
            profile: AgentProfile {
                id: Uuid::from_u128(n),
                name: format!("a{n}"),
                labels: vec!["gpu".into()],
                annotations: BTreeMap::new(),
                work_types: vec![],
                tenant: None,
                retired: false,
            },
            health,
            max_concurrency: max,
            held,
        }
    }

    fn reason(status: OrderStatus, due: bool, label: &str, agents: &[AgentState]) -> WaitReason {
        let t = labelled(label);
        let order = custom(&t);
        classify(&order, status, due, false, agents).unwrap().reason
    }

    use AgentHealth::*;
    use OrderStatus::*;

    #[test]
    fn each_reason_in_its_precedence() {
        let active = agent(1, Active, None, 0);
        assert_eq!(
            reason(Pending, false, "cpu", std::slice::from_ref(&active)),
            WaitReason::NoMatchingAgent
        );
        assert_eq!(
            reason(RetryPending, false, "cpu", &[]),
            WaitReason::NoMatchingAgent
        );
        assert_eq!(
            reason(RetryPending, false, "gpu", std::slice::from_ref(&active)),
            WaitReason::BackingOff
        );
        assert_eq!(
            reason(RetryPending, true, "gpu", std::slice::from_ref(&active)),
            WaitReason::Queued
        );
        assert_eq!(
            reason(
                Pending,
                false,
                "gpu",
                &[agent(1, Stale, None, 0), agent(2, NeverSeen, None, 0)]
            ),
            WaitReason::NoAgentConnected
        );
        // A stale agent with room does not make a busy connected one's order `queued`.
        assert_eq!(
            reason(
                Pending,
                false,
                "gpu",
                &[agent(1, Active, Some(1), 1), agent(2, Stale, None, 0)]
            ),
            WaitReason::AgentsBusy
        );
        assert_eq!(
            reason(
                Pending,
                false,
                "gpu",
                &[agent(1, Active, Some(1), 1), agent(2, Active, Some(2), 1)]
            ),
            WaitReason::Queued
        );
    }

    #[test]
    fn a_retired_agent_never_matches_and_claimed_orders_do_not_wait() {
        let mut retired = agent(1, Retired, None, 0);
        retired.profile.retired = true;
        assert_eq!(
            reason(Pending, false, "gpu", &[retired]),
            WaitReason::NoMatchingAgent
        );
        let t = labelled("gpu");
        let order = custom(&t);
        assert!(classify(&order, Claimed, false, false, &[agent(1, Active, None, 0)]).is_none());
    }

    #[test]
    fn the_answer_lists_ten_names_and_says_how_many_more() {
        let agents: Vec<AgentState> = (0..12).map(|n| agent(n, Stale, None, 0)).collect();
        let t = labelled("gpu");
        let order = custom(&t);
        let verdict = classify(&order, Pending, false, false, &agents).unwrap();
        let facts = OrderFacts {
            id: Uuid::nil(),
            retry_count: 0,
            next_retry_after: None,
            waiting_seconds: 42,
            key: None,
        };
        let e = explanation(&facts, &verdict, None);
        assert_eq!(e.reason, WaitReason::NoAgentConnected);
        assert_eq!(e.matching_agents.len(), MATCHING_AGENTS_SHOWN);
        assert_eq!(e.matching_agent_count, 12);
        assert!(e.message.contains("and 2 more"), "{}", e.message);
        assert_eq!(e.position, None);
        assert_eq!(e.waiting_seconds, 42);
    }

    #[test]
    fn a_wait_reads_the_same_while_its_agents_take_and_finish_claims() {
        let t = labelled("gpu");
        let order = custom(&t);
        let facts = OrderFacts {
            id: Uuid::nil(),
            retry_count: 0,
            next_retry_after: None,
            waiting_seconds: 7,
            key: None,
        };
        let wait_among = |agents: &[AgentState]| {
            wait(
                &facts,
                &classify(&order, Pending, false, false, agents).unwrap(),
            )
        };
        let busy = [agent(1, Active, Some(1), 1)];
        let room = [agent(1, Active, Some(1), 0)];
        let when_busy = wait_among(&busy);
        let with_room = wait_among(&room);
        assert_eq!(when_busy.reason, WaitReason::AgentsBusy);
        assert_eq!(with_room.reason, WaitReason::Queued);
        assert_eq!(when_busy.message, with_room.message);
        // Agents coming and going do not change it either: no names, no counts.
        let more = [
            agent(1, Active, Some(1), 0),
            agent(2, Active, None, 3),
            agent(3, Stale, None, 0),
        ];
        let with_more = wait_among(&more);
        assert_eq!(with_more.message, with_room.message);
        assert!(!with_room.message.contains("a1"), "{}", with_room.message);
        let stale = [agent(1, Stale, None, 0)];
        let stale_more = [agent(1, Stale, None, 0), agent(2, NeverSeen, None, 0)];
        let one = wait_among(&stale);
        let two = wait_among(&stale_more);
        assert_eq!(one.reason, WaitReason::NoAgentConnected);
        assert_eq!(one.message, two.message);
        assert!(!one.message.contains("a1"), "{}", one.message);
    }

    #[test]
    fn names_read_as_a_sentence() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(name_list(&s(&["a"]), 1), "agent a");
        assert_eq!(name_list(&s(&["a", "b"]), 2), "agents a and b");
        assert_eq!(name_list(&s(&["a", "b", "c"]), 3), "agents a, b and c");
        assert_eq!(name_list(&s(&["a", "b"]), 5), "agents a, b and 3 more");
    }

    #[test]
    fn a_full_concurrency_key_comes_after_backing_off_and_names_its_holders() {
        let t = labelled("gpu");
        let order = custom(&t);
        let active = [agent(1, Active, None, 0)];
        let limited = |status, due| classify(&order, status, due, true, &active).unwrap().reason;
        assert_eq!(limited(Pending, false), WaitReason::ConcurrencyLimited);
        assert_eq!(limited(RetryPending, false), WaitReason::BackingOff);
        let nobody = classify(&order, Pending, false, true, &[]).unwrap().reason;
        assert_eq!(nobody, WaitReason::NoMatchingAgent);
        let stale = [agent(1, Stale, None, 0)];
        let verdict = classify(&order, Pending, false, true, &stale).unwrap();
        assert_eq!(verdict.reason, WaitReason::ConcurrencyLimited);
        assert!(verdict.takers.is_empty());
        let holder = Uuid::from_u128(7);
        let facts = OrderFacts {
            id: Uuid::nil(),
            retry_count: 0,
            next_retry_after: None,
            waiting_seconds: 1,
            key: Some(KeyWait {
                key: "deploy".into(),
                max: 1,
                held: 1,
                holders: vec![holder],
            }),
        };
        let e = explanation(&facts, &verdict, None);
        assert!(
            e.message.contains("\"deploy\": 1 of 1 held"),
            "{}",
            e.message
        );
        assert!(e.message.contains(&holder.to_string()), "{}", e.message);
        assert_eq!(e.concurrency.unwrap().holders, vec![holder]);
        assert!(!wait(&facts, &verdict).message.contains(&holder.to_string()));
    }
}
