//! The matrix of `queue::waiting_agreement`: one case per reason, each checked against what
//! claims do (claim by id for every agent, claim-next for `queued`).

use serde_json::json;
use uuid::Uuid;

use super::{Claim, agent, backing_off, claim_as, explain, fresh, order, seen, would_claim};
use crate::queue::{Completion, ConflictCode, QueueError, WaitReason, WorkOrder};

#[tokio::test]
async fn no_matching_agent_cannot_be_claimed_by_any_agent() {
    let queue = fresh().await;
    let gpu = agent(&queue, json!({"name": "gpu", "labels": ["gpu"]})).await;
    let builder = agent(
        &queue,
        json!({"name": "b", "labels": ["arm"], "work_types": ["build"]}),
    )
    .await;
    let tenant = agent(
        &queue,
        json!({"name": "t", "labels": ["arm"], "tenant": "team-a"}),
    )
    .await;
    for a in [gpu, builder, tenant] {
        seen(&queue, a, Some(0)).await;
    }
    let o = order(&queue, json!({"targeting": {"labels": ["arm"]}})).await;
    let e = explain(&queue, o).await;
    assert_eq!(e.reason, WaitReason::NoMatchingAgent, "{e:?}");
    assert!(e.matching_agents.is_empty());
    assert!(e.message.contains("No live agent"), "{}", e.message);
    for a in [gpu, builder, tenant] {
        assert_eq!(would_claim(&queue, o, a).await, Claim::NotVisible);
        let next = queue.claim_next(&claim_as(a), &[]).await.unwrap();
        assert!(next.is_none(), "claim-next handed it out");
    }
    // A retired agent that matched does not count either.
    let retired = agent(&queue, json!({"name": "r", "labels": ["arm"]})).await;
    assert_eq!(
        explain(&queue, o).await.reason,
        WaitReason::NoAgentConnected
    );
    queue.retire_agent(retired).await.unwrap();
    assert_eq!(explain(&queue, o).await.reason, WaitReason::NoMatchingAgent);
    assert_eq!(would_claim(&queue, o, retired).await, Claim::Retired);
}

#[tokio::test]
async fn no_agent_connected_is_claimable_by_a_named_agent_once_it_calls() {
    let queue = fresh().await;
    let never = agent(&queue, json!({"name": "never", "labels": ["gpu"]})).await;
    let stale = agent(&queue, json!({"name": "stale", "labels": ["gpu"]})).await;
    seen(&queue, stale, Some(301)).await;
    let o = order(&queue, json!({"targeting": {"labels": ["gpu"]}})).await;
    let e = explain(&queue, o).await;
    assert_eq!(e.reason, WaitReason::NoAgentConnected, "{e:?}");
    assert_eq!(e.matching_agents, ["never", "stale"]);
    assert_eq!(e.matching_agent_count, 2);
    assert_eq!(would_claim(&queue, o, never).await, Claim::Taken);
    assert_eq!(would_claim(&queue, o, stale).await, Claim::Taken);
    // Contact is what was missing: the agent that calls takes it.
    seen(&queue, stale, Some(0)).await;
    let e = explain(&queue, o).await;
    assert_eq!((e.reason, e.position), (WaitReason::Queued, Some(1)));
    let claimed = queue.claim(o, &claim_as(stale)).await.unwrap();
    assert_eq!(claimed.id, o);
    match queue.explain(o).await {
        Err(QueueError::Conflict {
            code: ConflictCode::NotWaiting,
            message,
        }) => assert!(message.contains(&stale.to_string()), "{message}"),
        other => panic!("explain of a claimed order: {other:?}"),
    }
}

