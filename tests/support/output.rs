//! Output of running orders over HTTP (docs/design.md §9): an agent holding a claim, its chunks,
//! pages read back, and a follower to the end; shared by the output tests.

use reqwest::Method;
use serde_json::{Value, json};

use super::{ADMIN_TOKEN, TestServer, configmap_order};

/// An agent with `label`, an order for it, and its claim: (agent, token, order, claim).
pub async fn claimed(s: &TestServer, label: &str) -> (String, String, String, String) {
    let (agent, token) = s.agent(json!({"name": label, "labels": [label]})).await;
    let order = s.order(configmap_order(label)).await;
    let (st, v) = s
        .claim_next(&agent, &token, Some(json!({"max_wait_seconds": 5})))
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["id"], order.as_str());
    let claim = v["claim_id"].as_str().unwrap().to_string();
    (agent, token, order, claim)
}

pub fn chunk(agent: &str, claim: &str, seq: i64, texts: &[&str]) -> Value {
    let lines: Vec<Value> = texts
        .iter()
        .map(|t| json!({"stream": "stdout", "text": t, "at": "2026-12-02T10:00:00Z"}))
        .collect();
    json!({"agent_id": agent, "claim_id": claim, "seq": seq, "lines": lines})
}

pub async fn send(s: &TestServer, token: &str, order: &str, body: Value) -> (u16, Value) {
    s.call(
        Method::POST,
        &format!("/api/v1/work-orders/{order}/output"),
        Some(token),
        Some(body),
    )
    .await
}

pub async fn read(s: &TestServer, order: &str, query: &str) -> Value {
    let (st, v) = s
        .admin_get(&format!("/api/v1/work-orders/{order}/output{query}"))
        .await;
    assert_eq!(st, 200, "{v}");
    v
}

pub fn texts(page: &Value) -> Vec<String> {
    page["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["text"].as_str().unwrap().to_string())
        .collect()
}

pub async fn complete(s: &TestServer, token: &str, order: &str, agent: &str, claim: &str) {
    let (st, v) = s
        .complete(
            order,
            token,
            json!({"agent_id": agent, "claim_id": claim, "success": true}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
}

/// Follows `order` to its end; returns the texts seen.
pub async fn follow(base: String, order: String) -> Vec<String> {
    let r = reqwest::Client::new()
        .get(format!(
            "{base}/api/v1/work-orders/{order}/output?follow=true"
        ))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["content-type"], "application/x-ndjson");
    let body = r.text().await.unwrap();
    body.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["text"].as_str().unwrap().to_string()
        })
        .collect()
}
