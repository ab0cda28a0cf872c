//! Property tests against a real PostgreSQL (`crate::testing`).
//!
//! `eligibility_agreement` (docs/design.md §3): for generated agents and orders, the four ways the queue decides
//! eligibility agree with the rule in `queue::eligibility` and so with each other — the pending
//! list and claim-next (the SQL side, `sql/pending_for_agent.sql`, `sql/claim_next.sql`), claim
//! by id and the long-poll wake filter (the Rust side, the latter fed by the real
//! `pullman_claimable` notifications).
//!
//! Each case registers one agent and two batches of the same orders, under names, labels and
//! annotation values unique to the case, so cases share one database without seeing each other.
//! Batch 1 is claimed by id, order by order; batch 2 by claim-next until it answers nothing.
//!
//! `claim_liveness_agreement` (docs/design.md §2): for generated deadlines and leases around now,
//! [`eligibility::claim_is_live`] and `sql/live_claim.sql` (evaluated by PostgreSQL at its own
//! `now()`) say the same of every claim.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::json;
use uuid::Uuid;

use super::eligibility::{self, OrderProfile};
use super::wake::Notice;
use super::{ClaimRequest, ConflictCode, OrderStatus, Queue, QueueError, WorkType};

const TYPES: [WorkType; 2] = [WorkType::Build, WorkType::Custom];

#[derive(Debug, Clone)]
struct AgentCase {
    name: usize,
    labels: Vec<usize>,
    zone: Option<usize>,
    rack: Option<usize>,
    work_types: Vec<WorkType>,
    tenant: Option<usize>,
    retired: bool,
    requested: Vec<WorkType>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Pending,
    RetryDue,
    RetryLater,
    /// `RETRY_PENDING` without a `next_retry_after`: no statement writes it, but every path must
    /// read it alike (not due).
    RetryUntimed,
}

#[derive(Debug, Clone)]
struct OrderCase {
    by_id: bool,
    names: Vec<usize>,
    labels: Vec<usize>,
    zone: Option<usize>,
    rack: Option<usize>,
    work_type: WorkType,
    tenant: Option<usize>,
    state: State,
}

fn small() -> impl Strategy<Value = Vec<usize>> {
    proptest::sample::subsequence(vec![0usize, 1, 2], 0..=2)
}

fn types() -> impl Strategy<Value = Vec<WorkType>> {
    proptest::sample::subsequence(TYPES.to_vec(), 0..=2)
}

fn agent_case() -> impl Strategy<Value = AgentCase> {
    (
        0usize..3,
        small(),
        proptest::option::of(0usize..2),
        proptest::option::of(0usize..2),
        types(),
        proptest::option::of(0usize..2),
        proptest::bool::weighted(0.1),
        types(),
    )
        .prop_map(
            |(name, labels, zone, rack, work_types, tenant, retired, requested)| AgentCase {
                name,
                labels,
                zone,
                rack,
                work_types,
                tenant,
                retired,
                requested,
            },
        )
}

fn order_case() -> impl Strategy<Value = OrderCase> {
    (
        proptest::bool::weighted(0.2),
        small(),
        small(),
        proptest::option::of(0usize..2),
        proptest::option::of(0usize..3),
        proptest::sample::select(TYPES.to_vec()),
        proptest::option::of(0usize..2),
        prop_oneof![
            3 => Just(State::Pending),
            1 => Just(State::RetryDue),
            1 => Just(State::RetryLater),
            1 => Just(State::RetryUntimed)
        ],
    )
        .prop_map(
            |(by_id, names, labels, zone, rack, work_type, tenant, state)| OrderCase {
                by_id,
                names,
                labels,
                zone,
                rack,
                work_type,
                tenant,
                state,
            },
        )
}

/// One case's spelling of the generated values: unique to the case (`tag`).
struct Words {
    tag: u64,
}

impl Words {
    fn name(&self, i: usize) -> String {
        format!("n{i}-{}", self.tag)
    }
    fn label(&self, i: usize) -> String {
        format!("l{i}-{}", self.tag)
    }
    fn tenant(&self, i: usize) -> String {
        format!("t{i}-{}", self.tag)
    }
    fn annotations(&self, zone: Option<usize>, rack: Option<usize>) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        if let Some(z) = zone {
            m.insert(format!("zone-{}", self.tag), format!("z{z}"));
        }
        if let Some(r) = rack {
            m.insert(format!("rack-{}", self.tag), format!("r{r}"));
        }
        m
    }
}

const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n";
const BUILD: &str =
    "apiVersion: shipwright.io/v1beta1\nkind: Build\nmetadata:\n  name: b\nspec: {}\n";

