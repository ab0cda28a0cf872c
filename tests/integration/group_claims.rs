//! Group claims (`queue::claims::group`, issue #34), against a real PostgreSQL with real
//! concurrency: one-order claims of agents that arrive together share statements, hand every
//! order out once, and hand each agent only what it may take, in hand-out order; what the group
//! cannot serve (an agent with an order targeting it by name, another profile, a retired or
//! unknown agent) is answered as a lone claim would be.

use std::collections::HashSet;
use std::sync::Arc;

use crate::support::queue::{done, parked};

use pullman::queue::{ClaimRequest, ConflictCode, Queue, QueueError};
use pullman::testing::{create_order, eventually, fresh_pool, register_agent};
use serde_json::{Value, json};
use tokio::sync::Barrier;
use uuid::Uuid;

const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n";

async fn queue() -> Queue {
    Queue::new(fresh_pool(24).await)
        .with_group_claims(32)
        .with_group_commit(64)
}

fn order(targeting: Value) -> Value {
    json!({"work_type": "custom", "yaml_content": CM, "targeting": targeting})
}

fn req(agent_id: Uuid) -> ClaimRequest {
    ClaimRequest {
        agent_id,
        lease_seconds: None,
    }
}

/// Each of `agents` claims one order at the same moment; their answers in the same order.
async fn claim_together(queue: &Queue, agents: &[Uuid]) -> Vec<Result<Option<Uuid>, QueueError>> {
    let barrier = Arc::new(Barrier::new(agents.len()));
    let tasks: Vec<_> = agents
        .iter()
        .map(|&agent| {
            let (queue, barrier) = (queue.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                queue
                    .claim_next(&req(agent), &[])
                    .await
                    .map(|o| o.map(|o| o.id))
            })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    answers
}

/// 16 agents labelled `gc` claim and complete the queue's `orders` orders one at a time, all at
/// once, until none is left: every order is claimed once and logged once, and claims shared
/// commits (a statement's claims share its `claimed_at`, the transaction's `now()`).
async fn drain_together(queue: &Queue, orders: usize) {
    let mut agents = Vec::new();
    for i in 0..16 {
        agents.push(
            register_agent(queue, json!({"name": format!("gc-{i}"), "labels": ["gc"]})).await,
        );
    }
    let success = done(true);
    let tasks: Vec<_> = agents
        .iter()
        .map(|&agent| {
            let (queue, success) = (queue.clone(), success.clone());
            tokio::spawn(async move {
                let mut claimed = Vec::new();
                while let Some(o) = queue.claim_next(&req(agent), &[]).await.unwrap() {
                    assert_eq!(o.claimed_by, Some(agent), "the order names its claimer");
                    claimed.push((o.id, o.claimed_at.expect("a claim has its time")));
                    queue
                        .complete(o.id, agent, o.claim_id, &success)
                        .await
                        .unwrap();
                }
                claimed
            })
        })
        .collect();
    let mut ids = HashSet::new();
    let mut times = HashSet::new();
    for t in tasks {
        for (id, at) in t.await.unwrap() {
            assert!(ids.insert(id), "order {id} claimed twice");
            times.insert(at);
        }
    }
    assert_eq!(ids.len(), orders, "every order claimed");
    let (logged,): (i64,) = sqlx::query_as("SELECT count(DISTINCT id) FROM work_order_log")
        .fetch_one(queue.pool())
        .await
        .unwrap();
    assert_eq!(logged as usize, orders, "every order logged once");
    assert!(
        times.len() < orders,
        "{orders} claims of 16 agents took {orders} commits: no claims were grouped"
    );
}

/// [`drain_together`] over 400 orders without a tenant (the plain walk).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_sent_together_share_commits_and_hand_each_order_out_once() {
    let queue = queue().await;
    for _ in 0..400 {
        create_order(&queue, order(json!({"labels": ["gc"]}))).await;
    }
    drain_together(&queue, 400).await;
}

