//! Group claims (`queue::claims::group`, issue #34), against a real PostgreSQL with real
//! concurrency: one-order claims of agents that arrive together share statements, hand every
//! order out once, and hand each agent only what it may take, in hand-out order; what the group
//! cannot serve (an agent with an order targeting it by name, another profile, a retired or
//! unknown agent) is answered as a lone claim would be.

use std::collections::HashSet;
use std::sync::Arc;

use pullman::queue::{ClaimRequest, Completion, ConflictCode, Queue, QueueError};
use pullman::testing::{create_order, fresh_pool, register_agent};
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

/// 16 agents of one profile claim and complete 400 orders one at a time, all at once: every
/// order is claimed once and logged once, and claims shared commits (a statement's claims share
/// its `claimed_at`, the transaction's `now()`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_sent_together_share_commits_and_hand_each_order_out_once() {
    let queue = queue().await;
    for _ in 0..400 {
        create_order(&queue, order(json!({"labels": ["gc"]}))).await;
    }
    let mut agents = Vec::new();
    for i in 0..16 {
        agents.push(
            register_agent(&queue, json!({"name": format!("gc-{i}"), "labels": ["gc"]})).await,
        );
    }
    let done = Completion {
        success: true,
        message: None,
        retryable: true,
        disrupted: false,
    };
    let tasks: Vec<_> = agents
        .iter()
        .map(|&agent| {
            let (queue, done) = (queue.clone(), done.clone());
            tokio::spawn(async move {
                let mut claimed = Vec::new();
                while let Some(o) = queue.claim_next(&req(agent), &[]).await.unwrap() {
                    assert_eq!(o.claimed_by, Some(agent), "the order names its claimer");
                    claimed.push((o.id, o.claimed_at.expect("a claim has its time")));
                    queue
                        .complete(o.id, agent, o.claim_id, &done)
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
    assert_eq!(ids.len(), 400, "every order claimed");
    let (logged,): (i64,) = sqlx::query_as("SELECT count(DISTINCT id) FROM work_order_log")
        .fetch_one(queue.pool())
        .await
        .unwrap();
    assert_eq!(logged, 400, "every order logged once");
    assert!(
        times.len() < 400,
        "400 claims of 16 agents took 400 commits: no claims were grouped"
    );
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
