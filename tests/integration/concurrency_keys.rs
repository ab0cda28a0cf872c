//! Concurrency keys (docs/design.md §3 "Concurrency keys", issue #40), against a real
//! PostgreSQL: at most `max` orders of one key (per tenant) hold a claim, whichever agents claim
//! them and however (claim-next, multi-claim, claim by id); the slot is freed by the end of the
//! claim and only by that (complete, reaper; a stale holder frees nothing); `supersede` cancels
//! the key's waiting orders; `explain` says `concurrency_limited` and names the holders; each freed
//! slot of a full key announces another waiting order (over HTTP: `concurrency_keys_wake.rs`).
//! The fault suite (`e2e/faults`) checks the keys again with two servers, killed agents, expired
//! leases and PostgreSQL restarts.

use crate::support;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pullman::queue::validate::validate_work_order;
use pullman::queue::{
    ClaimRequest, CompletionResult, ConflictCode, Outcome, Queue, QueueError, WaitReason,
};
use pullman::testing::{create_order, fresh_pool, register_agent};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n";

fn body(tenant: Option<&str>, concurrency: Option<Value>) -> Value {
    let mut b = json!({
        "work_type": "custom",
        "yaml_content": CM,
        "tenant": tenant,
        "targeting": {"labels": ["keys"]},
    });
    if let Some(c) = concurrency {
        b["concurrency"] = c;
    }
    b
}

async fn keyed(queue: &Queue, tenant: Option<&str>, key: &str, max: i64) -> Uuid {
    create_order(queue, body(tenant, Some(json!({"key": key, "max": max})))).await
}

async fn agent(queue: &Queue, name: &str) -> Uuid {
    register_agent(queue, json!({"name": name, "labels": ["keys"]})).await
}

fn req(agent_id: Uuid) -> ClaimRequest {
    ClaimRequest {
        agent_id,
        lease_seconds: None,
    }
}

async fn claim(queue: &Queue, agent: Uuid) -> Option<Uuid> {
    queue
        .claim_next(&req(agent), &[])
        .await
        .unwrap()
        .map(|o| o.id)
}

async fn complete(queue: &Queue, order: Uuid, agent: Uuid) {
    let done = support::queue::done(true);
    let r = queue.complete(order, agent, None, &done).await.unwrap();
    assert!(matches!(r, CompletionResult::Finished(_)), "{r:?}");
}