/// The oldest order targets agent `x` by name; `x` and seven agents of the same labels claim at
/// once: `x` gets that order (its first in hand-out order), the others each get one of the
/// label's orders, and none of them the one meant for `x`. Four rounds, as who arrives first
/// (and so leads the group's walk) is up to the scheduler.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_an_order_names_gets_it_first_and_no_other_agent_does() {
    for _ in 0..4 {
        let queue = queue().await;
        let named = create_order(&queue, order(json!({"agent_names": ["x"]}))).await;
        let mut labelled = HashSet::new();
        for _ in 0..20 {
            labelled.insert(create_order(&queue, order(json!({"labels": ["gc"]}))).await);
        }
        let x = register_agent(&queue, json!({"name": "x", "labels": ["gc"]})).await;
        let mut agents = vec![x];
        for i in 0..7 {
            let body = json!({"name": format!("o-{i}"), "labels": ["gc"]});
            agents.push(register_agent(&queue, body).await);
        }
        let answers = claim_together(&queue, &agents).await;
        assert_eq!(
            answers[0].as_ref().unwrap(),
            &Some(named),
            "x gets its own order first"
        );
        let mut seen = HashSet::new();
        for a in &answers[1..] {
            let id = a.as_ref().unwrap().expect("an order for each agent");
            assert!(
                labelled.contains(&id),
                "another agent got {id}, not one of the label's"
            );
            assert!(seen.insert(id), "{id} handed out twice");
        }
    }
}

/// Agents of two profiles claim at once: each gets an order of its own label only.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agents_of_other_profiles_claim_only_what_they_may_take() {
    let queue = queue().await;
    let (mut blue, mut green) = (HashSet::new(), HashSet::new());
    for _ in 0..8 {
        blue.insert(create_order(&queue, order(json!({"labels": ["blue"]}))).await);
        green.insert(create_order(&queue, order(json!({"labels": ["green"]}))).await);
    }
    let mut agents = Vec::new();
    for i in 0..8 {
        let label = if i % 2 == 0 { "blue" } else { "green" };
        agents.push((
            label,
            register_agent(&queue, json!({"name": format!("p-{i}"), "labels": [label]})).await,
        ));
    }
    let ids: Vec<Uuid> = agents.iter().map(|(_, id)| *id).collect();
    let answers = claim_together(&queue, &ids).await;
    let mut seen = HashSet::new();
    for ((label, _), answer) in agents.iter().zip(answers) {
        let id = answer.unwrap().expect("an order for each agent");
        let mine = if *label == "blue" { &blue } else { &green };
        assert!(mine.contains(&id), "a {label} agent got {id}");
        assert!(seen.insert(id), "{id} handed out twice");
    }
}

/// A retired and an unknown agent claiming together with others are answered as alone: 409
/// `agent_retired` and 404; the others get their orders.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retired_or_unknown_agent_in_a_group_is_answered_as_alone() {
    let queue = queue().await;
    for _ in 0..4 {
        create_order(&queue, order(json!({"labels": ["gc"]}))).await;
    }
    let retired = register_agent(&queue, json!({"name": "gone", "labels": ["gc"]})).await;
    sqlx::query("UPDATE agents SET retired_at = now() WHERE id = $1")
        .bind(retired)
        .execute(queue.pool())
        .await
        .unwrap();
    let unknown = Uuid::new_v4();
    let a = register_agent(&queue, json!({"name": "a", "labels": ["gc"]})).await;
    let b = register_agent(&queue, json!({"name": "b", "labels": ["gc"]})).await;
    let answers = claim_together(&queue, &[a, retired, unknown, b]).await;
    assert!(matches!(answers[0], Ok(Some(_))), "{:?}", answers[0]);
    assert!(
        matches!(
            &answers[1],
            Err(QueueError::Conflict {
                code: ConflictCode::AgentRetired,
                ..
            })
        ),
        "{:?}",
        answers[1]
    );
    assert!(
        matches!(&answers[2], Err(QueueError::NotFound { what: "agent", .. })),
        "{:?}",
        answers[2]
    );
    assert!(matches!(answers[3], Ok(Some(_))), "{:?}", answers[3]);
}

/// An order of `tenant` for agents labelled `gc`.
async fn tenant_order(queue: &Queue, tenant: &str) -> Uuid {
    let body = json!({"work_type": "custom", "yaml_content": CM, "tenant": tenant,
                      "targeting": {"labels": ["gc"]}});
    create_order(queue, body).await
}