async fn check(
    queue: &Queue,
    listener: &mut sqlx::postgres::PgListener,
    agent: AgentCase,
    orders: Vec<OrderCase>,
) -> Result<(), TestCaseError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let w = Words {
        tag: NEXT.fetch_add(1, Ordering::Relaxed),
    };
    let agent_id = crate::testing::register_agent(
        queue,
        json!({
            "name": w.name(agent.name),
            "labels": agent.labels.iter().map(|&i| w.label(i)).collect::<Vec<_>>(),
            "annotations": w.annotations(agent.zone, agent.rack),
            "work_types": agent.work_types.iter().map(|t| t.as_str()).collect::<Vec<_>>(),
            "tenant": agent.tenant.map(|i| w.tenant(i)),
        }),
    )
    .await;

    // Two batches of the same orders; every order's facts, by id, in creation order.
    let mut batches: [Vec<(Uuid, &OrderCase)>; 2] = [vec![], vec![]];
    for batch in &mut batches {
        for o in &orders {
            let mut targeting = json!({
                "agent_ids": if o.by_id { vec![agent_id] } else { vec![Uuid::new_v4()] },
                "agent_names": o.names.iter().map(|&i| w.name(i)).collect::<Vec<_>>(),
                "labels": o.labels.iter().map(|&i| w.label(i)).collect::<Vec<_>>(),
                "annotations": w.annotations(o.zone, o.rack),
            });
            if !o.by_id {
                targeting["agent_ids"] = json!([]);
                if o.names.is_empty() && o.labels.is_empty() && o.zone.is_none() && o.rack.is_none()
                {
                    // Targeting needs a criterion: one that matches nobody.
                    targeting["labels"] = json!([format!("nobody-{}", w.tag)]);
                }
            }
            let spec = super::validate::validate_work_order(
                serde_json::from_value(json!({
                    "work_type": o.work_type.as_str(),
                    "yaml_content": if o.work_type == WorkType::Build { BUILD } else { CM },
                    "tenant": o.tenant.map(|i| w.tenant(i)),
                    "targeting": targeting,
                }))
                .unwrap(),
            )
            .unwrap();
            let id = queue
                .create_new_work_order(&spec, None)
                .await
                .unwrap()
                .order
                .id;
            if o.state != State::Pending {
                // Hours from now to the retry (NULL: none).
                let due: Option<i32> = match o.state {
                    State::RetryDue => Some(-1),
                    State::RetryLater => Some(1),
                    _ => None,
                };
                crate::testing::retry_pending(queue, id, due).await;
            }
            batch.push((id, o));
        }
    }
    if agent.retired {
        queue.retire_agent(agent_id).await.unwrap();
    }

    // The rule, on the generated values.
    let profile = queue.read_claimer(agent_id).await.unwrap().profile;
    let visible = |o: &OrderCase| {
        let t = super::Targeting {
            agent_ids: if o.by_id { vec![agent_id] } else { vec![] },
            agent_names: o.names.iter().map(|&i| w.name(i)).collect(),
            labels: o.labels.iter().map(|&i| w.label(i)).collect(),
            annotations: w.annotations(o.zone, o.rack),
        };
        eligibility::agent_may_see(
            &profile,
            &OrderProfile {
                work_type: o.work_type,
                tenant: o.tenant.map(|i| w.tenant(i)).as_deref(),
                targeting: &t,
            },
        )
    };
    let claimable = |o: &OrderCase| match o.state {
        State::Pending => eligibility::claimable_now(OrderStatus::Pending, true),
        State::RetryDue => eligibility::claimable_now(OrderStatus::RetryPending, true),
        State::RetryLater | State::RetryUntimed => {
            eligibility::claimable_now(OrderStatus::RetryPending, false)
        }
    };
    let narrowed = |o: &OrderCase| eligibility::narrowed_to(&agent.requested, o.work_type);
    let eligible = |(_, o): &(Uuid, &OrderCase)| visible(o) && narrowed(o) && claimable(o);

    // 1. The wake filter, fed the notifications the inserts sent.
    let filter = queue
        .read_claimer(agent_id)
        .await
        .unwrap()
        .wake_filter(&agent.requested);
    let all: Vec<(Uuid, &OrderCase)> = batches.iter().flatten().copied().collect();
    let mut notices = BTreeMap::new();
    while notices.len() < all.len() {
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), listener.recv())
            .await
            .expect("a pullman_claimable notification per insert")
            .unwrap();
        if let Some(notice) = Notice::parse(n.payload()) {
            notices.insert(notice.id(), notice);
        }
    }
    for (id, o) in &all {
        let admitted = filter.admits(&notices[id]);
        prop_assert_eq!(
            admitted,
            visible(o) && narrowed(o),
            "wake filter, order {:?}",
            o
        );
    }

    // 2. The pending list.
    let types: Vec<WorkType> = agent.requested.clone();
    let listed: BTreeSet<Uuid> = queue
        .pending_for_agent(agent_id, &types, crate::queue::limits::PAGE_LIMIT.max, None)
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|o| o.id)
        .collect();
    let expected: BTreeSet<Uuid> = all.iter().filter(|e| eligible(e)).map(|e| e.0).collect();
    prop_assert_eq!(&listed, &expected, "pending list");

    // 3. Claim by id, batch 1 (no work-type narrowing: the caller names the order).
    let req = ClaimRequest {
        agent_id,
        lease_seconds: None,
    };
    for (id, o) in &batches[0] {
        let got = queue.claim(*id, &req).await;
        match got {
            Ok(order) => prop_assert!(
                visible(o) && claimable(o),
                "claimed by id an order the rule refuses: {:?} {:?}",
                o,
                order.status
            ),
            Err(QueueError::NotFound { .. }) => {
                prop_assert!(!visible(o), "404 for a visible order {:?}", o)
            }
            Err(QueueError::Conflict { code, .. }) => match code {
                ConflictCode::BackingOff => prop_assert!(
                    visible(o) && matches!(o.state, State::RetryLater | State::RetryUntimed),
                    "backing_off for {:?}",
                    o
                ),
                ConflictCode::AgentRetired => prop_assert!(agent.retired),
                other => prop_assert!(false, "unexpected conflict {:?} for {:?}", other, o),
            },
            Err(e) => prop_assert!(false, "claim by id failed: {e}"),
        }
    }

    // 4. Claim-next until nothing is left: batch 2's eligible orders.
    let mut claimed = Vec::new();
    loop {
        match queue.claim_next(&req, &types).await {
            Ok(Some(order)) => claimed.push(order.id),
            Ok(None) => break,
            Err(QueueError::Conflict {
                code: ConflictCode::AgentRetired,
                ..
            }) if agent.retired => break,
            Err(e) => prop_assert!(false, "claim-next failed: {e}"),
        }
        prop_assert!(claimed.len() <= all.len(), "claim-next does not stop");
    }
    // Which orders, not in which order: tenants take turns (docs/design.md §3), which
    // tests/integration/hand_out_order.rs and queue::waiting_agreement hold.
    let mut expected: Vec<Uuid> = batches[1]
        .iter()
        .filter(|e| eligible(e))
        .map(|e| e.0)
        .collect();
    expected.sort();
    claimed.sort();
    prop_assert_eq!(claimed, expected, "claim-next");
    Ok(())
}

