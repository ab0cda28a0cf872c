//! The hand-out order (docs/design.md §3, issue #40), against a real PostgreSQL: tenants take
//! turns in the order they were last served, then the higher priority goes first, then the
//! older; the position `explain` gives each waiting order is the claim that hands it out; and
//! the turns that maintenance drops while orders are created and claimed around it lose no
//! order.

use crate::support;

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use pullman::queue::{ClaimRequest, Queue, WaitReason};
use pullman::testing::{claim_next_id as claim, create_order, fresh_pool, register_agent};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n";

async fn agent(queue: &Queue, body: Value) -> Uuid {
    let id = register_agent(queue, body).await;
    // A claim is a contact: the agent is active, so its orders are `queued` with a position.
    assert_eq!(claim(queue, id).await, None);
    id
}

/// A ConfigMap order for agents labelled `prio`, of `tenant` at `priority`.
async fn order(queue: &Queue, tenant: Option<&str>, priority: i64) -> Uuid {
    let body = json!({
        "work_type": "custom",
        "yaml_content": CM,
        "tenant": tenant,
        "priority": priority,
        "targeting": {"labels": ["prio"]},
    });
    create_order(queue, body).await
}

/// One multi-claim of up to `n` orders by `agent` (the default lease); the ids it hands out, in
/// its order.
async fn claim_many(queue: &Queue, agent: Uuid, n: usize) -> Vec<Uuid> {
    let req = ClaimRequest {
        agent_id: agent,
        lease_seconds: None,
    };
    let many = queue.claim_next_many(&req, &[], n).await.unwrap();
    many.into_iter().map(|o| o.id).collect()
}

async fn position(queue: &Queue, order: Uuid) -> i64 {
    let e = queue.explain(order).await.unwrap();
    assert_eq!(e.reason, WaitReason::Queued, "{e:?}");
    e.position.unwrap_or_else(|| panic!("no position: {e:?}"))
}

/// Claims hand out the higher priority first, then the older; before each claim, every waiting
/// order's position is the claim that will hand it out.
async fn hands_out_in(queue: &Queue, agent: Uuid, expected: &[Uuid]) {
    for (i, _) in expected.iter().enumerate() {
        for (j, later) in expected.iter().enumerate().skip(i) {
            assert_eq!(
                position(queue, *later).await,
                (j - i) as i64 + 1,
                "order {j} before claim {}",
                i + 1
            );
        }
        assert_eq!(
            claim(queue, agent).await,
            Some(expected[i]),
            "claim {}",
            i + 1
        );
    }
    assert_eq!(claim(queue, agent).await, None);
}

/// One tenant: priority, then age.
#[tokio::test]
async fn higher_priority_first_then_the_oldest_and_positions_agree() {
    let queue = Queue::new(fresh_pool(4).await);
    let a = agent(&queue, json!({"name": "shared", "labels": ["prio"]})).await;
    let old = order(&queue, Some("a"), 0).await;
    let high = order(&queue, Some("a"), 5).await;
    let low = order(&queue, Some("a"), -1000).await;
    let newer = order(&queue, Some("a"), 0).await;
    let highest = order(&queue, Some("a"), 1000).await;
    let high_later = order(&queue, Some("a"), 5).await;
    hands_out_in(&queue, a, &[highest, high, high_later, old, newer, low]).await;
}

/// Several tenants: the one served least recently first (a new tenant's turn dates from its
/// first order), then priority, then age.
#[tokio::test]
async fn tenants_take_turns_then_priority_then_age_and_positions_agree() {
    let queue = Queue::new(fresh_pool(4).await);
    let a = agent(&queue, json!({"name": "shared", "labels": ["prio"]})).await;
    // Tenant `a` waits longest (its first order is the oldest), then `b`, then no tenant.
    let a1 = order(&queue, Some("a"), 0).await;
    let a2 = order(&queue, Some("a"), 5).await;
    let a3 = order(&queue, Some("a"), 0).await;
    let b1 = order(&queue, Some("b"), 0).await;
    let n1 = order(&queue, None, 0).await;
    let n2 = order(&queue, None, -1).await;
    let a4 = order(&queue, Some("a"), 0).await;
    // a's best (priority 5), b's only, no tenant's better one; then round two, and three.
    hands_out_in(&queue, a, &[a2, b1, n1, a1, n2, a3, a4]).await;
}