/// While tenants compete, agents claiming together hand out what single claims one after
/// another would: tenants `a` and `b` (one order each, served first as their turns are oldest),
/// then `c`'s two oldest, whether the four claims ran as one group, several or alone; the turns
/// of `a` and `b`, left without orders, are parked after the commit (within two seconds). Claims shared a commit in
/// at least one of the rounds, so the fair group statement ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn while_tenants_compete_grouped_claims_hand_out_by_turns_and_park_idle_ones() {
    let mut grouped = false;
    for _ in 0..6 {
        let queue = queue().await;
        let a = tenant_order(&queue, "a").await;
        let b = tenant_order(&queue, "b").await;
        let mut c = Vec::new();
        for _ in 0..6 {
            c.push(tenant_order(&queue, "c").await);
        }
        let mut agents = Vec::new();
        for i in 0..4 {
            let body = json!({"name": format!("f-{i}"), "labels": ["gc"]});
            agents.push(register_agent(&queue, body).await);
        }
        // The queue reads that tenants compete at a claim: one that takes nothing, so the
        // claims below do not go on with what it knew before the orders (`queue::turns`).
        let other = register_agent(&queue, json!({"name": "other", "labels": ["none"]})).await;
        assert!(queue.claim_next(&req(other), &[]).await.unwrap().is_none());
        let answers = claim_together(&queue, &agents).await;
        let mut got: Vec<Uuid> = answers
            .into_iter()
            .map(|a| a.unwrap().expect("an order for each agent"))
            .collect();
        got.sort();
        let mut want = vec![a, b, c[0], c[1]];
        want.sort();
        assert_eq!(got, want, "not what four single claims would hand out");
        // A group parks after it answered its claims: give it a moment.
        eventually(
            2,
            "a's and b's turns (idle) parked, and no other",
            || async { (parked(queue.pool()).await == ["a", "b"]).then_some(()) },
        )
        .await;
        let (times,): (i64,) =
            sqlx::query_as("SELECT count(DISTINCT claimed_at) FROM work_order_claims")
                .fetch_one(queue.pool())
                .await
                .unwrap();
        grouped |= times < 4;
    }
    assert!(
        grouped,
        "in six rounds, no two of four claims shared a commit"
    );
}

/// [`drain_together`] over 400 orders of 20 tenants, which compete until the last ones run out
/// (the fair walk, `sql/claim_next_group_fair.sql`): the claims grouped in fair mode hand each
/// order out once too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fair_group_claims_hand_each_order_out_once() {
    let queue = queue().await;
    for i in 0..400 {
        tenant_order(&queue, &format!("t{}", i % 20)).await;
    }
    drain_together(&queue, 400).await;
}

/// While tenants compete, agents bound to tenant `b` claim together with agents of no tenant:
/// each bound agent gets one of `b`'s orders (its only turn), the others orders in turn order,
/// and no order goes out twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agents_bound_to_a_tenant_claim_only_its_orders_in_a_group() {
    // Four rounds: who arrives first, and so leads the group, is up to the scheduler.
    for _ in 0..4 {
        let queue = queue().await;
        let (mut a, mut b) = (HashSet::new(), HashSet::new());
        for _ in 0..8 {
            a.insert(tenant_order(&queue, "a").await);
            b.insert(tenant_order(&queue, "b").await);
        }
        let mut agents = Vec::new();
        for i in 0..8 {
            let bound = i % 2 == 0;
            let body = if bound {
                json!({"name": format!("b-{i}"), "labels": ["gc"], "tenant": "b"})
            } else {
                json!({"name": format!("any-{i}"), "labels": ["gc"]})
            };
            agents.push((bound, register_agent(&queue, body).await));
        }
        // The queue reads that tenants compete before the claims below (as in the test above).
        let other = register_agent(&queue, json!({"name": "other", "labels": ["none"]})).await;
        assert!(queue.claim_next(&req(other), &[]).await.unwrap().is_none());
        let ids: Vec<Uuid> = agents.iter().map(|(_, id)| *id).collect();
        let answers = claim_together(&queue, &ids).await;
        let mut seen = HashSet::new();
        for ((bound, _), answer) in agents.iter().zip(answers) {
            let id = answer.unwrap().expect("an order for each agent");
            if *bound {
                assert!(
                    b.contains(&id),
                    "an agent bound to b got {id}, not one of b's"
                );
            }
            assert!(a.contains(&id) || b.contains(&id));
            assert!(seen.insert(id), "{id} handed out twice");
        }
    }
}
