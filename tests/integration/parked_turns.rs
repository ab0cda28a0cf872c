//! Parked tenant turns (docs/design.md §3 "Parked turns", issue #40), against a real
//! PostgreSQL: a tenant with nothing to hand out leaves the claims' walk and comes back at the
//! back when it has an order again (created, or a claimed one back in the queue); under creations
//! and claims racing on the same few tenants, no moment has a parked turn whose tenant has an
//! order waiting; and maintenance unparks a turn that was stranded anyway.

use crate::support;
use crate::support::queue::parked;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use pullman::queue::Queue;
use pullman::testing::{claim_next_id as claim, create_order, fresh_pool, register_agent};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n";

/// Parked turns whose tenants have an order to hand out: what must never be seen.
const STRANDED: &str = "SELECT count(*) FROM tenant_turns t WHERE t.served_at = 'infinity' \
     AND EXISTS (SELECT 1 FROM work_orders w WHERE w.tenant_key = t.tenant_key \
                 AND w.status IN ('PENDING', 'RETRY_PENDING'))";

/// A queue over a fresh database, its pool, and an agent that takes the orders below: what
/// every test here starts from.
async fn queue_and_agent() -> (Queue, PgPool, Uuid) {
    let queue = Queue::new(fresh_pool(4).await);
    let pool = queue.pool().clone();
    let agent = register_agent(&queue, json!({"name": "a", "labels": ["park"]})).await;
    (queue, pool, agent)
}

/// Creates an order of `tenant` that the agent of [`queue_and_agent`] may take.
async fn order(queue: &Queue, tenant: &str) -> Uuid {
    let body = json!({
        "work_type": "custom",
        "yaml_content": CM,
        "tenant": tenant,
        "targeting": {"labels": ["park"]},
    });
    create_order(queue, body).await
}

async fn finish(queue: &Queue, order: Uuid, agent: Uuid, success: bool) {
    let done = support::queue::done(success);
    queue.complete(order, agent, None, &done).await.unwrap();
}

async fn stranded(pool: &PgPool) -> i64 {
    sqlx::query_scalar(STRANDED).fetch_one(pool).await.unwrap()
}

/// A claim that takes a tenant's last order parks its turn; the tenant's next order unparks it
/// in its place, when it was last served: behind a tenant that has waited since before that,
/// ahead of one served after.
#[tokio::test]
async fn a_tenant_without_orders_parks_and_comes_back_at_the_back() {
    let (queue, pool, agent) = queue_and_agent().await;
    let a1 = order(&queue, "a").await;
    let b1 = order(&queue, "b").await;
    let b2 = order(&queue, "b").await;
    let c1 = order(&queue, "c").await;

    assert_eq!(claim(&queue, agent).await, Some(a1));
    assert_eq!(parked(&pool).await, ["a"], "a has nothing left to hand out");
    assert_eq!(claim(&queue, agent).await, Some(b1));
    assert_eq!(parked(&pool).await, ["a"], "b still has an order");
    let a2 = order(&queue, "a").await;
    assert!(parked(&pool).await.is_empty(), "a's new order unparks it");
    assert_eq!(
        claim(&queue, agent).await,
        Some(c1),
        "c waited longer than a"
    );
    assert_eq!(parked(&pool).await, ["c"]);
    assert_eq!(
        claim(&queue, agent).await,
        Some(a2),
        "a, back in its place, was served before b"
    );
    assert_eq!(claim(&queue, agent).await, Some(b2));
    assert_eq!(parked(&pool).await, ["a", "b", "c"]);
    assert_eq!(claim(&queue, agent).await, None);
    assert_eq!(stranded(&pool).await, 0);
}

/// A claimed order that goes back to the queue (failed with retries left) unparks its tenant's
/// turn in the same transaction.
#[tokio::test]
async fn a_claimed_order_back_in_the_queue_unparks_its_tenant() {
    let (queue, pool, agent) = queue_and_agent().await;
    let a1 = order(&queue, "a").await;
    order(&queue, "b").await;
    assert_eq!(claim(&queue, agent).await, Some(a1));
    assert_eq!(parked(&pool).await, ["a"]);
    finish(&queue, a1, agent, false).await;
    let (status,): (String,) = sqlx::query_as("SELECT status FROM work_orders WHERE id = $1")
        .bind(a1)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(status, "RETRY_PENDING");
    assert!(parked(&pool).await.is_empty(), "a has an order again");
}

/// Two statements that requeue orders of the same two parked tenants in opposite orders (two
/// reapers, or the reaper and a retirement) neither deadlock nor wait for each other: each
/// unparks the turn it reaches first and skips the one the other holds.
#[tokio::test]
async fn requeues_in_opposite_orders_do_not_deadlock() {
    let (queue, pool, agent) = queue_and_agent().await;
    let (a1, b1) = (order(&queue, "a").await, order(&queue, "b").await);
    let (a2, b2) = (order(&queue, "a").await, order(&queue, "b").await);
    while claim(&queue, agent).await.is_some() {}
    assert_eq!(parked(&pool).await, ["a", "b"]);
    let requeue = "UPDATE work_orders SET status = 'PENDING' WHERE id = $1";
    let (mut one, mut two) = (pool.begin().await.unwrap(), pool.begin().await.unwrap());
    for tx in [&mut one, &mut two] {
        // Waiting would show as an error here rather than as a hung test.
        sqlx::query("SET LOCAL lock_timeout = '3s'")
            .execute(&mut **tx)
            .await
            .unwrap();
    }
    for (first, id) in [(true, a1), (false, b1), (true, b2), (false, a2)] {
        let tx = if first { &mut one } else { &mut two };
        sqlx::query(requeue)
            .bind(id)
            .execute(&mut **tx)
            .await
            .unwrap_or_else(|e| panic!("requeue of {id}: {e}"));
    }
    one.commit().await.unwrap();
    two.commit().await.unwrap();
    assert!(parked(&pool).await.is_empty(), "each unparked one turn");
}

