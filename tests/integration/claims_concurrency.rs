//! At-most-once claims under real concurrency (docs/design.md §2, §5), against a real PostgreSQL.

use crate::support;

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::json;
use support::{TestServer, configmap_order};

/// `n` pending ConfigMap orders labelled `label`, oldest first, inserted in one statement.
async fn fill(s: &TestServer, n: usize, label: &str) {
    sqlx::query(
        "INSERT INTO work_orders (id, work_type, yaml_content, max_retries, backoff_seconds, \
         claim_timeout_seconds, max_reclaims, target_labels, status, created_at) \
         SELECT gen_random_uuid(), 'custom', 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n', \
           3, 60, 3600, 5, ARRAY[$2], 'PENDING', now() + make_interval(secs => g / 1000.0) \
         FROM generate_series(1, $1) g",
    )
    .bind(n as i32)
    .bind(label)
    .execute(&s.pool)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_concurrent_claims_of_one_order_yield_one_winner() {
    let s = Arc::new(TestServer::start().await);
    let mut agents = Vec::new();
    for i in 0..32 {
        agents.push(
            s.agent(json!({"name": format!("racer-{i}"), "labels": ["race"]}))
                .await,
        );
    }
    let order = s.order(configmap_order("race")).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(32));
    let mut tasks = Vec::new();
    for (id, token) in agents {
        let (s, order, barrier) = (s.clone(), order.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let (status, body) = s.claim(&order, &id, &token).await;
            (status, body, id)
        }));
    }
    let mut winners = Vec::new();
    let mut conflicts = 0;
    for t in tasks {
        let (status, body, id) = t.await.unwrap();
        match status {
            200 => winners.push((body, id)),
            409 => {
                assert_eq!(body["error"]["code"], "already_claimed", "{body}");
                conflicts += 1
            }
            other => panic!("unexpected status {other}: {body}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one claim must win");
    assert_eq!(conflicts, 31);
    let (body, id) = &winners[0];
    assert_eq!(body["claimed_by"], json!(id));
    assert!(body["claim_id"].is_string());
    assert!(
        body["yaml_content"].is_string(),
        "claim returns the full order"
    );
    let claims: (i64,) = sqlx::query_as("SELECT count(*) FROM work_order_claims")
        .fetch_one(&s.pool)
        .await
        .unwrap();
    assert_eq!(claims.0, 1);
}

/// 20,000 orders drained by 16 concurrent agents over HTTP: each is claimed and completed exactly
/// once and none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_agents_drain_twenty_thousand_orders_exactly_once() {
    const ORDERS: usize = 20_000;
    const AGENTS: usize = 16;
    let s = Arc::new(TestServer::start_with(40, 1024).await);
    // Bulk-insert through SQL to keep the set-up short; the drain goes through the HTTP API.
    fill(&s, ORDERS, "drain").await;
    let mut tasks = Vec::new();
    for i in 0..AGENTS {
        let (id, token) = s
            .agent(json!({"name": format!("drainer-{i}"), "labels": ["drain"]}))
            .await;
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut done = Vec::new();
            loop {
                let (status, order) = s
                    .claim_next(&id, &token, Some(json!({"lease_seconds": 60})))
                    .await;
                if status == 204 {
                    return done;
                }
                assert_eq!(status, 200, "{order}");
                let order_id = order["id"].as_str().unwrap().to_string();
                let (status, entry) = s
                    .complete(&order_id, &token, json!({"agent_id": id, "claim_id": order["claim_id"], "success": true, "message": "ok"}))
                    .await;
                assert_eq!(status, 200, "{entry}");
                assert_eq!(entry["outcome"], "succeeded");
                done.push(order_id);
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let unique: HashSet<&String> = all.iter().collect();
    assert_eq!(all.len(), ORDERS, "every order completed once");
    assert_eq!(unique.len(), ORDERS, "no order completed twice");
    let (active,): (i64,) = sqlx::query_as("SELECT count(*) FROM work_orders")
        .fetch_one(&s.pool)
        .await
        .unwrap();
    let (logged,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM work_order_log WHERE outcome = 'succeeded'")
            .fetch_one(&s.pool)
            .await
            .unwrap();
    assert_eq!(active, 0, "nothing left behind");
    assert_eq!(logged, ORDERS as i64, "none lost");
}

/// A long-polling claim is woken by NOTIFY when an order appears, well before its wait ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_is_woken_by_a_new_order() {
    let s = Arc::new(TestServer::start().await);
    let poller = s.agent(json!({"name": "poller", "labels": ["lp"]})).await;
    let waiter = long_poll(&s, &poller, 20);
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let order = s.order(configmap_order("lp")).await;
    assert_woken_with(waiter, &order).await;
}

/// An empty queue answers 204 after the wait; past the long-poll bound the server answers 503
/// with Retry-After.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_polls_are_bounded() {
    let s = Arc::new(TestServer::start_with(16, 1).await);
    let (id, token) = s.agent(json!({"name": "p", "labels": ["none"]})).await;
    let holder = {
        let (s, id, token) = (s.clone(), id.clone(), token.clone());
        tokio::spawn(async move {
            s.claim_next(&id, &token, Some(json!({"max_wait_seconds": 2})))
                .await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let resp = s
        .http
        .post(s.url(&format!("/api/v1/agents/{id}/claim")))
        .bearer_auth(&token)
        .json(&json!({"max_wait_seconds": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 503);
    assert_eq!(resp.headers()["retry-after"], "1");
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_many_long_polls");
    let (status, _) = holder.await.unwrap();
    assert_eq!(status, 204, "nothing eligible within the wait");
    // A claim that does not wait needs no permit.
    let (status, _) = s.claim_next(&id, &token, None).await;
    assert_eq!(status, 204);
}

/// Starts a long-poll of `max_wait_seconds` for agent (id, token); yields (status, body, waited).
fn long_poll(
    s: &Arc<TestServer>,
    agent: &(String, String),
    max_wait_seconds: u64,
) -> tokio::task::JoinHandle<(u16, serde_json::Value, std::time::Duration)> {
    let (s, (id, token)) = (s.clone(), agent.clone());
    tokio::spawn(async move {
        let started = std::time::Instant::now();
        let (status, body) = s
            .claim_next(
                &id,
                &token,
                Some(json!({"max_wait_seconds": max_wait_seconds})),
            )
            .await;
        (status, body, started.elapsed())
    })
}

/// The long-poll (of 20 s) answered with `order`, woken by it well before its wait ran out.
async fn assert_woken_with(
    waiter: tokio::task::JoinHandle<(u16, serde_json::Value, std::time::Duration)>,
    order: &str,
) {
    let (status, body, waited) = waiter.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["id"], json!(order));
    assert!(
        waited < std::time::Duration::from_secs(10),
        "woken by NOTIFY, not by the 20 s timeout (waited {waited:?})"
    );
}

/// Each new order wakes one waiter that may take it (issue #7): six orders created at once for
/// six "blue" long-polls all go out promptly, one each, while the "red" long-polls sleep through
/// them and end empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn new_orders_wake_eligible_long_polls_one_each() {
    let s = Arc::new(TestServer::start().await);
    let mut blue = Vec::new();
    let mut red = Vec::new();
    for i in 0..6 {
        let b = s
            .agent(json!({"name": format!("blue-{i}"), "labels": ["blue"]}))
            .await;
        blue.push(long_poll(&s, &b, 20));
        let r = s
            .agent(json!({"name": format!("red-{i}"), "labels": ["red"]}))
            .await;
        red.push(long_poll(&s, &r, 4));
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let orders: HashSet<String> =
        futures::future::join_all((0..6).map(|_| s.order(configmap_order("blue"))))
            .await
            .into_iter()
            .collect();
    let mut claimed = HashSet::new();
    for t in blue {
        let (status, body, waited) = t.await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(
            waited < std::time::Duration::from_secs(10),
            "woken by its order, not by the 20 s wait (waited {waited:?})"
        );
        assert!(claimed.insert(body["id"].as_str().unwrap().to_string()));
    }
    assert_eq!(claimed, orders, "every order claimed, each once");
    for t in red {
        let (status, body, _) = t.await.unwrap();
        assert_eq!(status, 204, "a red long-poll took nothing: {body}");
    }
}

/// An order whose targeting does not fit in a notification (PostgreSQL caps a payload at 8000
/// bytes) still wakes the long-poll that may take it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_with_huge_targeting_still_wakes_its_long_poll() {
    let s = Arc::new(TestServer::start().await);
    let agent = s.agent(json!({"name": "big", "labels": ["big"]})).await;
    let waiter = long_poll(&s, &agent, 20);
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let mut body = configmap_order("big");
    let mut labels = vec!["big".to_string()];
    labels.extend((0..4).map(|i| format!("{i}{}", "x".repeat(4000))));
    body["targeting"]["labels"] = json!(labels);
    let order = s.order(body).await;
    assert_woken_with(waiter, &order).await;
}

/// Claims and completions of API orders send nothing on `pullman_work_order_changed` (only the
/// controller listens, for orders from WorkOrder resources): a transaction that notifies holds a
/// cluster-wide lock through its commit, which would serialize the claim path's commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_orders_send_no_change_notifications_but_resource_orders_do() {
    let s = Arc::new(TestServer::start().await);
    let mut listener = sqlx::postgres::PgListener::connect_with(&s.pool)
        .await
        .unwrap();
    listener.listen("pullman_work_order_changed").await.unwrap();
    let (id, token) = s.agent(json!({"name": "quiet", "labels": ["q"]})).await;
    let order = s.order(configmap_order("q")).await;
    let (status, claim) = s.claim_next(&id, &token, None).await;
    assert_eq!(status, 200, "{claim}");
    let (status, body) = s
        .complete(
            &order,
            &token,
            json!({"agent_id": id, "claim_id": claim["claim_id"], "success": true}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // An order from a resource does notify; it is the marker that ends the wait below.
    let spec = pullman::queue::validate::validate_work_order(
        serde_json::from_value(configmap_order("q")).unwrap(),
    )
    .unwrap();
    let marker = uuid::Uuid::new_v4();
    s.queue
        .create_work_order(&spec, marker, pullman::queue::SOURCE_KUBERNETES)
        .await
        .unwrap();
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), listener.recv())
        .await
        .expect("the resource order's notification")
        .unwrap();
    assert_eq!(
        first.payload(),
        marker.to_string(),
        "the API order's create, claim and completion sent nothing"
    );
}

/// Multi-claim (`max_orders`) under real concurrency: 16 agents claim up to 1–8 orders per
/// request (two of them capped by `max_concurrency` 3) and complete each batch concurrently, so
/// completes arrive together; every order is handed out and completed exactly once, each claim
/// with its own `claim_id`, and a capped agent never holds more than its cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn multi_claims_race_and_every_order_is_claimed_and_completed_once() {
    const ORDERS: usize = 4_000;
    const AGENTS: usize = 16;
    let s = Arc::new(TestServer::start_with(40, 1024).await);
    fill(&s, ORDERS, "multi").await;
    let mut tasks = Vec::new();
    for i in 0..AGENTS {
        let capped = i < 2;
        let mut agent = json!({"name": format!("multi-{i}"), "labels": ["multi"]});
        if capped {
            agent["max_concurrency"] = json!(3);
        }
        let (id, token) = s.agent(agent).await;
        let s = s.clone();
        let max_orders = 1 + i % 8;
        tasks.push(tokio::spawn(async move {
            let mut done = Vec::new();
            let mut claim_ids = HashSet::new();
            loop {
                let (status, answer) = s
                    .claim_next(&id, &token, Some(json!({"lease_seconds": 60, "max_orders": max_orders})))
                    .await;
                if status == 204 {
                    return (done, claim_ids);
                }
                assert_eq!(status, 200, "{answer}");
                let orders = answer["orders"].as_array().expect("a list").clone();
                assert!(!orders.is_empty() && orders.len() <= max_orders, "{answer}");
                if capped {
                    assert!(orders.len() <= 3, "over max_concurrency: {answer}");
                }
                let completes = orders.iter().map(|order| {
                    let (s, id, token) = (s.clone(), id.clone(), token.clone());
                    let order = order.clone();
                    async move {
                        let order_id = order["id"].as_str().unwrap().to_string();
                        let (status, entry) = s
                            .complete(&order_id, &token, json!({"agent_id": id, "claim_id": order["claim_id"], "success": true}))
                            .await;
                        assert_eq!(status, 200, "{entry}");
                        assert_eq!(entry["outcome"], "succeeded");
                        assert_eq!(entry["claim_id"], order["claim_id"]);
                        (order_id, order["claim_id"].as_str().unwrap().to_string())
                    }
                });
                for (order_id, claim_id) in futures::future::join_all(completes).await {
                    done.push(order_id);
                    assert!(claim_ids.insert(claim_id), "a claim id handed out twice");
                }
            }
        }));
    }
    let mut all = Vec::new();
    let mut claims = HashSet::new();
    for t in tasks {
        let (done, ids) = t.await.unwrap();
        all.extend(done);
        for id in ids {
            assert!(claims.insert(id), "a claim id shared by two agents");
        }
    }
    let unique: HashSet<&String> = all.iter().collect();
    assert_eq!(all.len(), ORDERS, "every order completed once");
    assert_eq!(unique.len(), ORDERS, "no order completed twice");
    let (logged,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM work_order_log WHERE outcome = 'succeeded'")
            .fetch_one(&s.pool)
            .await
            .unwrap();
    assert_eq!(logged, ORDERS as i64, "none lost");
}

/// `max_orders` is bounded (`queue::limits::MAX_ORDERS`), named in the refusal; without it the
/// answer is the order itself, with it a list even of one.
#[tokio::test]
async fn max_orders_is_bounded_and_chooses_the_answer_shape() {
    let s = TestServer::start().await;
    let (id, token) = s.agent(json!({"name": "shape", "labels": ["shape"]})).await;
    for bad in [0, 101, -1] {
        let (status, body) = s
            .claim_next(&id, &token, Some(json!({"max_orders": bad})))
            .await;
        assert_eq!(status, 400, "{bad}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("max_orders must be between 1 and 100"),
            "{message}"
        );
    }
    for _ in 0..3 {
        s.order(configmap_order("shape")).await;
    }
    let claim = |body: serde_json::Value| {
        let (s, id, token) = (&s, id.clone(), token.clone());
        async move { s.claim_next(&id, &token, Some(body)).await }
    };
    let (status, one) = claim(json!({})).await;
    assert_eq!(status, 200);
    assert!(one["id"].is_string() && one["orders"].is_null(), "{one}");
    let (status, list) = claim(json!({"max_orders": 1})).await;
    assert_eq!(status, 200);
    assert_eq!(list["orders"].as_array().unwrap().len(), 1, "{list}");
    let (status, rest) = claim(json!({"max_orders": 50})).await;
    assert_eq!(status, 200);
    assert_eq!(rest["orders"].as_array().unwrap().len(), 1, "{rest}");
    let (status, _) = claim(json!({"max_orders": 50})).await;
    assert_eq!(status, 204);
}

/// One agent's claims and completes, 8 at a time (claims and completes of one agent no longer
/// wait on its row: `sql/claiming_agent.sql`), race its retirement: once the retirement has
/// returned, the agent holds no claim (a claim in flight committed before it and was released by
/// it, or saw it and was refused), later claims are refused `agent_retired`, and every order is
/// in the queue or the log once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_racing_a_retirement_leave_the_retired_agent_no_claim() {
    use pullman::queue::{ClaimRequest, ConflictCode, QueueError};
    const ORDERS: usize = 2_000;
    let s = Arc::new(TestServer::start_with(40, 1024).await);
    fill(&s, ORDERS, "retiring").await;
    let (id, _token) = s
        .agent(json!({"name": "retiring", "labels": ["retiring"]}))
        .await;
    let agent_id: uuid::Uuid = id.parse().unwrap();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let queue = s.queue.clone();
        tasks.push(tokio::spawn(async move {
            let req = ClaimRequest {
                agent_id,
                lease_seconds: Some(60),
            };
            let mut completed = 0usize;
            loop {
                let orders = match queue.claim_next_many(&req, &[], 2).await {
                    Ok(orders) => orders,
                    Err(QueueError::Conflict { code, .. }) => {
                        assert_eq!(code, ConflictCode::AgentRetired);
                        return completed;
                    }
                    Err(e) => panic!("claim failed: {e}"),
                };
                assert!(
                    !orders.is_empty(),
                    "the backlog ran out before the retirement"
                );
                for order in orders {
                    let done = support::queue::done(true);
                    // After the retirement a complete of a released claim is refused (409).
                    if queue
                        .complete(order.id, agent_id, order.claim_id, &done)
                        .await
                        .is_ok()
                    {
                        completed += 1;
                    }
                }
            }
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    s.queue.retire_agent(agent_id).await.unwrap();
    let (held,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM work_order_claims WHERE agent_id = $1")
            .bind(agent_id)
            .fetch_one(&s.pool)
            .await
            .unwrap();
    let mut completed = 0;
    for t in tasks {
        completed += t.await.unwrap();
    }
    assert!(completed > 0, "no claim went through before the retirement");
    assert_eq!(held, 0, "a claim outlived its agent's retirement");
    let (still_held,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM work_order_claims WHERE agent_id = $1")
            .bind(agent_id)
            .fetch_one(&s.pool)
            .await
            .unwrap();
    assert_eq!(still_held, 0, "a claim was taken after the retirement");
    let (queued, claimed, logged): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM work_orders), \
                (SELECT count(*) FROM work_orders WHERE status = 'CLAIMED'), \
                (SELECT count(*) FROM work_order_log)",
    )
    .fetch_one(&s.pool)
    .await
    .unwrap();
    assert_eq!(claimed, 0, "an order left CLAIMED by the retired agent");
    assert_eq!(logged as usize, completed, "each complete logged once");
    assert_eq!((queued + logged) as usize, ORDERS, "an order was lost");
}
