//! An order's history through the API, against a real PostgreSQL: attempts (every claim and how
//! it ended), re-runs, list filters and id prefixes (docs/design.md §5, issue #15).

use crate::support;

use reqwest::Method;
use serde_json::{Value, json};
use support::TestServer;

fn order(label: &str, max_retries: i64) -> Value {
    json!({
        "work_type": "custom",
        "yaml_content": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: h\n",
        "max_retries": max_retries,
        "backoff_seconds": 1,
        "targeting": {"labels": [label]},
    })
}

/// Claims `order` as `agent` with a lease; returns the claim id.
async fn claim(s: &TestServer, agent: &str, token: &str, order: &str) -> String {
    let (st, v) = s
        .call(
            Method::POST,
            &format!("/api/v1/work-orders/{order}/claim"),
            Some(token),
            Some(json!({"agent_id": agent, "lease_seconds": 30})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    v["claim_id"].as_str().unwrap().to_string()
}

async fn complete(s: &TestServer, agent: &str, token: &str, order: &str, body: Value) -> u16 {
    let mut body = body;
    body["agent_id"] = json!(agent);
    let (st, v) = s.complete(order, token, body).await;
    assert!(st == 200 || st == 202, "{st} {v}");
    st
}

async fn attempts(s: &TestServer, order: &str) -> Vec<Value> {
    let (st, v) = s
        .admin_get(&format!("/api/v1/work-orders/{order}/attempts"))
        .await;
    assert_eq!(st, 200, "{v}");
    v.as_array().unwrap().clone()
}

/// `(agent_id, claim_id, result)` of each attempt.
fn summary(attempts: &[Value]) -> Vec<(String, String, String)> {
    attempts
        .iter()
        .map(|a| {
            (
                a["agent_id"].as_str().unwrap().to_string(),
                a["claim_id"].as_str().unwrap().to_string(),
                a["result"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn attempts_record_a_failure_a_reclaim_and_a_success() {
    let s = TestServer::start().await;
    let (a, a_token) = s.agent(json!({"name": "a", "labels": ["h"]})).await;
    let (b, b_token) = s.agent(json!({"name": "b", "labels": ["h"]})).await;
    let id = s.order(order("h", 2)).await;
    assert!(attempts(&s, &id).await.is_empty(), "never claimed");

    // 1. a fails; a retry is scheduled.
    let first = claim(&s, &a, &a_token, &id).await;
    let running = attempts(&s, &id).await;
    assert_eq!(
        summary(&running),
        vec![(a.clone(), first.clone(), "running".into())]
    );
    assert!(running[0]["ended_at"].is_null());
    let st = complete(
        &s,
        &a,
        &a_token,
        &id,
        json!({"success": false, "message": "exit 2"}),
    )
    .await;
    assert_eq!(st, 202);

    // 2. a claims again and goes silent: the reaper releases the claim.
    sqlx::query("UPDATE work_orders SET next_retry_after = now() WHERE id = $1::uuid")
        .bind(&id)
        .execute(&s.pool)
        .await
        .unwrap();
    let second = claim(&s, &a, &a_token, &id).await;
    sqlx::query(
        "UPDATE work_order_claims SET lease_expires_at = now() - interval '1 second' \
         WHERE work_order_id = $1::uuid",
    )
    .bind(&id)
    .execute(&s.pool)
    .await
    .unwrap();
    assert_eq!(s.queue.reap_stale_claims().await.unwrap(), (1, 0));

    // 3. b succeeds.
    let third = claim(&s, &b, &b_token, &id).await;
    let st = complete(
        &s,
        &b,
        &b_token,
        &id,
        json!({"success": true, "message": "done"}),
    )
    .await;
    assert_eq!(st, 200);

    let expected = vec![
        (a.clone(), first, "retry_scheduled".to_string()),
        (a.clone(), second, "reclaimed".to_string()),
        (b.clone(), third, "succeeded".to_string()),
    ];
    let all = attempts(&s, &id).await;
    assert_eq!(summary(&all), expected);
    assert_eq!(all[0]["message"], "exit 2");
    assert_eq!(all[1]["message"], "the lease expired: no heartbeat in time");
    assert_eq!(all[2]["message"], "done");
    for a in &all {
        let (started, ended) = (a["started_at"].as_str().unwrap(), a["ended_at"].as_str());
        assert!(ended.is_some_and(|e| e >= started), "{a}");
    }
    // The log entry carries the same history, and the counts agree with it.
    let entry = s.log_entry(&id, 5).await;
    assert_eq!(summary(entry["attempts"].as_array().unwrap()), expected);
    assert_eq!(
        (
            entry["retry_count"].as_i64(),
            entry["reclaim_count"].as_i64()
        ),
        (Some(1), Some(1))
    );
    // Lists stay lean.
    let (_, page) = s.admin_get("/api/v1/work-order-log").await;
    assert!(page["items"][0].get("attempts").is_none(), "{page}");
}

#[tokio::test]
async fn attempts_say_cancelled_released_and_reaper_exhausted() {
    let s = TestServer::start().await;
    let (a, a_token) = s.agent(json!({"name": "a", "labels": ["h"]})).await;
    let (b, b_token) = s.agent(json!({"name": "b", "labels": ["h"]})).await;

    // Cancelled while claimed.
    let cancelled = s.order(order("h", 0)).await;
    let c1 = claim(&s, &a, &a_token, &cancelled).await;
    let (st, _) = s.cancel(&cancelled).await;
    assert_eq!(st, 200);
    assert_eq!(
        summary(&attempts(&s, &cancelled).await),
        vec![(a.clone(), c1, "cancelled".into())]
    );

    // Released when its agent is retired; then finished by another agent. The active order shows
    // its history too.
    let released = s.order(order("h", 0)).await;
    let r1 = claim(&s, &b, &b_token, &released).await;
    let (st, _) = s.retire(&b).await;
    assert_eq!(st, 200);
    let (st, active) = s
        .admin_get(&format!("/api/v1/work-orders/{released}"))
        .await;
    assert_eq!(st, 200);
    assert_eq!(
        summary(active["attempts"].as_array().unwrap()),
        vec![(b.clone(), r1.clone(), "released".into())]
    );
    let r2 = claim(&s, &a, &a_token, &released).await;
    complete(
        &s,
        &a,
        &a_token,
        &released,
        json!({"success": false, "retryable": false}),
    )
    .await;
    assert_eq!(
        summary(&attempts(&s, &released).await),
        vec![(b, r1, "released".into()), (a.clone(), r2, "failed".into())]
    );

    // Reclaims used up: the reaper's final release ends the order.
    let mut body = order("h", 0);
    body["max_reclaims"] = json!(0);
    let exhausted = s.order(body).await;
    let e1 = claim(&s, &a, &a_token, &exhausted).await;
    sqlx::query(
        "UPDATE work_order_claims SET deadline = now() - interval '1 second' \
         WHERE work_order_id = $1::uuid",
    )
    .bind(&exhausted)
    .execute(&s.pool)
    .await
    .unwrap();
    assert_eq!(s.queue.reap_stale_claims().await.unwrap(), (0, 1));
    assert_eq!(
        summary(&attempts(&s, &exhausted).await),
        vec![(a, e1, "reclaimed".into())]
    );

    let (st, v) = s
        .admin_get(&format!(
            "/api/v1/work-orders/{}/attempts",
            uuid::Uuid::new_v4()
        ))
        .await;
    assert_eq!((st, v["error"]["code"].as_str()), (404, Some("not_found")));
}

#[tokio::test]
async fn rerun_queues_a_linked_copy_of_a_finished_order() {
    let s = TestServer::start().await;
    let (a, a_token) = s.agent(json!({"name": "a", "labels": ["h"]})).await;
    let mut body = order("h", 4);
    body["tenant"] = json!("team-a");
    body["claim_timeout_seconds"] = json!(600);
    let id = s.order(body).await;

    let rerun_path = format!("/api/v1/work-orders/{id}/rerun");
    let (st, v) = s.admin(Method::POST, &rerun_path, None).await;
    support::assert_refused(st, &v, 409, "not_finished");

    claim(&s, &a, &a_token, &id).await;
    complete(&s, &a, &a_token, &id, json!({"success": true})).await;
    let (st, copy) = s.admin(Method::POST, &rerun_path, None).await;
    assert_eq!(st, 201, "{copy}");
    let copy_id = copy["id"].as_str().unwrap();
    assert_ne!(copy_id, id);
    assert_eq!(copy["rerun_of"], json!(id));
    assert_eq!(copy["status"], "PENDING");
    let (_, original) = s.admin_get(&format!("/api/v1/work-order-log/{id}")).await;
    let (_, full) = s.admin_get(&format!("/api/v1/work-orders/{copy_id}")).await;
    for field in [
        "work_type",
        "yaml_content",
        "max_retries",
        "backoff_seconds",
        "claim_timeout_seconds",
        "max_reclaims",
        "tenant",
        "targeting",
    ] {
        assert_eq!(full[field], original[field], "{field}");
    }
    assert_eq!(full["attempts"], json!([]));
    // The link survives the copy's own trip to the log.
    claim(&s, &a, &a_token, copy_id).await;
    complete(&s, &a, &a_token, copy_id, json!({"success": true})).await;
    assert_eq!(s.log_entry(copy_id, 5).await["rerun_of"], json!(id));

    // An Idempotency-Key makes a retried re-run return the same new order.
    let send = || {
        s.http
            .post(s.url(&rerun_path))
            .bearer_auth(support::ADMIN_TOKEN)
            .header("Idempotency-Key", "rerun-once")
            .send()
    };
    let first = send().await.unwrap();
    assert_eq!(first.status(), 201);
    let first: Value = first.json().await.unwrap();
    let again = send().await.unwrap();
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let again: Value = again.json().await.unwrap();
    assert_eq!(first["id"], again["id"]);

    let (st, _) = s
        .admin(
            Method::POST,
            &format!("/api/v1/work-orders/{}/rerun", uuid::Uuid::new_v4()),
            None,
        )
        .await;
    assert_eq!(st, 404);
}

/// Ids of the items of a list answer.
fn ids(page: &Value) -> Vec<String> {
    page["items"]
        .as_array()
        .unwrap_or_else(|| panic!("not a page: {page}"))
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn lists_filter_by_label_agent_outcome_time_and_id_prefix() {
    let s = TestServer::start().await;
    let (a, a_token) = s.agent(json!({"name": "a", "labels": ["x", "y"]})).await;
    let x1 = s.order(order("x", 0)).await;
    let y1 = s.order(order("y", 0)).await;
    let x2 = s.order(order("x", 0)).await;
    let get = |path: String| {
        let s = &s;
        async move {
            let (st, v) = s.admin_get(&path).await;
            assert_eq!(st, 200, "{path}: {v}");
            v
        }
    };
    assert_eq!(
        ids(&get("/api/v1/work-orders?label=x".into()).await),
        vec![x1.clone(), x2.clone()]
    );
    claim(&s, &a, &a_token, &y1).await;
    assert_eq!(
        ids(&get(format!("/api/v1/work-orders?agent_id={a}")).await),
        vec![y1.clone()]
    );
    let future = "2999-01-01T00:00:00Z";
    assert!(ids(&get(format!("/api/v1/work-orders?since={future}")).await).is_empty());
    assert_eq!(
        ids(&get("/api/v1/work-orders?since=2000-01-01T00:00:00Z".into()).await).len(),
        3
    );
    for prefix in [
        &x2[..1],
        &x2[..8],
        &x2[..13],
        &x2.replace('-', "")[..20],
        &x2[..],
    ] {
        let found = ids(&get(format!("/api/v1/work-orders?id_prefix={prefix}")).await);
        assert!(found.contains(&x2), "{prefix} did not find {x2}");
        assert!(
            found
                .iter()
                .all(|f| f.replace('-', "").starts_with(&prefix.replace('-', "")))
        );
    }
    assert_eq!(
        ids(&get(format!(
            "/api/v1/work-orders?id_prefix={}",
            x2.to_uppercase()
        ))
        .await),
        vec![x2.clone()]
    );

    // The log: y1 succeeds, x1 fails, x2 is cancelled.
    complete(&s, &a, &a_token, &y1, json!({"success": true})).await;
    claim(&s, &a, &a_token, &x1).await;
    complete(&s, &a, &a_token, &x1, json!({"success": false})).await;
    s.cancel(&x2).await;
    let log = |q: &str| get(format!("/api/v1/work-order-log?{q}"));
    assert_eq!(ids(&log("outcome=failed").await), vec![x1.clone()]);
    assert_eq!(ids(&log("outcome=cancelled").await), vec![x2.clone()]);
    assert_eq!(
        ids(&log("outcome=succeeded&label=y").await),
        vec![y1.clone()]
    );
    assert_eq!(ids(&log("label=x").await), vec![x2.clone(), x1.clone()]);
    assert!(ids(&log(&format!("since={future}")).await).is_empty());
    assert_eq!(
        ids(&log(&format!("id_prefix={}", &y1[..13])).await),
        vec![y1.clone()]
    );

    for (path, field) in [
        ("/api/v1/work-orders?id_prefix=xyz", "id_prefix"),
        ("/api/v1/work-orders?id_prefix=", "id_prefix"),
        ("/api/v1/work-order-log?outcome=won", "outcome"),
        ("/api/v1/work-orders?since=yesterday", "since"),
    ] {
        let (st, v) = s.admin_get(path).await;
        assert_eq!(st, 400, "{path}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{path}: {message}");
    }
}

#[tokio::test]
async fn expired_log_entries_take_their_attempts_with_them() {
    let s = TestServer::start().await;
    let (a, a_token) = s.agent(json!({"name": "a", "labels": ["h"]})).await;
    let id = s.order(order("h", 1)).await;
    claim(&s, &a, &a_token, &id).await;
    complete(&s, &a, &a_token, &id, json!({"success": false})).await;
    sqlx::query("UPDATE work_orders SET next_retry_after = now() WHERE id = $1::uuid")
        .bind(&id)
        .execute(&s.pool)
        .await
        .unwrap();
    claim(&s, &a, &a_token, &id).await;
    complete(&s, &a, &a_token, &id, json!({"success": true})).await;
    assert_eq!(attempts(&s, &id).await.len(), 2);
    sqlx::query("UPDATE work_order_log SET completed_at = now() - interval '40 days'")
        .execute(&s.pool)
        .await
        .unwrap();
    let deleted = s
        .queue
        .expire_history(std::time::Duration::from_secs(30 * 86400))
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    let (left,): (i64,) = sqlx::query_as("SELECT count(*) FROM work_order_attempts")
        .fetch_one(&s.pool)
        .await
        .unwrap();
    assert_eq!(left, 0);
}

#[tokio::test]
async fn a_label_filter_with_nul_matches_as_the_label_was_stored() {
    let s = TestServer::start().await;
    let id = s.order(order("ab", 0)).await;
    for path in [
        "/api/v1/work-orders?label=a%00b",
        "/api/v1/work-order-log?label=a%00b",
    ] {
        let (st, v) = s.admin_get(path).await;
        assert_eq!(st, 200, "{path}: {v}");
        if path.contains("work-orders") {
            assert_eq!(ids(&v), vec![id.clone()]);
        }
    }
}