/// Per key holding claims, its slot counter and its claim rows, which must agree.
async fn held(pool: &PgPool) -> Vec<(i32, i64)> {
    sqlx::query_as(
        "SELECT s.held, (SELECT count(*) FROM work_order_claims c \
                         WHERE c.concurrency_slot = s.slot) \
         FROM concurrency_slots s WHERE s.held > 0 ORDER BY s.slot",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Claim-next passes over a full key to the next order, multi-claim takes no more than the free
/// slots, a complete frees one slot, and explain says why the rest wait and who holds the key.
#[tokio::test]
async fn a_key_holds_at_most_max_claims_and_a_complete_frees_one() {
    let pool = fresh_pool(4).await;
    let queue = Queue::new(pool.clone());
    let (a, b) = (agent(&queue, "a").await, agent(&queue, "b").await);
    let k: Vec<Uuid> = {
        let mut k = vec![];
        for _ in 0..4 {
            k.push(keyed(&queue, None, "deploy", 2).await);
        }
        k
    };
    let free = create_order(&queue, body(None, None)).await;

    assert_eq!(claim(&queue, a).await, Some(k[0]));
    assert_eq!(claim(&queue, b).await, Some(k[1]));
    // The key is full: the next claim takes the order after its orders.
    assert_eq!(claim(&queue, a).await, Some(free));
    assert_eq!(claim(&queue, b).await, None);
    assert_eq!(held(&pool).await, vec![(2, 2)]);

    let e = queue.explain(k[2]).await.unwrap();
    assert_eq!(e.reason, WaitReason::ConcurrencyLimited, "{e:?}");
    let key = e.concurrency.as_ref().unwrap();
    assert_eq!((key.key.as_str(), key.max, key.held), ("deploy", 2, 2));
    assert_eq!(key.holders, vec![k[0], k[1]]);
    assert!(
        e.message.contains("\"deploy\": 2 of 2 held"),
        "{}",
        e.message
    );
    assert!(e.position.is_none());

    // One complete frees one slot: a multi-claim of 3 gets one order.
    complete(&queue, k[0], a).await;
    assert_eq!(held(&pool).await, vec![(1, 1)]);
    let many = queue.claim_next_many(&req(b), &[], 3).await.unwrap();
    assert_eq!(many.iter().map(|o| o.id).collect::<Vec<_>>(), vec![k[2]]);
    for (o, who) in [(k[1], b), (k[2], b), (free, a)] {
        complete(&queue, o, who).await;
    }
    assert_eq!(held(&pool).await, vec![]);
    // The key still has an order waiting: its slot row stays until the key is idle.
    assert_eq!(queue.drop_idle_slots().await.unwrap(), 0);
    assert_eq!(claim(&queue, a).await, Some(k[3]));
    complete(&queue, k[3], a).await;
    assert_eq!(queue.drop_idle_slots().await.unwrap(), 1);
    // A key whose row maintenance dropped makes it again on its next claim.
    let again = keyed(&queue, None, "deploy", 2).await;
    sqlx::query("DELETE FROM concurrency_slots")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(claim(&queue, a).await, Some(again));
    assert_eq!(held(&pool).await, vec![(1, 1)]);
}

/// A multi-claim over one key takes no more than its max, and the position of a waiting order
/// does not count the orders of a full key before it.
#[tokio::test]
async fn multi_claim_stops_at_the_max_and_positions_skip_full_keys() {
    let pool = fresh_pool(4).await;
    let queue = Queue::new(pool.clone());
    let a = agent(&queue, "a").await;
    // In contact: its orders are `queued`, with a position.
    assert_eq!(claim(&queue, a).await, None);
    let mut k = vec![];
    for _ in 0..5 {
        k.push(keyed(&queue, None, "build", 3).await);
    }
    let after = create_order(&queue, body(None, None)).await;
    assert_eq!(
        queue.explain(after).await.unwrap().position,
        Some(6),
        "every keyed order is ahead while the key is free"
    );
    let many = queue.claim_next_many(&req(a), &[], 10).await.unwrap();
    let got: Vec<Uuid> = many.iter().map(|o| o.id).collect();
    assert_eq!(got, vec![k[0], k[1], k[2], after]);
    assert_eq!(held(&pool).await, vec![(3, 3)]);
    let late = create_order(&queue, body(None, None)).await;
    assert_eq!(queue.explain(late).await.unwrap().position, Some(1));
}

/// A key belongs to its tenant: the same key of two tenants is two keys.
#[tokio::test]
async fn keys_are_per_tenant() {
    let queue = Queue::new(fresh_pool(4).await);
    let a = agent(&queue, "a").await;
    let x = keyed(&queue, Some("x"), "deploy", 1).await;
    let x2 = keyed(&queue, Some("x"), "deploy", 1).await;
    let y = keyed(&queue, Some("y"), "deploy", 1).await;
    let none = keyed(&queue, None, "deploy", 1).await;
    let mut got = HashSet::new();
    while let Some(o) = claim(&queue, a).await {
        got.insert(o);
    }
    assert_eq!(got, HashSet::from([x, y, none]));
    let e = queue.explain(x2).await.unwrap();
    assert_eq!(e.reason, WaitReason::ConcurrencyLimited);
    assert_eq!(e.concurrency.unwrap().holders, vec![x]);
}

/// Claim by id of an order whose key is full is `409 concurrency_limited`; nothing changes.
#[tokio::test]
async fn claim_by_id_of_a_full_key_is_refused() {
    let pool = fresh_pool(4).await;
    let queue = Queue::new(pool.clone());
    let a = agent(&queue, "a").await;
    let first = keyed(&queue, None, "k", 1).await;
    let second = keyed(&queue, None, "k", 1).await;
    queue.claim(first, &req(a)).await.unwrap();
    match queue.claim(second, &req(a)).await {
        Err(QueueError::Conflict { code, message }) => {
            assert_eq!(code, ConflictCode::ConcurrencyLimited);
            assert!(message.contains("\"k\""), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(held(&pool).await, vec![(1, 1)]);
}

/// An expired lease frees the slot once, when the reaper ends the claim; the order is handed
/// out again, and the stale holder's complete is refused and frees nothing.
#[tokio::test]
async fn an_expired_claim_frees_its_slot_once_and_its_stale_holder_nothing() {
    let pool = fresh_pool(4).await;
    let queue = Queue::new(pool.clone());
    let (a, b) = (agent(&queue, "a").await, agent(&queue, "b").await);
    let o = keyed(&queue, None, "k", 1).await;
    let next = keyed(&queue, None, "k", 1).await;
    let with_lease = ClaimRequest {
        agent_id: a,
        lease_seconds: Some(30),
    };
    let claimed = queue.claim_next(&with_lease, &[]).await.unwrap().unwrap();
    assert_eq!(claimed.id, o);
    // An expired lease still holds the slot until the claim is ended.
    sqlx::query("UPDATE work_order_claims SET lease_expires_at = now() - interval '1 second'")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(claim(&queue, b).await, None);
    assert_eq!(held(&pool).await, vec![(1, 1)]);
    assert_eq!(queue.reap_stale_claims().await.unwrap(), (1, 0));
    assert_eq!(held(&pool).await, vec![]);
    // Reclaimed by b: the key is full again.
    assert_eq!(claim(&queue, b).await, Some(o));
    let stale = support::queue::done(true);
    let refused = queue.complete(o, a, claimed.claim_id, &stale).await;
    assert!(
        matches!(refused, Err(QueueError::Conflict { .. })),
        "{refused:?}"
    );
    assert_eq!(held(&pool).await, vec![(1, 1)]);
    assert_eq!(claim(&queue, a).await, None, "{next} must wait");
    complete(&queue, o, b).await;
    assert_eq!(claim(&queue, a).await, Some(next));
}

/// `supersede` cancels the key's waiting orders (a retry backing off among them), never the
/// claimed one, and leaves other keys and tenants alone.
#[tokio::test]
async fn supersede_cancels_the_waiting_orders_of_the_key_only() {
    let pool = fresh_pool(4).await;
    let queue = Queue::new(pool.clone());
    let a = agent(&queue, "a").await;
    let running = keyed(&queue, None, "deploy", 1).await;
    assert_eq!(claim(&queue, a).await, Some(running));
    let waiting = keyed(&queue, None, "deploy", 1).await;
    let other_key = keyed(&queue, None, "other", 1).await;
    let other_tenant = keyed(&queue, Some("t"), "deploy", 1).await;
    let newest = create_order(
        &queue,
        body(
            None,
            Some(json!({"key": "deploy", "max": 1, "on_conflict": "supersede"})),
        ),
    )
    .await;
    let entry = queue.get_log_entry(waiting).await.unwrap();
    assert_eq!(entry.outcome, Outcome::Cancelled);
    assert_eq!(
        entry.message.as_deref(),
        Some(format!("superseded by work order {newest}").as_str())
    );
    for alive in [running, other_key, other_tenant, newest] {
        queue.get_work_order(alive).await.unwrap();
    }
    let order = queue.get_work_order(newest).await.unwrap();
    let c = order.concurrency.unwrap();
    assert_eq!((c.key.as_str(), c.max), ("deploy", 1));
    assert_eq!(c.on_conflict, pullman::queue::OnConflict::Supersede);
}

/// Bad `concurrency` is refused naming the field, before anything is written.
#[test]
fn bad_concurrency_is_refused_naming_the_field() {
    for (concurrency, field) in [
        (json!({"key": "k", "max": 0}), "concurrency.max"),
        (json!({"key": "k", "max": 100_001}), "concurrency.max"),
        (json!({"key": ""}), "concurrency.key"),
        (json!({"key": "k".repeat(257)}), "concurrency.key"),
    ] {
        let new = serde_json::from_value(body(None, Some(concurrency.clone()))).unwrap();
        match validate_work_order(new) {
            Err(QueueError::Invalid { field: f, .. }) => assert_eq!(f, field, "{concurrency}"),
            other => panic!("{concurrency}: {other:?}"),
        }
    }
    let unknown = body(None, Some(json!({"key": "k", "on_conflict": "cancel"})));
    assert!(serde_json::from_value::<pullman::queue::NewWorkOrder>(unknown).is_err());
}

/// Slots freed in one transaction (a batch of completes, the reaper) each announce another
/// waiting order: PostgreSQL folds equal notices of one transaction into one, so two announcing
/// the same order would wake one claimer for two free slots.
#[tokio::test]
async fn slots_freed_in_one_transaction_announce_different_orders() {
    let pool = fresh_pool(4).await;
    let queue = Queue::new(pool.clone());
    let a = agent(&queue, "a").await;
    let holders = [
        keyed(&queue, None, "pair", 2).await,
        keyed(&queue, None, "pair", 2).await,
    ];
    let waiting = [
        keyed(&queue, None, "pair", 2).await,
        keyed(&queue, None, "pair", 2).await,
        keyed(&queue, None, "pair", 2).await,
    ];
    let claimed = queue.claim_next_many(&req(a), &[], 2).await.unwrap();
    assert_eq!(claimed.iter().map(|o| o.id).collect::<Vec<_>>(), holders);
    // The key is full, and a claimer finds it so.
    assert_eq!(claim(&queue, a).await, None);
    let mut listener = sqlx::postgres::PgListener::connect_with(&pool)
        .await
        .unwrap();
    listener.listen("pullman_claimable").await.unwrap();
    sqlx::query("DELETE FROM work_order_claims WHERE work_order_id = ANY ($1)")
        .bind(&holders[..])
        .execute(&pool)
        .await
        .unwrap();
    let mut announced = HashSet::new();
    for _ in 0..2 {
        let n = tokio::time::timeout(Duration::from_secs(5), listener.recv())
            .await
            .expect("a notice for each freed slot")
            .unwrap();
        let v: Value = serde_json::from_str(n.payload()).unwrap();
        announced.insert(v["id"].as_str().unwrap().parse::<Uuid>().unwrap());
    }
    assert_eq!(announced, HashSet::from([waiting[0], waiting[1]]));
}

/// Real concurrency: agents on two queues (two servers' connection pools) claim, multi-claim,
/// complete and abandon claims that the reaper then ends, while a checker reads the claims in
/// one statement after another. No key ever holds more claims than its max, its counter always
/// equals its claims, every order finishes once, and no slot is left held.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn under_concurrent_claims_and_reaping_no_key_passes_its_max() {
    const KEYS: usize = 12;
    const ORDERS: usize = 600;
    let pool = fresh_pool(24).await;
    let queues = [
        Arc::new(Queue::new(pool.clone())),
        Arc::new(Queue::new(fresh_clone(&pool).await)),
    ];
    let mut ids = vec![];
    for n in 0..ORDERS {
        let c = (n % 4 != 3).then(|| {
            let k = n % KEYS;
            json!({"key": format!("k{k}"), "max": 1 + k % 3})
        });
        let mut b = body(None, c);
        b["max_reclaims"] = json!(100);
        ids.push(create_order(&queues[0], b).await);
    }
    let mut agents = vec![];
    for n in 0..16 {
        agents.push(agent(&queues[n % 2], &format!("agent-{n}")).await);
    }
    let done = Arc::new(AtomicBool::new(false));
    let checks = Arc::new(AtomicUsize::new(0));
    let checker = {
        let (pool, done, checks) = (pool.clone(), done.clone(), checks.clone());
        tokio::spawn(async move {
            let mut violations = vec![];
            while !done.load(Ordering::Relaxed) {
                let rows: Vec<(String, i32, i64, Option<i32>)> = sqlx::query_as(
                    "SELECT max(w.concurrency_key), max(w.concurrency_max), count(*), \
                            max(s.held) \
                     FROM work_order_claims c JOIN work_orders w ON w.id = c.work_order_id \
                     LEFT JOIN concurrency_slots s ON s.slot = c.concurrency_slot \
                     WHERE c.concurrency_slot IS NOT NULL GROUP BY c.concurrency_slot",
                )
                .fetch_all(&pool)
                .await
                .unwrap();
                for (key, max, claims, held) in rows {
                    if claims > i64::from(max) || held.map(i64::from) != Some(claims) {
                        violations
                            .push(format!("{key}: {claims} claims, max {max}, held {held:?}"));
                    }
                }
                checks.fetch_add(1, Ordering::Relaxed);
            }
            violations
        })
    };
    let abandoned = Arc::new(AtomicUsize::new(0));
    let reaper = {
        let (queue, pool, done) = (queues[1].clone(), pool.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                // An abandoned claim's lease runs out now rather than in seconds.
                sqlx::query(
                    "UPDATE work_order_claims SET lease_expires_at = now() \
                     WHERE lease_seconds = 999",
                )
                .execute(&pool)
                .await
                .unwrap();
                queue.reap_stale_claims().await.unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let mut workers = vec![];
    for (n, agent_id) in agents.iter().copied().enumerate() {
        let queue = queues[n % 2].clone();
        let abandoned = abandoned.clone();
        workers.push(tokio::spawn(async move {
            let mut finished = vec![];
            let mut idle_since = Instant::now();
            let mut round = 0usize;
            while idle_since.elapsed() < Duration::from_secs(3) {
                round += 1;
                // Every 10th claim by this agent is abandoned: its lease is expired and reaped.
                let abandon = round % 10 == n % 10;
                let r = ClaimRequest {
                    agent_id,
                    lease_seconds: Some(if abandon { 999 } else { 300 }),
                };
                let claimed = queue.claim_next_many(&r, &[], 1 + round % 3).await.unwrap();
                if claimed.is_empty() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                idle_since = Instant::now();
                tokio::task::yield_now().await;
                for o in claimed {
                    if abandon {
                        abandoned.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let done = support::queue::done(true);
                    match queue.complete(o.id, agent_id, o.claim_id, &done).await {
                        Ok(CompletionResult::Finished(_)) => finished.push(o.id),
                        Ok(other) => panic!("{other:?}"),
                        // Reaped before the complete (a multi-claim abandoned in part is not
                        // possible, but the reaper is not the only one that ends claims).
                        Err(QueueError::Conflict { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
            }
            finished
        }));
    }
    let mut finished = vec![];
    for w in workers {
        finished.extend(w.await.unwrap());
    }
    done.store(true, Ordering::Relaxed);
    reaper.await.unwrap();
    let violations = checker.await.unwrap();
    assert!(violations.is_empty(), "{violations:#?}");
    assert!(
        checks.load(Ordering::Relaxed) > 50,
        "the checker barely ran"
    );
    assert!(
        abandoned.load(Ordering::Relaxed) > 0,
        "no claim was abandoned"
    );
    let unique: HashSet<Uuid> = finished.iter().copied().collect();
    assert_eq!(unique.len(), finished.len(), "an order completed twice");
    assert_eq!(
        unique,
        ids.into_iter().collect::<HashSet<_>>(),
        "orders lost"
    );
    assert_eq!(held(&pool).await, vec![]);
}

/// A second pool on the same database as `pool`: another server's connections.
async fn fresh_clone(pool: &PgPool) -> PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap()
}
