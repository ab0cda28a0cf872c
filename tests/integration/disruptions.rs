//! Attempts ended by a disruption and the order's `retry_on_disruption`, through the API against
//! a real PostgreSQL (docs/design.md §2, §5, §12): `safe` runs the order again at once as a
//! reclaim (not a retry) when the agent knows the disrupted run stopped; otherwise, and with
//! `never`, the order fails with the attempt recorded as `disrupted`.

use crate::support;

use serde_json::{Value, json};
use support::TestServer;
use support::agent::Agent;

fn order(policy: Option<&str>, max_reclaims: i64) -> Value {
    let mut body = json!({
        "work_type": "custom",
        "yaml_content": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: d\n",
        "max_retries": 3,
        "max_reclaims": max_reclaims,
        "backoff_seconds": 3600,
        "targeting": {"labels": ["d"]},
    });
    if let Some(p) = policy {
        body["retry_on_disruption"] = json!(p);
    }
    body
}

/// An agent that may take the orders above.
async fn agent(s: &TestServer) -> Agent<'_> {
    Agent::register(s, json!({"name": "a", "labels": ["d"]})).await
}

/// Claims `order` by id; returns the claim id.
async fn claim(agent: &Agent<'_>, order: &str) -> String {
    let (st, v) = agent.claim(order).await;
    assert_eq!(st, 200, "{v}");
    v["claim_id"].as_str().unwrap().to_string()
}

