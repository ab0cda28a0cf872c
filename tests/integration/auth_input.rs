//! The 401/403 matrix (docs/design.md §5), token secrecy in logs, and bad input: every refusal is a
//! 4xx JSON error naming the problem, and nothing is written.

use crate::support;

use reqwest::Method;
use serde_json::{Value, json};
use support::{ADMIN_TOKEN, TestServer, configmap_order};

async fn count(s: &TestServer, table: &str) -> i64 {
    let (n,): (i64,) = sqlx::query_as(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(&s.pool)
        .await
        .unwrap();
    n
}

#[tokio::test]
async fn admin_agent_and_anonymous_matrix() {
    let s = TestServer::start().await;
    let (a, a_tok) = s.agent(json!({"name": "a", "labels": ["m"]})).await;
    let (b, _b_tok) = s.agent(json!({"name": "b", "labels": ["m"]})).await;
    let o = s.order(configmap_order("m")).await;

    let admin_routes: Vec<(Method, String, Option<Value>)> = vec![
        (
            Method::POST,
            "/api/v1/work-orders".into(),
            Some(configmap_order("m")),
        ),
        (Method::GET, "/api/v1/work-orders".into(), None),
        (Method::GET, format!("/api/v1/work-orders/{o}"), None),
        (
            Method::GET,
            format!("/api/v1/work-orders/{o}/explain"),
            None,
        ),
        (
            Method::GET,
            format!("/api/v1/work-orders/{o}/attempts"),
            None,
        ),
        (Method::POST, format!("/api/v1/work-orders/{o}/rerun"), None),
        (Method::GET, "/api/v1/backlog?label=m".into(), None),
        (Method::GET, "/api/v1/work-order-log".into(), None),
        (Method::GET, format!("/api/v1/work-order-log/{o}"), None),
        (
            Method::POST,
            "/api/v1/agents".into(),
            Some(json!({"name": "x"})),
        ),
        (Method::GET, "/api/v1/agents".into(), None),
        (Method::GET, format!("/api/v1/agents/{a}"), None),
        (Method::POST, format!("/api/v1/agents/{b}/token"), None),
        (Method::DELETE, format!("/api/v1/agents/{b}"), None),
        (Method::DELETE, format!("/api/v1/work-orders/{o}"), None),
    ];
    for (m, path, body) in &admin_routes {
        let (st, v) = s.call(m.clone(), path, None, body.clone()).await;
        assert_eq!(st, 401, "{m} {path} without token: {v}");
        assert_eq!(v["error"]["code"], "unauthorized");
        let (st, _) = s
            .call(m.clone(), path, Some("pullman_bogus"), body.clone())
            .await;
        assert_eq!(st, 401, "{m} {path} with a bad token");
        let (st, v) = s.call(m.clone(), path, Some(&a_tok), body.clone()).await;
        assert_eq!(st, 403, "{m} {path} with an agent token: {v}");
        assert_eq!(v["error"]["code"], "forbidden");
    }

    // Agent routes: own id fine, another agent's id 403, no token 401, admin allowed.
    let agent_routes: Vec<(Method, String, Option<Value>)> = vec![
        (
            Method::GET,
            "/api/v1/agents/{id}/work-orders/pending".to_string(),
            None,
        ),
        (Method::POST, "/api/v1/agents/{id}/claim".to_string(), None),
        (
            Method::POST,
            format!("/api/v1/work-orders/{o}/claim"),
            Some(json!({"agent_id": "{id}"})),
        ),
        (
            Method::POST,
            format!("/api/v1/work-orders/{o}/heartbeat"),
            Some(json!({"agent_id": "{id}"})),
        ),
        (
            Method::POST,
            format!("/api/v1/work-orders/{o}/complete"),
            Some(json!({"agent_id": "{id}", "success": true})),
        ),
    ];
    let fill = |path: &str, body: &Option<Value>, id: &str| {
        (
            path.replace("{id}", id),
            body.as_ref().map(|b| {
                serde_json::from_str::<Value>(&b.to_string().replace("{id}", id)).unwrap()
            }),
        )
    };
    for (m, path, body) in &agent_routes {
        let (p, bd) = fill(path, body, &b);
        let (st, v) = s.call(m.clone(), &p, Some(&a_tok), bd.clone()).await;
        assert_eq!(st, 403, "{m} {p} as another agent: {v}");
        let (st, _) = s.call(m.clone(), &p, None, bd).await;
        assert_eq!(st, 401, "{m} {p} without token");
        let (p, bd) = fill(path, body, &a);
        let (st, v) = s.call(m.clone(), &p, Some(&a_tok), bd).await;
        assert!(st != 401 && st != 403, "{m} {p} as itself: {st} {v}");
    }
    let (st, _) = s
        .get_as(
            &format!("/api/v1/agents/{a}/work-orders/pending"),
            ADMIN_TOKEN,
        )
        .await;
    assert_eq!(st, 200, "admin may act for any agent");
}

#[tokio::test]
async fn rotated_tokens_revoke_the_old_one() {
    let s = TestServer::start().await;
    let (a, old) = s.agent(json!({"name": "a", "labels": ["m"]})).await;
    let path = format!("/api/v1/agents/{a}/work-orders/pending");
    assert_eq!(s.get_as(&path, &old).await.0, 200);
    // Registering revokes nothing, so it leaves the tokens verified a moment ago trusted.
    let revocations = s.queue.token_revocations();
    s.agent(json!({"name": "b", "labels": ["m"]})).await;
    assert_eq!(s.queue.token_revocations(), revocations);
    let (st, v) = s
        .admin(Method::POST, &format!("/api/v1/agents/{a}/token"), None)
        .await;
    assert_eq!(st, 201);
    assert!(
        s.queue.token_revocations() > revocations,
        "a rotation is a revocation"
    );
    let new = v["token"].as_str().unwrap();
    assert_eq!(s.get_as(&path, &old).await.0, 401);
    assert_eq!(s.get_as(&path, new).await.0, 200);
    // Just verified (so remembered by the server), then retired: refused at once.
    let (st, _) = s.retire(&a).await;
    assert_eq!(st, 200);
    assert_eq!(s.get_as(&path, new).await.0, 401);
    let stored: Vec<(Vec<u8>,)> = sqlx::query_as("SELECT secret_hash FROM agent_tokens")
        .fetch_all(&s.pool)
        .await
        .unwrap();
    for (hash,) in stored {
        assert_eq!(hash.len(), 32, "only SHA-256 hashes are stored");
        assert!(
            !new.as_bytes()
                .windows(hash.len())
                .any(|w| w == hash.as_slice())
        );
    }
}

/// What `pullman serve` logs at its most verbose (`RUST_LOG=trace`, its dependencies' requests
/// and statements included) holds no token and no `yaml_content` (docs/design.md §5). The
/// server is a process of its own: a subscriber set for one test of this binary would also
/// see, and race on, the events of the tests running beside it.
#[tokio::test]
async fn no_token_or_yaml_appears_in_logs() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let db = support::fresh_database_url().await;
    let mut serve = support::serve::Serve::over(&db, &[], &log, "trace");
    support::serve::wait_ready(serve.port).await;
    let api = support::ApiClient::new(&serve.url(""));
    let (a, tok) = api
        .agent(json!({"name": "secretive", "labels": ["m"]}))
        .await;
    let mut body = configmap_order("m");
    body["yaml_content"] =
        json!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: SENTINEL-YAML-CONTENT\n");
    let o = api.order(body).await;
    assert_eq!(api.claim_next(&a, &tok, None).await.0, 200);
    let (st, v) = api
        .complete(&o, &tok, json!({"agent_id": a, "success": true}))
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        api.get_as("/api/v1/work-orders", "pullman_wrong_token_value")
            .await
            .0,
        401
    );
    assert!(serve.stop().success(), "serve stops cleanly");
    let logs = std::fs::read_to_string(&log).unwrap();
    assert!(
        logs.contains("work order finished") && logs.contains("TRACE"),
        "the trace-level log was written: {logs}"
    );
    for secret in [
        tok.as_str(),
        ADMIN_TOKEN,
        "pullman_wrong_token_value",
        "SENTINEL-YAML-CONTENT",
    ] {
        assert!(!logs.contains(secret), "{secret} leaked into logs");
    }
}