#[tokio::test]
async fn a_tenant_bound_agent_takes_its_tenants_orders_by_priority_then_age() {
    let queue = Queue::new(fresh_pool(4).await);
    let bound = agent(
        &queue,
        json!({"name": "bound", "labels": ["prio"], "tenant": "t"}),
    )
    .await;
    let low = order(&queue, Some("t"), -3).await;
    let _other = order(&queue, Some("u"), 9).await;
    let old = order(&queue, Some("t"), 0).await;
    let high = order(&queue, Some("t"), 1000).await;
    let new = order(&queue, Some("t"), 0).await;
    hands_out_in(&queue, bound, &[high, old, new, low]).await;
}

/// A multi-claim takes the same orders, in the same order, as that many single claims.
#[tokio::test]
async fn a_multi_claim_takes_priority_then_age() {
    let queue = Queue::new(fresh_pool(4).await);
    let a = agent(&queue, json!({"name": "many", "labels": ["prio"]})).await;
    let old = order(&queue, None, 0).await;
    let high = order(&queue, None, 2).await;
    let _low = order(&queue, None, -2).await;
    let newer = order(&queue, None, 0).await;
    let got = claim_many(&queue, a, 3).await;
    assert_eq!(got, [high, old, newer]);
}

async fn complete(queue: &Queue, order: Uuid, agent: Uuid) {
    let done = support::queue::done(true);
    queue.complete(order, agent, None, &done).await.unwrap();
}

/// `count` orders of `tenant` for agents labelled `prio`, inserted in one statement (as another
/// writer would: the trigger gives the tenant its turn), the oldest first.
async fn insert_backlog(pool: &PgPool, tenant: &str, count: i32) {
    sqlx::query(
        "INSERT INTO work_orders (id, work_type, yaml_content, max_retries, backoff_seconds, \
         claim_timeout_seconds, max_reclaims, target_labels, status, tenant, created_at) \
         SELECT gen_random_uuid(), 'custom', $1, 3, 60, 3600, 5, ARRAY['prio'], 'PENDING', \
           $2, now() - make_interval(secs => $3 * 2 - g) FROM generate_series(1, $3) g",
    )
    .bind(CM)
    .bind(tenant)
    .bind(count)
    .execute(pool)
    .await
    .unwrap();
}

/// A tenant that queues 1,000 orders does not make another wait behind them: the other's
/// order, created after all of them, goes at the second claim; a multi-claim takes from the
/// tenant whose turn it is before the next tenant's turn.
#[tokio::test]
async fn a_large_backlog_does_not_hold_another_tenant_back() {
    let pool = fresh_pool(4).await;
    let queue = Queue::new(pool.clone());
    let a = agent(&queue, json!({"name": "shared", "labels": ["prio"]})).await;
    insert_backlog(&pool, "big", 1000).await;
    let small = order(&queue, Some("small"), 0).await;
    assert_eq!(position(&queue, small).await, 2);
    let first = claim(&queue, a).await.unwrap();
    assert_ne!(first, small, "big waited longest: its turn comes first");
    assert_eq!(claim(&queue, a).await, Some(small));

    let small2 = order(&queue, Some("small"), 0).await;
    let small3 = order(&queue, Some("small"), 0).await;
    // `big` was served before `small`: its turn, and a multi-claim takes four of its orders
    // before `small`'s turn; then the turns alternate again.
    let got = claim_many(&queue, a, 4).await;
    assert_eq!(got.len(), 4);
    assert!(!got.contains(&small2) && !got.contains(&small3), "{got:?}");
    assert_eq!(claim(&queue, a).await, Some(small2));
    assert_ne!(claim(&queue, a).await, Some(small3));
    assert_eq!(claim(&queue, a).await, Some(small3));
}

/// Turns created by one statement share their time; a claim still moves its tenant's turn
/// behind all of them (they tie on time, and the walk orders ties by tenant key), so the
/// tenants alternate. (When "at the back" meant "served at the latest time", no tied turn ever
/// moved, and one tenant was handed out until its orders ran out.)
#[tokio::test]
async fn turns_created_together_still_alternate() {
    let pool = fresh_pool(4).await;
    let a = agent(
        &Queue::new(pool.clone()),
        json!({"name": "shared", "labels": ["prio"]}),
    )
    .await;
    // By age, t0's three orders come first, then t1's, then t2's.
    sqlx::query(
        "INSERT INTO work_orders (id, work_type, yaml_content, max_retries, backoff_seconds, \
         claim_timeout_seconds, max_reclaims, target_labels, status, tenant, created_at) \
         SELECT gen_random_uuid(), 'custom', $1, 3, 60, 3600, 5, ARRAY['prio'], 'PENDING', \
           't' || (g / 3), now() - make_interval(secs => 100 - g) FROM generate_series(0, 8) g",
    )
    .bind(CM)
    .execute(&pool)
    .await
    .unwrap();
    // A replica that has not looked at the turns yet (the insert above bypassed the queue).
    let queue = Queue::new(pool);
    let mut tenants = vec![];
    while let Some(o) = claim(&queue, a).await {
        tenants.push(queue.get_work_order(o).await.unwrap().tenant.unwrap());
    }
    assert_eq!(tenants.len(), 9);
    for round in tenants.chunks(3) {
        let distinct: HashSet<&String> = round.iter().collect();
        assert_eq!(distinct.len(), 3, "each tenant once a round: {tenants:?}");
    }
}

