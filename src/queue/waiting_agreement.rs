//! The reasons an order waits (docs/design.md §10, `queue::waiting`) checked against what claims
//! actually do, on a real PostgreSQL (`crate::testing`).
//!
//! What a claim would do is asked by claiming by id inside a transaction that is then rolled
//! back (`claims::claim_in`), so one order can be put to every agent without changing it.
//!
//! - A matrix, one case per reason: `no_matching_agent` cannot be claimed by any registered
//!   agent; `no_agent_connected` can be claimed by a named agent once it makes contact;
//!   `agents_busy` is refused with `max_concurrency` by every named agent; `backing_off` with
//!   `backing_off`; `queued` at position p is what claim-next hands out at its p-th call.
//! - `waiting_agreement`, a property test over generated agents (targeting, work types, tenant,
//!   contact, `max_concurrency`, retired) and orders: the reason, the matching agents and the
//!   position agree with claim by id for every agent and with the pending list.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};

use chrono::{DateTime, Utc};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{Value, json};
use uuid::Uuid;

use super::claims::claim_in;
use super::{
    ClaimRequest, ConflictCode, Explanation, Queue, QueueError, WaitReason, WorkOrder, WorkType,
};

mod matrix;

const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n";
const BUILD: &str =
    "apiVersion: shipwright.io/v1beta1\nkind: Build\nmetadata:\n  name: b\nspec: {}\n";

/// What claim by id would answer `agent` for `order`, without changing anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claim {
    Taken,
    NotVisible,
    Retired,
    BackingOff,
    Busy,
    Limited,
}

async fn would_claim(queue: &Queue, order: Uuid, agent: Uuid) -> Claim {
    let mut tx = queue.pool().begin().await.unwrap();
    let got = claim_in(&mut tx, order, &claim_as(agent)).await;
    tx.rollback().await.unwrap();
    match got {
        Ok(_) => Claim::Taken,
        Err(QueueError::NotFound { .. }) => Claim::NotVisible,
        Err(QueueError::Conflict { code, .. }) => match code {
            ConflictCode::AgentRetired => Claim::Retired,
            ConflictCode::BackingOff => Claim::BackingOff,
            ConflictCode::MaxConcurrency => Claim::Busy,
            ConflictCode::ConcurrencyLimited => Claim::Limited,
            other => panic!("unexpected conflict {other:?}"),
        },
        Err(e) => panic!("claim by id failed: {e}"),
    }
}

/// A claim by `agent` with the default lease.
fn claim_as(agent: Uuid) -> ClaimRequest {
    ClaimRequest {
        agent_id: agent,
        lease_seconds: None,
    }
}

async fn agent(queue: &Queue, body: Value) -> Uuid {
    crate::testing::register_agent(queue, body).await
}

async fn order(queue: &Queue, body: Value) -> Uuid {
    let mut body = body;
    if body.get("yaml_content").is_none() {
        body["yaml_content"] = json!(CM);
    }
    if body.get("work_type").is_none() {
        body["work_type"] = json!("custom");
    }
    crate::testing::create_order(queue, body).await
}

/// Sets an agent's last contact: `Some(seconds ago)`, or `None` for never seen.
async fn seen(queue: &Queue, agent: Uuid, seconds_ago: Option<i32>) {
    sqlx::query(
        "UPDATE agents SET lease_seconds = NULL, \
         last_seen_at = now() - make_interval(secs => $2::int) WHERE id = $1",
    )
    .bind(agent)
    .bind(seconds_ago)
    .execute(queue.pool())
    .await
    .unwrap();
}

/// Makes an order `RETRY_PENDING` with its retry `hours` from now (negative: due).
async fn backing_off(queue: &Queue, order: Uuid, hours: i32) {
    crate::testing::retry_pending(queue, order, Some(hours)).await;
}

async fn explain(queue: &Queue, order: Uuid) -> Explanation {
    queue.explain(order).await.unwrap()
}