#[tokio::test]
async fn bad_input_is_a_4xx_json_error_and_writes_nothing() {
    let s = TestServer::start().await;
    let big = "x".repeat(2 * 1024 * 1024);
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("malformed JSON", "{\"work_type\": ".into(), 400, "malformed_json"),
        ("wrong type", json!({"work_type": 5, "yaml_content": "a", "targeting": {"labels": ["a"]}}).to_string(), 422, "invalid_body"),
        ("unknown field", json!({"work_type": "custom", "yaml_content": "a", "targeting": {"labels": ["a"]}, "colour": "red"}).to_string(), 422, "invalid_body"),
        ("missing field", json!({"work_type": "custom", "targeting": {"labels": ["a"]}}).to_string(), 422, "invalid_body"),
        ("unparsable YAML", json!({"work_type": "custom", "yaml_content": "a: [unclosed", "targeting": {"labels": ["a"]}}).to_string(), 400, "invalid_field"),
        ("YAML without kind", json!({"work_type": "custom", "yaml_content": "apiVersion: v1\nmetadata: {}\n", "targeting": {"labels": ["a"]}}).to_string(), 400, "invalid_field"),
        ("empty YAML", json!({"work_type": "custom", "yaml_content": "---\n# nothing\n", "targeting": {"labels": ["a"]}}).to_string(), 400, "invalid_field"),
        ("unknown work type", json!({"work_type": "deploy", "yaml_content": "a", "targeting": {"labels": ["a"]}}).to_string(), 400, "unknown_work_type"),
        ("max_retries out of range", json!({"work_type": "custom", "yaml_content": "apiVersion: v1\nkind: A\nmetadata: {}\n", "max_retries": 101, "targeting": {"labels": ["a"]}}).to_string(), 400, "invalid_field"),
        ("backoff out of range", json!({"work_type": "custom", "yaml_content": "apiVersion: v1\nkind: A\nmetadata: {}\n", "backoff_seconds": 0, "targeting": {"labels": ["a"]}}).to_string(), 400, "invalid_field"),
        ("claim timeout out of range", json!({"work_type": "custom", "yaml_content": "apiVersion: v1\nkind: A\nmetadata: {}\n", "claim_timeout_seconds": 604801, "targeting": {"labels": ["a"]}}).to_string(), 400, "invalid_field"),
        ("huge number", "{\"work_type\": \"custom\", \"yaml_content\": \"a\", \"max_retries\": 99999999999999999999999, \"targeting\": {\"labels\": [\"a\"]}}".into(), 422, "invalid_body"),
        ("empty targeting", json!({"work_type": "custom", "yaml_content": "apiVersion: v1\nkind: A\nmetadata: {}\n", "targeting": {}}).to_string(), 400, "invalid_field"),
        ("Job with a budget under 60 s", json!({"work_type": "custom", "yaml_content": "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\n", "claim_timeout_seconds": 100, "targeting": {"labels": ["a"]}}).to_string(), 400, "invalid_field"),
        ("build that is not a Build", json!({"work_type": "build", "yaml_content": "apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n", "targeting": {"labels": ["a"]}}).to_string(), 400, "invalid_field"),
        ("2 MiB yaml_content", json!({"work_type": "custom", "yaml_content": big, "targeting": {"labels": ["a"]}}).to_string(), 413, "payload_too_large"),
        ("5 MiB body", format!("{{\"pad\": \"{}\"}}", "y".repeat(5 * 1024 * 1024)), 413, "payload_too_large"),
    ];
    for (what, body, status, code) in cases {
        let resp = s
            .http
            .post(s.url("/api/v1/work-orders"))
            .bearer_auth(ADMIN_TOKEN)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let got = resp.status().as_u16();
        let v: Value = resp.json().await.unwrap_or(Value::Null);
        assert_eq!(got, status, "{what}: {v}");
        assert_eq!(v["error"]["code"], code, "{what}: {v}");
        assert!(
            !v["error"]["message"].as_str().unwrap_or("").is_empty(),
            "{what}: message"
        );
    }
    let (_, v) = s
        .admin_post(
            "/api/v1/work-orders",
            json!({"work_type": "deploy", "yaml_content": "a", "targeting": {"labels": ["a"]}}),
        )
        .await;
    assert_eq!(v["error"]["message"], "Unknown work type: deploy");
    let (_, v) = s
        .admin_post("/api/v1/work-orders", json!({"work_type": "custom", "yaml_content": "apiVersion: v1\nkind: A\nmetadata: {}\n", "max_retries": 101, "targeting": {"labels": ["a"]}}))
        .await;
    assert!(
        support::error_message(&v).contains("max_retries"),
        "names the field: {v}"
    );
    assert_eq!(count(&s, "work_orders").await, 0, "nothing written");

    // Bad input elsewhere: agents, claims, queries, paths.
    let (st, v) = s
        .admin_post("/api/v1/agents", json!({"name": "", "labels": []}))
        .await;
    support::assert_refused(st, &v, 400, "invalid_field");
    let (st, v) = s
        .admin_post(
            "/api/v1/agents",
            json!({"name": "w", "work_types": ["deploy"]}),
        )
        .await;
    support::assert_refused(st, &v, 400, "unknown_work_type");
    assert_eq!(count(&s, "agents").await, 0, "nothing written");
    let (a, tok) = s.agent(json!({"name": "a", "labels": ["a"]})).await;
    let (st, v) = s
        .claim_next(&a, &tok, Some(json!({"lease_seconds": 1})))
        .await;
    assert_eq!(st, 400, "{v}");
    assert!(support::error_message(&v).contains("lease_seconds"));
    let (st, v) = s
        .claim_next(&a, &tok, Some(json!({"max_wait_seconds": "soon"})))
        .await;
    assert_eq!(st, 422, "{v}");
    let (st, v) = s.admin_get("/api/v1/work-orders?limit=5000").await;
    support::assert_refused(st, &v, 400, "invalid_query");
    let (st, v) = s.admin_get("/api/v1/work-orders?status=DONE").await;
    assert_eq!(st, 400, "{v}");
    let (st, v) = s.admin_get("/api/v1/work-orders?cursor=garbage").await;
    support::assert_refused(st, &v, 400, "invalid_cursor");
    let (st, v) = s.admin_get("/api/v1/work-orders/not-a-uuid").await;
    support::assert_refused(st, &v, 400, "invalid_path");
    let (st, v) = s
        .admin_get(&format!("/api/v1/work-orders/{}", uuid::Uuid::new_v4()))
        .await;
    support::assert_refused(st, &v, 404, "not_found");
}