/// The tests' own runtime: proptest's runner is synchronous, so each case blocks on it.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn eligibility_agreement() {
    let rt = runtime();
    // The listener and pool are dropped in a Tokio context, even when a case fails.
    let _context = rt.enter();
    let (queue, listener) = rt.block_on(async {
        let pool = crate::testing::fresh_pool(4).await;
        let mut listener = sqlx::postgres::PgListener::connect_with(&pool)
            .await
            .unwrap();
        listener.listen("pullman_claimable").await.unwrap();
        (Queue::new(pool), listener)
    });
    let listener = std::cell::RefCell::new(listener);
    let mut runner = crate::testing::proptest_runner(crate::testing::proptest_cases(48));
    let strategy = (agent_case(), proptest::collection::vec(order_case(), 1..=5));
    let result = runner.run(&strategy, |(agent, orders)| {
        rt.block_on(check(&queue, &mut listener.borrow_mut(), agent, orders))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn claim_liveness_agreement() {
    let rt = runtime();
    let _context = rt.enter();
    let pool = rt.block_on(crate::testing::fresh_pool(1));
    // Microseconds from now: the boundary itself (0) and either side of it, PostgreSQL's
    // resolution, and well clear; `None` = no lease.
    let offset = || prop_oneof![Just(0i64), Just(-1), Just(1), -5_000_000i64..5_000_000];
    let strategy = (offset(), proptest::option::of(offset()));
    let statement = format!(
        "SELECT now() AS now, ({}\n) AS live FROM (SELECT now() + $1::bigint * interval '1 microsecond' \
         AS deadline, now() + $2::bigint * interval '1 microsecond' AS lease_expires_at) AS c",
        super::eligibility::LIVE_CLAIM_SQL
    );
    let mut runner = crate::testing::proptest_runner(256);
    let result = runner.run(&strategy, |(deadline, lease)| {
        let (now, live): (chrono::DateTime<chrono::Utc>, bool) = rt.block_on(
            sqlx::query_as(&statement)
                .bind(deadline)
                .bind(lease)
                .fetch_one(&pool),
        )?;
        let at = |us: i64| now + chrono::Duration::microseconds(us);
        let rust = eligibility::claim_is_live(at(deadline), lease.map(at), now);
        prop_assert_eq!(
            rust,
            live,
            "deadline {:+} µs, lease {:?} µs",
            deadline,
            lease
        );
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