async fn fresh() -> Queue {
    Queue::new(crate::testing::fresh_pool(4).await)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Contact {
    Never,
    Active,
    Stale,
}

#[derive(Debug, Clone)]
struct AgentCase {
    labels: Vec<usize>,
    work_types: Vec<WorkType>,
    tenant: Option<usize>,
    contact: Contact,
    /// `max_concurrency: 1`, and whether it already holds a claim.
    capped: Option<bool>,
    retired: bool,
}

#[derive(Debug, Clone)]
struct OrderCase {
    labels: Vec<usize>,
    /// Targets the agent of this index by name.
    name: Option<usize>,
    work_type: WorkType,
    tenant: Option<usize>,
    priority: i64,
    /// `None` = `PENDING`; `Some(hours)` = `RETRY_PENDING`, due when negative.
    retry_in_hours: Option<i32>,
    /// A concurrency key: `Some(true)` one whose only slot another agent holds, `Some(false)`
    /// one with free slots.
    key_full: Option<bool>,
}

fn agent_case() -> impl Strategy<Value = AgentCase> {
    (
        proptest::sample::subsequence(vec![0usize, 1, 2], 0..=2),
        proptest::sample::subsequence(vec![WorkType::Build, WorkType::Custom], 0..=2),
        proptest::option::of(0usize..2),
        prop_oneof![
            Just(Contact::Never),
            Just(Contact::Active),
            Just(Contact::Stale)
        ],
        proptest::option::of(any::<bool>()),
        proptest::bool::weighted(0.1),
    )
        .prop_map(
            |(labels, work_types, tenant, contact, capped, retired)| AgentCase {
                labels,
                work_types,
                tenant,
                contact,
                capped,
                retired,
            },
        )
}

fn order_case() -> impl Strategy<Value = OrderCase> {
    (
        proptest::sample::subsequence(vec![0usize, 1, 2], 0..=2),
        proptest::option::of(0usize..3),
        proptest::sample::select(vec![WorkType::Build, WorkType::Custom]),
        proptest::option::of(0usize..2),
        proptest::sample::select(vec![-1i64, 0, 0, 1]),
        proptest::option::of(prop_oneof![Just(-1), Just(1)]),
        proptest::option::of(any::<bool>()),
    )
        .prop_map(
            |(labels, name, work_type, tenant, priority, retry_in_hours, key_full)| OrderCase {
                labels,
                name,
                work_type,
                tenant,
                priority,
                retry_in_hours,
                key_full,
            },
        )
}

async fn check(
    queue: &Queue,
    agents: Vec<AgentCase>,
    orders: Vec<OrderCase>,
) -> Result<(), TestCaseError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // Names, labels and tenants unique to the case, so cases share one database unseen.
    let tag = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = |i: usize| format!("n{i}-{tag}");
    let label = |i: usize| format!("l{i}-{tag}");
    let tenant = |i: usize| format!("t{i}-{tag}");

    let mut ids = vec![];
    for (i, a) in agents.iter().enumerate() {
        let id = agent(
            queue,
            json!({
                "name": name(i),
                "labels": a.labels.iter().map(|&l| label(l)).collect::<Vec<_>>(),
                "work_types": a.work_types.iter().map(|t| t.as_str()).collect::<Vec<_>>(),
                "tenant": a.tenant.map(tenant),
                "max_concurrency": a.capped.map(|_| 1),
            }),
        )
        .await;
        if a.capped == Some(true) {
            // A claim held on an order only this agent may see.
            let build = a.work_types == [WorkType::Build];
            let filler = order(
                queue,
                json!({
                    "work_type": if build { "build" } else { "custom" },
                    "yaml_content": if build { BUILD } else { CM },
                    "targeting": {"agent_ids": [id]},
                    "tenant": a.tenant.map(tenant),
                }),
            )
            .await;
            queue.claim(filler, &claim_as(id)).await.unwrap();
        }
        match a.contact {
            Contact::Never => seen(queue, id, None).await,
            Contact::Active => seen(queue, id, Some(0)).await,
            Contact::Stale => seen(queue, id, Some(301)).await,
        }
        ids.push(id);
    }
    // Every full key's one slot is held by an agent no order of the case targets.
    let key = |o: &OrderCase| {
        let t = o.tenant.map_or("-".to_string(), tenant);
        o.key_full.map(|full| {
            let max = if full { 1 } else { 3 };
            (
                format!("{}-{t}-{tag}", if full { "full" } else { "free" }),
                max,
            )
        })
    };
    let mut held_keys = BTreeSet::new();
    for o in &orders {
        if let (Some(true), Some((k, _))) = (o.key_full, key(o)) {
            if !held_keys.insert((k.clone(), o.tenant)) {
                continue;
            }
            let holder = agent(
                queue,
                json!({"name": format!("holder-{}", held_keys.len()) + &format!("-{tag}"),
                       "labels": [format!("holder-{tag}")], "tenant": o.tenant.map(tenant)}),
            )
            .await;
            let held = order(
                queue,
                json!({"targeting": {"agent_ids": [holder]}, "tenant": o.tenant.map(tenant),
                       "concurrency": {"key": k, "max": 1}}),
            )
            .await;
            queue.claim(held, &claim_as(holder)).await.unwrap();
        }
    }
    let mut created = vec![];
    for o in &orders {
        let mut targeting = json!({
            "labels": o.labels.iter().map(|&l| label(l)).collect::<Vec<_>>(),
            "agent_names": o.name.map(name).into_iter().collect::<Vec<_>>(),
        });
        if o.labels.is_empty() && o.name.is_none() {
            targeting["labels"] = json!([format!("nobody-{tag}")]);
        }
        let id = order(
            queue,
            json!({
                "work_type": o.work_type.as_str(),
                "yaml_content": if o.work_type == WorkType::Build { BUILD } else { CM },
                "tenant": o.tenant.map(tenant),
                "priority": o.priority,
                "concurrency": key(o).map(|(k, max)| json!({"key": k, "max": max})),
                "targeting": targeting,
            }),
        )
        .await;
        if let Some(hours) = o.retry_in_hours {
            backing_off(queue, id, hours).await;
        }
        created.push(id);
    }
    // Retired last: retirement releases the filler claims, which then wait like any order.
    for (a, id) in agents.iter().zip(&ids) {
        if a.retired {
            queue.retire_agent(*id).await.unwrap();
        }
    }

    // The batch read of the WorkOrder condition, over every order of the case and one unknown id.
    let mut asked = created.clone();
    asked.push(Uuid::new_v4());
    let waits = queue.waits(&asked).await.unwrap();
    prop_assert_eq!(waits.len(), created.len(), "one wait per waiting order");
    for (o, case) in created.iter().zip(&orders) {
        let e = queue.explain(*o).await.unwrap();
        prop_assert_eq!(waits[o].reason, e.reason, "waits and explain on {:?}", case);
        let mut claims = vec![];
        for id in &ids {
            claims.push(would_claim(queue, *o, *id).await);
        }
        let matching: Vec<usize> = (0..ids.len())
            .filter(|&i| !matches!(claims[i], Claim::NotVisible | Claim::Retired))
            .collect();
        let names: BTreeSet<String> = matching.iter().map(|&i| name(i)).collect();
        prop_assert_eq!(
            e.matching_agents.iter().cloned().collect::<BTreeSet<_>>(),
            names,
            "matching agents of {:?}: {:?}",
            case,
            e
        );
        let active = |i: &&usize| agents[**i].contact == Contact::Active;
        let expected = if matching.is_empty() {
            WaitReason::NoMatchingAgent
        } else if matching.iter().all(|&i| claims[i] == Claim::BackingOff) {
            WaitReason::BackingOff
        } else if matching.iter().all(|&i| claims[i] == Claim::Limited) {
            WaitReason::ConcurrencyLimited
        } else if !matching.iter().any(|i| active(&i)) {
            WaitReason::NoAgentConnected
        } else if matching
            .iter()
            .filter(active)
            .all(|&i| claims[i] == Claim::Busy)
        {
            WaitReason::AgentsBusy
        } else {
            WaitReason::Queued
        };
        prop_assert_eq!(e.reason, expected, "{:?} {:?} claims {:?}", case, e, claims);
        if e.reason == WaitReason::BackingOff {
            prop_assert!(
                matching.iter().all(|&i| claims[i] == Claim::BackingOff),
                "backing off for some agents only: {:?}",
                claims
            );
        }
        if e.reason == WaitReason::Queued {
            // Orders ahead: what the takers' pending lists hold (the orders any of them may
            // take) that docs/design.md §3 hands out before it, were they to claim one at a
            // time: tenants take turns in the order they were last served, each turn hands out
            // that tenant's first order (priority, then age).
            let takers: Vec<Uuid> = matching
                .iter()
                .filter(active)
                .filter(|&&i| claims[i] == Claim::Taken)
                .map(|&i| ids[i])
                .collect();
            let mut visible: BTreeMap<Uuid, WorkOrder> = BTreeMap::new();
            for t in &takers {
                let page = queue
                    .pending_for_agent(*t, &[], crate::queue::limits::PAGE_LIMIT.max, None)
                    .await
                    .unwrap();
                visible.extend(page.items.into_iter().map(|w| (w.id, w)));
            }
            let Some(me) = visible.get(o) else {
                return Err(TestCaseError::fail(
                    "no taker's pending list holds the order",
                ));
            };
            let turns: Vec<(Option<String>, DateTime<Utc>, Uuid)> =
                // A parked turn's 'infinity' is past what chrono holds; its order is kept.
                sqlx::query_as(
                    "SELECT tenant, least(served_at, '9999-12-31'), tenant_key FROM tenant_turns",
                )
                    .fetch_all(queue.pool())
                    .await
                    .unwrap();
            let turn_of = |t: &Option<String>| {
                turns
                    .iter()
                    .find(|(tenant, ..)| tenant == t)
                    .map(|(_, at, key)| (*at, *key))
                    .expect("every tenant with orders has a turn")
            };
            let key = |w: &WorkOrder| (std::cmp::Reverse(w.priority), w.created_at, w.id);
            let k = visible
                .values()
                .filter(|w| w.tenant == me.tenant && key(w) < key(me))
                .count();
            let mut ahead = k;
            let tenants: BTreeSet<&Option<String>> = visible.values().map(|w| &w.tenant).collect();
            for t in tenants.into_iter().filter(|t| **t != me.tenant) {
                let orders = visible.values().filter(|w| w.tenant == *t).count();
                let earlier = usize::from(turn_of(t) < turn_of(&me.tenant));
                ahead += orders.min(k + earlier);
            }
            prop_assert_eq!(e.position, Some(ahead as i64 + 1), "position {:?}", e);
        } else {
            prop_assert_eq!(e.position, None);
        }
    }
    Ok(())
}

#[test]
fn waiting_agreement() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _context = rt.enter();
    let queue = rt.block_on(async { Queue::new(crate::testing::fresh_pool(4).await) });
    let mut runner = crate::testing::proptest_runner(crate::testing::proptest_cases(48));
    let strategy = (
        proptest::collection::vec(agent_case(), 1..=3),
        proptest::collection::vec(order_case(), 1..=4),
    );
    let result = runner.run(&strategy, |(agents, orders)| {
        rt.block_on(check(&queue, agents, orders))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