/// Two server replicas: the one that created a second tenant's first order hands out in turns
/// at once; the other, which knew one tenant, within `queue::turns::CHECK_EVERY` (1 s). Once the
/// first replica served `a`, `b`'s turn comes first, although `a`'s order has the higher
/// priority (which is what a replica still walking priority and age would hand out).
#[tokio::test]
async fn a_replica_learns_that_tenants_compete_within_a_second() {
    let pool = fresh_pool(6).await;
    let (one, other) = (Queue::new(pool.clone()), Queue::new(pool.clone()));
    let a = agent(&one, json!({"name": "shared", "labels": ["prio"]})).await;
    let a1 = order(&one, Some("a"), 0).await;
    let a2 = order(&one, Some("a"), 0).await;
    let a3 = order(&one, Some("a"), 0).await;
    assert_eq!(claim(&one, a).await, Some(a1));
    let b1 = order(&other, Some("b"), -10).await;
    assert_eq!(
        claim(&other, a).await,
        Some(a2),
        "a's turn is older than b's"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        claim(&one, a).await,
        Some(b1),
        "the other replica, a second later: b's turn, a having just been served"
    );
    assert_eq!(claim(&one, a).await, Some(a3));
}

/// Maintenance drops the turns of tenants without orders, and an order is never left without
/// its tenant's turn, however creations, claims and drops interleave: 4 tasks create, claim and
/// complete orders of 16 tenants while another drops idle turns in a loop; every order created
/// is handed out exactly once. (Without the table lock in `Queue::drop_idle_turns`, orders were
/// lost here: their tenant's turn was dropped as their creation committed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropping_idle_turns_loses_no_order() {
    let queue = Queue::new(fresh_pool(12).await);
    let a = agent(&queue, json!({"name": "shared", "labels": ["prio"]})).await;
    let stop = Arc::new(AtomicBool::new(false));
    let dropper = {
        let (queue, stop) = (queue.clone(), stop.clone());
        tokio::spawn(async move {
            let mut dropped = 0;
            while !stop.load(Ordering::Relaxed) {
                dropped += queue.drop_idle_turns().await.unwrap();
            }
            dropped
        })
    };
    let mut workers = vec![];
    for w in 0..4 {
        let queue = queue.clone();
        workers.push(tokio::spawn(async move {
            let (mut created, mut taken) = (vec![], vec![]);
            for i in 0..150 {
                let tenant = format!("t{}", (w * 150 + i) % 16);
                created.push(order(&queue, Some(&tenant), 0).await);
                if let Some(o) = claim(&queue, a).await {
                    complete(&queue, o, a).await;
                    taken.push(o);
                }
            }
            (created, taken)
        }));
    }
    let (mut created, mut taken) = (vec![], vec![]);
    for w in workers {
        let (c, t) = w.await.unwrap();
        created.extend(c);
        taken.extend(t);
    }
    stop.store(true, Ordering::Relaxed);
    let dropped = dropper.await.unwrap();
    while let Some(o) = claim(&queue, a).await {
        complete(&queue, o, a).await;
        taken.push(o);
    }
    let unique: HashSet<Uuid> = taken.iter().copied().collect();
    assert_eq!(unique.len(), taken.len(), "an order handed out twice");
    let created: BTreeSet<Uuid> = created.into_iter().collect();
    let taken: BTreeSet<Uuid> = taken.into_iter().collect();
    let lost: Vec<_> = created.difference(&taken).collect();
    assert!(lost.is_empty(), "orders never handed out: {lost:?}");
    assert!(
        dropped > 0,
        "no idle turn was ever dropped, so nothing was tried"
    );

    // Once nothing is left, every turn goes; a tenant's next order gets a new one.
    queue.drop_idle_turns().await.unwrap();
    let (left,): (i64,) = sqlx::query_as("SELECT count(*) FROM tenant_turns")
        .fetch_one(queue.pool())
        .await
        .unwrap();
    assert_eq!(left, 0, "turns of tenants without orders");
    let o = order(&queue, Some("t1"), 0).await;
    assert_eq!(claim(&queue, a).await, Some(o));
}
