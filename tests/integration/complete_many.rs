//! Batch complete, `POST /agents/{agent_id}/complete` (issue #34), against a real PostgreSQL: each
//! item answered as its own complete would be (fencing, replays, retries), a bad batch changing
//! nothing, and batches racing each other and single completes completing every order once.

use crate::support;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::{Value, json};
use support::{TestServer, configmap_order};

/// `POST /agents/{agent}/complete` with `token` and `completes`; status and body.
async fn complete_many(s: &TestServer, agent: &str, token: &str, completes: Value) -> (u16, Value) {
    let path = format!("/api/v1/agents/{agent}/complete");
    s.call(
        reqwest::Method::POST,
        &path,
        Some(token),
        Some(json!({ "completes": completes })),
    )
    .await
}

/// `n` orders labelled `label` claimed by `agent` in one multi-claim: (id, claim_id) each.
async fn claimed(
    s: &TestServer,
    agent: &str,
    token: &str,
    label: &str,
    n: usize,
) -> Vec<(String, String)> {
    for _ in 0..n {
        s.order(configmap_order(label)).await;
    }
    let (status, answer) = s
        .claim_next(
            agent,
            token,
            Some(json!({"lease_seconds": 60, "max_orders": n})),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let orders: Vec<(String, String)> = answer["orders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["id"].as_str().unwrap().into(),
                o["claim_id"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(orders.len(), n, "{answer}");
    orders
}

/// Each item is answered as `POST /work-orders/{id}/complete` would answer it, in the request's
/// order: success `200` with the log entry (no `yaml_content`), a retryable failure `202`, a
/// final failure `200 failed`, another claim's id `409` (nothing changed). The
/// same batch again gets the same answers (replays). The successes share one commit. Another
/// agent's token is `403`; another agent's path and token, `409` for each item.
#[tokio::test]
async fn a_batch_complete_answers_each_item_as_its_own_complete() {
    let s = TestServer::start().await;
    let (a, a_token) = s
        .agent(json!({"name": "batch-a", "labels": ["batch"]}))
        .await;
    let (b, b_token) = s
        .agent(json!({"name": "batch-b", "labels": ["other"]}))
        .await;
    let orders = claimed(&s, &a, &a_token, "batch", 5).await;
    let item = |i: usize, extra: Value| {
        let mut v = json!({"work_order_id": orders[i].0, "claim_id": orders[i].1});
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        v
    };
    let batch = json!([
        item(0, json!({"success": true, "message": "built"})),
        item(
            1,
            json!({"success": false, "message": "flaky", "retryable": true})
        ),
        item(
            2,
            json!({"success": false, "message": "broken", "retryable": false})
        ),
        item(
            3,
            json!({"success": true, "claim_id": uuid::Uuid::new_v4()})
        ),
        item(4, json!({"success": true})),
    ]);

    let (status, body) = complete_many(&s, &a, &b_token, batch.clone()).await;
    assert_eq!(status, 403, "another agent's token: {body}");
    let (status, body) = complete_many(&s, &b, &b_token, batch.clone()).await;
    assert_eq!(status, 200, "{body}");
    let (single_status, single) = s
        .complete(
            &orders[0].0,
            &b_token,
            json!({"agent_id": b, "success": true}),
        )
        .await;
    assert_eq!(single_status, 409, "{single}");
    for r in body["results"].as_array().unwrap() {
        assert_eq!(r["status"], 409, "b holds none of a's claims: {r}");
        assert_eq!(
            r["error"]["code"], single["error"]["code"],
            "as a single complete: {r}"
        );
    }

    let (status, first) = complete_many(&s, &a, &a_token, batch.clone()).await;
    assert_eq!(status, 200, "{first}");
    let results = first["results"].as_array().unwrap();
    let ids: Vec<&str> = results
        .iter()
        .map(|r| r["work_order_id"].as_str().unwrap())
        .collect();
    let sent: Vec<&str> = orders.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, sent, "answered in the request's order");
    let statuses: Vec<u64> = results
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [200, 202, 200, 409, 200], "{first}");
    assert_eq!(results[0]["log_entry"]["outcome"], "succeeded");
    assert_eq!(results[0]["log_entry"]["message"], "built");
    assert_eq!(results[0]["log_entry"]["claim_id"], orders[0].1.as_str());
    assert!(
        results[0]["log_entry"].get("yaml_content").is_none(),
        "{first}"
    );
    assert_eq!(results[1]["retry_scheduled"]["status"], "retry_scheduled");
    assert_eq!(results[2]["log_entry"]["outcome"], "failed");
    let stale = json!({"agent_id": a, "success": true, "claim_id": batch[3]["claim_id"]});
    let (single_status, single) = s.complete(&orders[3].0, &a_token, stale).await;
    assert_eq!(single_status, 409, "{single}");
    assert_eq!(results[3]["error"], single["error"], "as a single complete");
    assert_eq!(results[4]["log_entry"]["outcome"], "succeeded");

    // The order a stale claim id could not complete is still a's, and its own claim completes it.
    let (status, order) = s
        .admin_get(&format!("/api/v1/work-orders/{}", orders[3].0))
        .await;
    assert_eq!(
        (status, order["status"].as_str()),
        (200, Some("CLAIMED")),
        "{order}"
    );

    // The two successes went through one group commit: one transaction, one completed_at.
    let (commits,): (i64,) = sqlx::query_as(
        "SELECT count(DISTINCT completed_at) FROM work_order_log WHERE id = ANY($1::uuid[])",
    )
    .bind(vec![
        orders[0].0.parse::<uuid::Uuid>().unwrap(),
        orders[4].0.parse().unwrap(),
    ])
    .fetch_one(&s.pool)
    .await
    .unwrap();
    assert_eq!(commits, 1, "the batch's successes were committed apart");

    let (status, again) = complete_many(&s, &a, &a_token, batch).await;
    assert_eq!(status, 200, "{again}");
    let again = again["results"].as_array().unwrap();
    for i in [0, 2, 4] {
        assert_eq!(again[i]["status"], 200, "{}", again[i]);
        assert_eq!(again[i]["log_entry"]["id"], results[i]["log_entry"]["id"]);
        assert_eq!(
            again[i]["log_entry"]["outcome"],
            results[i]["log_entry"]["outcome"]
        );
    }
    assert_eq!(
        again[1]["status"], 202,
        "a repeated retry is answered as it was: {}",
        again[1]
    );
    assert_eq!(again[1]["retry_scheduled"], results[1]["retry_scheduled"]);
    assert_eq!(again[3]["status"], 409, "{}", again[3]);
    let (logged,): (i64,) = sqlx::query_as("SELECT count(*) FROM work_order_log")
        .fetch_one(&s.pool)
        .await
        .unwrap();
    assert_eq!(logged, 3, "each finished order logged once");
}

/// A batch with a bad item, an order twice, no items or too many is refused `400` naming the
/// item and field, and completes nothing, not even its good items; unknown fields are `422`.
#[tokio::test]
async fn a_bad_batch_is_refused_naming_the_field_and_completes_nothing() {
    let s = TestServer::start().await;
    let (a, token) = s
        .agent(json!({"name": "bad-batch", "labels": ["bad"]}))
        .await;
    let orders = claimed(&s, &a, &token, "bad", 2).await;
    let good = json!({"work_order_id": orders[0].0, "claim_id": orders[0].1, "success": true});
    let refusals = [
        (
            json!([good, {"work_order_id": orders[1].0, "success": true, "disrupted": true}]),
            "completes[1].disrupted",
        ),
        (json!([good, good]), "completes[1].work_order_id"),
        (json!([]), "completes must hold 1 to 100 results, got 0"),
        (
            json!(vec![good.clone(); 101]),
            "completes must hold 1 to 100 results, got 101",
        ),
    ];
    for (batch, named) in refusals {
        let (status, body) = complete_many(&s, &a, &token, batch).await;
        support::assert_refused(status, &body, 400, "invalid_field");
        assert!(
            support::error_message(&body).contains(named),
            "{named}: {body}"
        );
    }
    let (status, body) = complete_many(
        &s,
        &a,
        &token,
        json!([{"work_order_id": orders[0].0, "success": true, "colour": "red"}]),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    let (logged,): (i64,) = sqlx::query_as("SELECT count(*) FROM work_order_log")
        .fetch_one(&s.pool)
        .await
        .unwrap();
    assert_eq!(logged, 0, "a refused batch completed an order");
    let (status, body) = complete_many(&s, &a, &token, json!([good])).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["results"][0]["status"], 200, "{body}");
}

/// 8 agents claim 8 orders at a time and report each claim's orders twice at once: as one batch
/// and again as a second batch racing it (half of them also as single completes). Every order is
/// logged once as succeeded, and every answer to it is `200` with that same entry: whichever
/// request committed it, the others replay it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_batches_and_singles_complete_every_order_once() {
    const AGENTS: usize = 8;
    const ORDERS_EACH: usize = 200;
    let s = Arc::new(TestServer::start_with(40, 1024).await);
    let mut tasks = Vec::new();
    for i in 0..AGENTS {
        let label = format!("race-{i}");
        let (id, token) = s.agent(json!({"name": label, "labels": [label]})).await;
        for _ in 0..ORDERS_EACH {
            s.order(configmap_order(&label)).await;
        }
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut answered: HashMap<String, HashSet<String>> = HashMap::new();
            loop {
                let (status, claim) = s
                    .claim_next(&id, &token, Some(json!({"lease_seconds": 60, "max_orders": 8})))
                    .await;
                if status == 204 {
                    return answered;
                }
                assert_eq!(status, 200, "{claim}");
                let items: Vec<Value> = claim["orders"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|o| json!({"work_order_id": o["id"], "claim_id": o["claim_id"], "success": true}))
                    .collect();
                let batch = || complete_many(&s, &id, &token, json!(items));
                let singles = items.iter().step_by(2).map(|item| {
                    let mut body = item.clone();
                    body.as_object_mut().unwrap().remove("work_order_id");
                    body["agent_id"] = json!(id);
                    s.complete(item["work_order_id"].as_str().unwrap(), &token, body)
                });
                let (one, two, singles) =
                    tokio::join!(batch(), batch(), futures::future::join_all(singles));
                for (status, body) in [one, two] {
                    assert_eq!(status, 200, "{body}");
                    for r in body["results"].as_array().unwrap() {
                        assert_eq!(r["status"], 200, "{r}");
                        assert_eq!(r["log_entry"]["outcome"], "succeeded", "{r}");
                        let order = r["work_order_id"].as_str().unwrap().to_string();
                        let entry = r["log_entry"]["completed_at"].as_str().unwrap().to_string();
                        answered.entry(order).or_default().insert(entry);
                    }
                }
                for (status, entry) in singles {
                    assert_eq!(status, 200, "{entry}");
                    let order = entry["id"].as_str().unwrap().to_string();
                    let at = entry["completed_at"].as_str().unwrap().to_string();
                    answered.entry(order).or_default().insert(at);
                }
            }
        }));
    }
    let mut orders = 0;
    for task in tasks {
        for (order, completed_at) in task.await.unwrap() {
            assert_eq!(
                completed_at.len(),
                1,
                "{order} was answered with two different entries"
            );
            orders += 1;
        }
    }
    assert_eq!(orders, AGENTS * ORDERS_EACH, "every order answered");
    let (logged, distinct): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT id) FROM work_order_log WHERE outcome = 'succeeded'",
    )
    .fetch_one(&s.pool)
    .await
    .unwrap();
    assert_eq!(
        (logged, distinct),
        ((AGENTS * ORDERS_EACH) as i64, (AGENTS * ORDERS_EACH) as i64)
    );
}