#[tokio::test]
async fn agents_busy_is_refused_for_max_concurrency_until_a_claim_ends() {
    let queue = fresh().await;
    let a = agent(
        &queue,
        json!({"name": "one", "labels": ["gpu"], "max_concurrency": 1}),
    )
    .await;
    // A stale agent with room does not make the order claimable by anyone in contact.
    let idle = agent(&queue, json!({"name": "idle", "labels": ["gpu"]})).await;
    seen(&queue, idle, Some(3600)).await;
    let first = order(&queue, json!({"targeting": {"agent_names": ["one"]}})).await;
    let req = claim_as(a);
    let held = queue.claim(first, &req).await.unwrap();
    let o = order(&queue, json!({"targeting": {"labels": ["gpu"]}})).await;
    let e = explain(&queue, o).await;
    assert_eq!(e.reason, WaitReason::AgentsBusy, "{e:?}");
    assert_eq!(e.matching_agents, ["idle", "one"]);
    assert_eq!(would_claim(&queue, o, a).await, Claim::Busy);
    queue
        .complete(
            first,
            a,
            held.claim_id,
            &Completion {
                success: true,
                message: None,
                retryable: true,
                disrupted: false,
            },
        )
        .await
        .unwrap();
    let e = explain(&queue, o).await;
    assert_eq!((e.reason, e.position), (WaitReason::Queued, Some(1)));
    let next: WorkOrder = queue.claim_next(&req, &[]).await.unwrap().unwrap();
    assert_eq!(next.id, o);
}

#[tokio::test]
async fn backing_off_is_refused_until_the_retry_is_due() {
    let queue = fresh().await;
    let a = agent(&queue, json!({"name": "a", "labels": ["gpu"]})).await;
    seen(&queue, a, Some(0)).await;
    let o = order(&queue, json!({"targeting": {"labels": ["gpu"]}})).await;
    backing_off(&queue, o, 1).await;
    let e = explain(&queue, o).await;
    assert_eq!(e.reason, WaitReason::BackingOff, "{e:?}");
    assert!(e.backing_off_until.is_some());
    assert_eq!(e.matching_agents, ["a"]);
    assert_eq!(would_claim(&queue, o, a).await, Claim::BackingOff);
    backing_off(&queue, o, -1).await;
    assert_eq!(explain(&queue, o).await.reason, WaitReason::Queued);
    assert_eq!(would_claim(&queue, o, a).await, Claim::Taken);
}

#[tokio::test]
async fn queued_position_is_the_claim_next_call_that_hands_it_out() {
    let queue = fresh().await;
    let a = agent(&queue, json!({"name": "a", "labels": ["gpu"]})).await;
    let b = agent(&queue, json!({"name": "b", "labels": ["cpu"]})).await;
    for x in [a, b] {
        seen(&queue, x, Some(0)).await;
    }
    // Ahead of `last` for agent a: gpu orders, and a due retry; not b's cpu order, not a retry
    // backing off.
    let mut ahead = vec![];
    ahead.push(order(&queue, json!({"targeting": {"labels": ["gpu"]}})).await);
    let _other = order(&queue, json!({"targeting": {"labels": ["cpu"]}})).await;
    let later = order(&queue, json!({"targeting": {"labels": ["gpu"]}})).await;
    backing_off(&queue, later, 1).await;
    let due = order(&queue, json!({"targeting": {"labels": ["gpu"]}})).await;
    backing_off(&queue, due, -1).await;
    ahead.push(due);
    let last = order(&queue, json!({"targeting": {"labels": ["gpu"]}})).await;
    let e = explain(&queue, last).await;
    assert_eq!(
        (e.reason, e.position),
        (WaitReason::Queued, Some(3)),
        "{e:?}"
    );
    assert!(e.message.contains("number 3"), "{}", e.message);
    assert_eq!(would_claim(&queue, last, a).await, Claim::Taken);
    let req = claim_as(a);
    for (i, expected) in ahead.iter().enumerate() {
        let e = explain(&queue, last).await;
        assert_eq!(e.position, Some(3 - i as i64));
        let got = queue.claim_next(&req, &[]).await.unwrap().unwrap();
        assert_eq!(got.id, *expected);
    }
    assert_eq!(explain(&queue, last).await.position, Some(1));
    assert_eq!(queue.claim_next(&req, &[]).await.unwrap().unwrap().id, last);
}

#[tokio::test]
async fn explain_names_unknown_and_finished_orders() {
    let queue = fresh().await;
    let unknown = Uuid::new_v4();
    assert!(matches!(
        queue.explain(unknown).await,
        Err(QueueError::NotFound { .. })
    ));
    let o = order(&queue, json!({"targeting": {"labels": ["gpu"]}})).await;
    queue.cancel_work_order(o, "test").await.unwrap();
    assert!(matches!(
        queue.explain(o).await,
        Err(QueueError::Finished { .. })
    ));
    assert!(queue.waiting(o).await.unwrap().is_none());
}

// The property test.