/// A disrupted complete of `claim` (the agent's id is added by [`Agent::complete`]), with
/// `extra` fields merged in.
fn disrupted(claim: &str, extra: Value) -> Value {
    let mut body = json!({
        "claim_id": claim, "success": false, "disrupted": true,
        "message": "pod evicted: node drained",
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// `(retry_count, reclaim_count)` of an order or log entry.
fn counts(v: &Value) -> (i64, i64) {
    (
        v["retry_count"].as_i64().unwrap(),
        v["reclaim_count"].as_i64().unwrap(),
    )
}

async fn results(s: &TestServer, order: &str) -> Vec<String> {
    let (st, v) = s
        .admin_get(&format!("/api/v1/work-orders/{order}/attempts"))
        .await;
    assert_eq!(st, 200, "{v}");
    v.as_array()
        .unwrap()
        .iter()
        .map(|a| a["result"].as_str().unwrap().to_string())
        .collect()
}

async fn active(s: &TestServer, order: &str) -> Value {
    let (st, v) = s.admin_get(&format!("/api/v1/work-orders/{order}")).await;
    assert_eq!(st, 200, "{v}");
    v
}

#[tokio::test]
async fn safe_runs_a_stopped_disrupted_attempt_again_at_once_as_a_reclaim() {
    let s = TestServer::start().await;
    let a = agent(&s).await;
    let id = s.order(order(Some("safe"), 5)).await;
    let first = claim(&a, &id).await;
    let body = disrupted(&first, json!({"retryable": true}));
    let (st, v) = a.complete(&id, body.clone()).await;
    assert_eq!(st, 202, "{v}");
    assert_eq!(v["status"], "retry_scheduled");
    // A repeat of the same report gets the same answer.
    let (st, again) = a.complete(&id, body).await;
    assert_eq!((st, &again), (202, &v));

    let o = active(&s, &id).await;
    assert_eq!(o["status"], "RETRY_PENDING");
    assert_eq!(o["retry_on_disruption"], "safe");
    assert_eq!(counts(&o), (0, 1), "{o}");
    assert_eq!(o["last_error"], "pod evicted: node drained");
    assert_eq!(results(&s, &id).await, ["disrupted"]);

    // Claimable at once (no backoff: the work did not fail), and a success finishes it.
    let second = claim(&a, &id).await;
    assert_eq!(results(&s, &id).await, ["disrupted", "running"]);
    let (st, entry) = a
        .complete(&id, json!({"claim_id": second, "success": true}))
        .await;
    assert_eq!(st, 200, "{entry}");
    assert_eq!(entry["outcome"], "succeeded");
    assert_eq!(entry["retry_on_disruption"], "safe");
    assert_eq!(counts(&entry), (0, 1), "{entry}");
    assert_eq!(results(&s, &id).await, ["disrupted", "succeeded"]);
}

#[tokio::test]
async fn never_fails_the_order_without_using_its_retries() {
    let s = TestServer::start().await;
    let a = agent(&s).await;
    let id = s.order(order(None, 5)).await;
    assert_eq!(active(&s, &id).await["retry_on_disruption"], "never");
    let c = claim(&a, &id).await;
    let body = disrupted(&c, json!({}));
    let (st, entry) = a.complete(&id, body.clone()).await;
    assert_eq!(st, 200, "{entry}");
    assert_eq!(entry["outcome"], "failed");
    assert_eq!(entry["message"], "pod evicted: node drained");
    assert_eq!(entry["last_error"], "pod evicted: node drained");
    assert_eq!(entry["retry_on_disruption"], "never");
    assert_eq!(counts(&entry), (0, 0), "{entry}");
    assert_eq!(results(&s, &id).await, ["disrupted"]);
    // A repeat is answered with the same log entry; a late heartbeat is told not_claim_holder,
    // as after an agent's own complete.
    let (st, again) = a.complete(&id, body).await;
    assert_eq!((st, &again), (200, &entry));
    let (st, v) = a.heartbeat(&id, json!({"claim_id": c})).await;
    support::assert_refused(st, &v, 409, "not_claim_holder");
}

#[tokio::test]
async fn safe_does_not_run_again_while_the_disrupted_run_may_go_on() {
    let s = TestServer::start().await;
    let a = agent(&s).await;
    // Said outright, or not said at all: for a disrupted attempt, `retryable` defaults to
    // false, since only an agent that knows its run stopped may let a second one start.
    for said in [json!({"retryable": false}), json!({})] {
        let id = s.order(order(Some("safe"), 5)).await;
        let c = claim(&a, &id).await;
        let (st, entry) = a.complete(&id, disrupted(&c, said.clone())).await;
        assert_eq!(st, 200, "{said}: {entry}");
        assert_eq!(entry["outcome"], "failed");
        assert_eq!(
            entry["message"],
            "pod evicted: node drained; not run again: the disrupted run may still be running"
        );
        assert_eq!(entry["reclaim_count"], 0);
        assert_eq!(results(&s, &id).await, ["disrupted"]);
    }
}

#[tokio::test]
async fn safe_fails_once_the_reclaims_are_used_up() {
    let s = TestServer::start().await;
    let a = agent(&s).await;
    let id = s.order(order(Some("safe"), 1)).await;
    let first = claim(&a, &id).await;
    let (st, v) = a
        .complete(&id, disrupted(&first, json!({"retryable": true})))
        .await;
    assert_eq!(st, 202, "{v}");
    let second = claim(&a, &id).await;
    let (st, entry) = a
        .complete(
            &id,
            disrupted(&second, json!({"message": "node lost", "retryable": true})),
        )
        .await;
    assert_eq!(st, 200, "{entry}");
    assert_eq!(entry["outcome"], "failed");
    assert_eq!(
        entry["message"],
        "node lost; not run again: 1 reclaim used (max_reclaims 1)"
    );
    assert_eq!(counts(&entry), (0, 1), "{entry}");
    assert_eq!(results(&s, &id).await, ["disrupted", "disrupted"]);
}

#[tokio::test]
async fn a_disrupted_success_is_refused_and_changes_nothing() {
    let s = TestServer::start().await;
    let a = agent(&s).await;
    let id = s.order(order(Some("safe"), 5)).await;
    let c = claim(&a, &id).await;
    let (st, v) = a
        .complete(&id, disrupted(&c, json!({"success": true})))
        .await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["code"], "invalid_field");
    assert!(support::error_message(&v).contains("disrupted"), "{v}");
    let o = active(&s, &id).await;
    assert_eq!(o["status"], "CLAIMED");
    assert_eq!(o["claim_id"].as_str(), Some(c.as_str()));
    assert_eq!(results(&s, &id).await, ["running"]);
}

#[tokio::test]
async fn the_policy_is_checked_shown_and_copied_by_a_rerun() {
    let s = TestServer::start().await;
    let (st, v) = s
        .admin_post("/api/v1/work-orders", order(Some("sometimes"), 5))
        .await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["code"], "invalid_field");
    assert!(
        support::error_message(&v).contains("retry_on_disruption"),
        "{v}"
    );

    let a = agent(&s).await;
    let id = s.order(order(Some("safe"), 5)).await;
    assert_eq!(active(&s, &id).await["retry_on_disruption"], "safe");
    let c = claim(&a, &id).await;
    let (st, _) = a
        .complete(&id, json!({"claim_id": c, "success": true}))
        .await;
    assert_eq!(st, 200);
    let (st, listed) = s.admin_get("/api/v1/work-order-log").await;
    assert_eq!(st, 200, "{listed}");
    assert_eq!(
        listed["items"][0]["retry_on_disruption"], "safe",
        "{listed}"
    );
    let (st, rerun) = s
        .admin(
            reqwest::Method::POST,
            &format!("/api/v1/work-orders/{id}/rerun"),
            None,
        )
        .await;
    assert_eq!(st, 201, "{rerun}");
    assert_eq!(rerun["retry_on_disruption"], "safe");
    assert_eq!(rerun["rerun_of"].as_str(), Some(id.as_str()));
}