#[tokio::test]
async fn lists_paginate_by_keyset_and_omit_yaml() {
    let s = TestServer::start().await;
    let mut ids = Vec::new();
    for _ in 0..7 {
        ids.push(s.order(configmap_order("p")).await);
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/api/v1/work-orders?limit=3&cursor={c}"),
            None => "/api/v1/work-orders?limit=3".to_string(),
        };
        let (st, v) = s.admin_get(&path).await;
        assert_eq!(st, 200, "{v}");
        for item in v["items"].as_array().unwrap() {
            assert!(item.get("yaml_content").is_none());
            seen.push(item["id"].as_str().unwrap().to_string());
        }
        match v["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, ids, "every order once, oldest first");
    for o in &ids {
        s.cancel(o).await;
    }
    let (_, v) = s
        .admin_get("/api/v1/work-order-log?limit=4&success=false")
        .await;
    assert_eq!(v["items"].as_array().unwrap().len(), 4);
    assert!(v["next_cursor"].is_string());
    assert_eq!(v["items"][0]["id"], json!(ids[6]), "newest first");
    let (_, v) = s.admin_get("/api/v1/work-order-log?success=true").await;
    assert!(v["items"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn openapi_describes_every_route_and_ops_endpoints_answer() {
    let s = TestServer::start().await;
    let (st, doc) = s.get("/api/v1/openapi.json").await;
    assert_eq!(st, 200);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    let paths = doc["paths"].as_object().unwrap();
    for p in [
        "/api/v1/work-orders",
        "/api/v1/work-orders/{id}",
        "/api/v1/work-orders/{id}/claim",
        "/api/v1/work-orders/{id}/heartbeat",
        "/api/v1/work-orders/{id}/complete",
        "/api/v1/work-order-log",
        "/api/v1/work-order-log/{id}",
        "/api/v1/agents",
        "/api/v1/agents/{id}",
        "/api/v1/agents/{id}/token",
        "/api/v1/agents/{id}/work-orders/pending",
        "/api/v1/agents/{id}/claim",
        "/api/v1/work-orders/{id}/explain",
        "/api/v1/agents/{id}/backlog",
        "/api/v1/agents/me/backlog",
        "/api/v1/backlog",
        "/api/v1/work-orders/{id}/output",
        "/healthz",
        "/readyz",
        "/metrics",
    ] {
        assert!(paths.contains_key(p), "{p} missing from OpenAPI");
    }
    // A generated client names its methods by operationId: each operation has one, never twice
    // (two modules' `list` and `get_one` once made the document invalid).
    let mut ids = std::collections::BTreeMap::new();
    for (path, item) in paths {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"]
                .as_str()
                .unwrap_or_else(|| panic!("{method} {path} has no operationId"));
            if let Some(other) = ids.insert(id.to_string(), format!("{method} {path}")) {
                panic!("operationId {id} used by {other} and {method} {path}");
            }
        }
    }
    let complete = &paths["/api/v1/work-orders/{id}/complete"]["post"]["responses"];
    assert!(complete.get("200").is_some() && complete.get("202").is_some());
    assert_eq!(s.get("/healthz").await.0, 200);
    assert_eq!(s.get("/readyz").await.0, 200);
    let (a, tok) = s.agent(json!({"name": "m", "labels": ["m"]})).await;
    s.order(configmap_order("m")).await;
    s.claim_next(&a, &tok, None).await;
    let text = s.scrape().await;
    for m in [
        "pullman_work_orders{status=\"CLAIMED\"} 1",
        "pullman_claims_total 1",
        "pullman_claim_duration_seconds_count 1",
        "pullman_queue_wait_seconds_count 1",
        "pullman_http_requests_total{method=\"POST\",route=\"/api/v1/agents/{id}/claim\",status=\"200\"} 1",
        "pullman_reaped_claims_total",
        "pullman_completions_total{outcome=\"succeeded\"} 0",
    ] {
        assert!(text.contains(m), "{m} missing from /metrics:\n{text}");
    }
}

/// Schemathesis (e2e/schemathesis) found these: a JSON array passed for a body object (serde
/// reads a struct from an array field by field), and integral floats such as `60.0`, which
/// JSON Schema counts as integers, refused as a type error.
#[tokio::test]
async fn bodies_are_objects_and_integral_floats_are_integers() {
    let s = TestServer::start().await;
    let (a, a_tok) = s.agent(json!({"name": "a", "labels": ["m"]})).await;
    let claim_next = format!("/api/v1/agents/{a}/claim");
    for body in [
        json!([null, null]),
        json!([]),
        json!(5),
        json!("x"),
        json!(null),
    ] {
        let (st, v) = s
            .call(Method::POST, &claim_next, Some(&a_tok), Some(body.clone()))
            .await;
        assert_eq!(st, 422, "claim-next with {body}: {v}");
        assert_eq!(v["error"]["code"], "invalid_body");
    }
    let o = s.order(configmap_order("m")).await;
    let (st, v) = s
        .call(
            Method::POST,
            &format!("/api/v1/work-orders/{o}/claim"),
            Some(&a_tok),
            Some(json!([a.to_string()])),
        )
        .await;
    assert_eq!(st, 422, "claim with an array: {v}");

    let mut order = configmap_order("m");
    order["backoff_seconds"] = json!(582.0);
    let (st, v) = s.admin_post("/api/v1/work-orders", order).await;
    assert_eq!(st, 201, "integral float: {v}");
    assert_eq!(v["backoff_seconds"], 582);
    let mut order = configmap_order("m");
    order["backoff_seconds"] = json!(582.5);
    let (st, v) = s.admin_post("/api/v1/work-orders", order).await;
    assert_eq!(st, 422, "fractional number: {v}");
    let (st, v) = s
        .call(
            Method::POST,
            &claim_next,
            Some(&a_tok),
            Some(json!({"lease_seconds": 60.0})),
        )
        .await;
    assert_eq!(st, 200, "claim-next with lease_seconds 60.0: {v}");
    assert_eq!(v["lease_seconds"], 60);
}
