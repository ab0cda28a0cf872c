//! Priority (docs/design.md §11, issue #40), against a real PostgreSQL: claim-next hands out the
//! higher priority first, then the older, and the position `explain` gives each waiting order is
//! the claim that hands it out. (Fair share between tenants, which §11 puts before priority, is
//! not built yet: orders of every tenant are in one line.)

use pullman::queue::{ClaimRequest, Queue, WaitReason};
use pullman::testing::{create_order, fresh_pool, register_agent};
use serde_json::{Value, json};
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

async fn claim(queue: &Queue, agent: Uuid) -> Option<Uuid> {
    let req = ClaimRequest {
        agent_id: agent,
        lease_seconds: None,
    };
    queue.claim_next(&req, &[]).await.unwrap().map(|o| o.id)
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

#[tokio::test]
async fn higher_priority_first_then_the_oldest_and_positions_agree() {
    let queue = Queue::new(fresh_pool(4).await);
    let a = agent(&queue, json!({"name": "shared", "labels": ["prio"]})).await;
    let old = order(&queue, Some("a"), 0).await;
    let high = order(&queue, Some("b"), 5).await;
    let low = order(&queue, None, -1000).await;
    let newer = order(&queue, None, 0).await;
    let highest = order(&queue, Some("a"), 1000).await;
    let high_later = order(&queue, Some("a"), 5).await;
    hands_out_in(&queue, a, &[highest, high, high_later, old, newer, low]).await;
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
    let req = ClaimRequest {
        agent_id: a,
        lease_seconds: None,
    };
    let got: Vec<Uuid> = queue
        .claim_next_many(&req, &[], 3)
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.id)
        .collect();
    assert_eq!(got, [high, old, newer]);
}