/// A turn parked while its tenant has an order (as a statement creating orders of more than 64
/// tenants can leave one): a maintenance pass unparks it, at the back; and without the repair its
/// order is still handed out, once the live turns have nothing (or by age, in the plain walk).
#[tokio::test]
async fn a_stranded_turn_is_unparked_by_maintenance_and_late_not_lost() {
    let (queue, pool, agent) = queue_and_agent().await;
    let a1 = order(&queue, "a").await;
    let b1 = order(&queue, "b").await;
    let b2 = order(&queue, "b").await;
    let c1 = order(&queue, "c").await;
    let c2 = order(&queue, "c").await;
    let strand = "UPDATE tenant_turns SET served_at = 'infinity' WHERE tenant = 'a'";
    sqlx::query(strand).execute(&pool).await.unwrap();
    assert_eq!(stranded(&pool).await, 1);
    assert_eq!(claim(&queue, agent).await, Some(b1), "a live turn first");
    let report = queue.maintain().await.unwrap();
    assert_eq!(report.turns_unparked, 1, "{report:?}");
    assert_eq!(stranded(&pool).await, 0);
    assert!(parked(&pool).await.is_empty());
    // Parked here without a last service, so unparked at now, the back: behind c (waiting since
    // its creation) and b (served before the repair).
    assert_eq!(claim(&queue, agent).await, Some(c1));
    assert_eq!(claim(&queue, agent).await, Some(b2));
    assert_eq!(claim(&queue, agent).await, Some(a1));

    let a2 = order(&queue, "a").await;
    sqlx::query(strand).execute(&pool).await.unwrap();
    assert_eq!(claim(&queue, agent).await, Some(c2));
    assert_eq!(claim(&queue, agent).await, Some(a2), "late, not lost");
    assert_eq!(claim(&queue, agent).await, None);
}

/// Creations and claims race on four tenants, so turns are parked and unparked all the time:
/// a watcher that looks every few milliseconds never sees a parked turn whose tenant has an
/// order waiting, it does see parked turns, and every order is handed out once.
#[tokio::test]
async fn parks_and_unparks_racing_never_strand_an_order() {
    let queue = Queue::new(fresh_pool(20).await);
    let pool = queue.pool().clone();
    let mut agents = vec![];
    for i in 0..6 {
        let body = json!({"name": format!("w{i}"), "labels": ["park"]});
        agents.push(register_agent(&queue, body).await);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (pool, stop) = (pool.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut looks, mut saw_parked, mut violations) = (0u32, 0u32, 0i64);
            while !stop.load(Ordering::Relaxed) {
                let (strand, parked): (i64, i64) = sqlx::query_as(&format!(
                    "SELECT ({STRANDED}), \
                     (SELECT count(*) FROM tenant_turns WHERE served_at = 'infinity')"
                ))
                .fetch_one(&pool)
                .await
                .unwrap();
                looks += 1;
                violations += strand;
                saw_parked += u32::from(parked > 0);
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            (looks, saw_parked, violations)
        })
    };
    let mut creators = vec![];
    for c in 0..6 {
        let queue = queue.clone();
        creators.push(tokio::spawn(async move {
            let mut made = vec![];
            for i in 0..120 {
                made.push(order(&queue, &format!("t{}", (c + i) % 4)).await);
            }
            made
        }));
    }
    let creating = Arc::new(AtomicBool::new(true));
    let mut workers = vec![];
    for agent in agents.clone() {
        let (queue, creating) = (queue.clone(), creating.clone());
        workers.push(tokio::spawn(async move {
            let mut taken = vec![];
            loop {
                match claim(&queue, agent).await {
                    Some(o) => {
                        finish(&queue, o, agent, true).await;
                        taken.push(o);
                    }
                    None if creating.load(Ordering::Relaxed) => tokio::task::yield_now().await,
                    None => return taken,
                }
            }
        }));
    }
    let mut created = vec![];
    for c in creators {
        created.extend(c.await.unwrap());
    }
    creating.store(false, Ordering::Relaxed);
    let mut taken = vec![];
    for w in workers {
        taken.extend(w.await.unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    let (looks, saw_parked, violations) = watcher.await.unwrap();
    assert_eq!(
        violations, 0,
        "parked turns with orders waiting, over {looks} looks"
    );
    assert!(
        saw_parked > 0,
        "no look saw a parked turn in {looks}: nothing was tested"
    );
    created.sort();
    taken.sort();
    let before = taken.len();
    taken.dedup();
    assert_eq!(taken.len(), before, "an order handed out twice");
    assert_eq!(taken, created, "every order handed out once");
}
