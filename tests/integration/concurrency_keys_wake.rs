//! Concurrency keys over HTTP (docs/design.md §3 "Concurrency keys", issue #40): a freed slot
//! wakes an agent long-polling for the key's orders, which no insert or requeue announces, and
//! two slots freed together wake two. The queue-level tests are in `concurrency_keys.rs`.

use crate::support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use support::TestServer;

/// A create body for agents labelled `keys`, with `concurrency`.
fn body(concurrency: Value) -> Value {
    json!({
        "work_type": "custom",
        "yaml_content": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n",
        "targeting": {"labels": ["keys"]},
        "concurrency": concurrency,
    })
}

/// Claim-next over HTTP, not waiting: the status and the answer.
async fn claim_over_http(s: &TestServer, agent: &str, token: &str) -> (u16, Value) {
    let path = format!("/api/v1/agents/{agent}/claim");
    s.call(Method::POST, &path, Some(token), Some(json!({})))
        .await
}

/// Claim-next at `url` waiting up to 20 s: the id of the order handed out, if any, and how long
/// the answer took.
async fn long_poll(url: String, token: String) -> (Option<String>, Duration) {
    let started = Instant::now();
    let answer = reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .json(&json!({"max_wait_seconds": 20}))
        .send()
        .await
        .unwrap();
    let v: Value = if answer.status() == 200 {
        answer.json().await.unwrap()
    } else {
        Value::Null
    };
    (v["id"].as_str().map(str::to_string), started.elapsed())
}

/// Over HTTP: the create answer carries the key, a full key is `409 concurrency_limited` for a
/// claim by id, and an agent long-polling for a limited order is woken by the complete that
/// frees its slot (no insert or requeue announces it).
#[tokio::test]
async fn a_freed_slot_wakes_a_long_polling_agent() {
    let s = TestServer::start().await;
    let (a, a_token) = s.agent(json!({"name": "a", "labels": ["keys"]})).await;
    let (b, b_token) = s.agent(json!({"name": "b", "labels": ["keys"]})).await;
    let first = s.order(body(json!({"key": "deploy"}))).await;
    let second = s.order(body(json!({"key": "deploy"}))).await;
    let (st, claimed) = claim_over_http(&s, &a, &a_token).await;
    assert_eq!(st, 200, "{claimed}");
    assert_eq!(claimed["id"], first.as_str());
    assert_eq!(claimed["concurrency"]["key"], "deploy");
    assert_eq!(claimed["concurrency"]["max"], 1);
    assert_eq!(claimed["concurrency"]["on_conflict"], "queue");
    let (st, refused) = s.claim(&second, &b, &b_token).await;
    assert_eq!(
        (st, refused["error"]["code"].as_str()),
        (409, Some("concurrency_limited"))
    );
    let (st, explained) = s
        .admin_get(&format!("/api/v1/work-orders/{second}/explain"))
        .await;
    assert_eq!(st, 200);
    assert_eq!(explained["reason"], "concurrency_limited");
    assert_eq!(explained["concurrency"]["holders"], json!([first]));

    let waiter = tokio::spawn(long_poll(
        s.url(&format!("/api/v1/agents/{b}/claim")),
        b_token,
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (st, _) = s
        .complete(&first, &a_token, json!({"agent_id": a, "success": true}))
        .await;
    assert_eq!(st, 200);
    let (got, waited) = waiter.await.unwrap();
    assert_eq!(got.as_deref(), Some(second.as_str()));
    assert!(
        waited < Duration::from_secs(10),
        "the waiting agent was not woken by the freed slot ({waited:?})"
    );
}

/// Two slots of a key of `max` 2 freed together wake two long-polling agents, not one: each freed
/// slot of a key that has been full announces an order.
#[tokio::test]
async fn slots_freed_together_wake_as_many_agents() {
    let s = TestServer::start().await;
    let (a, a_token) = s.agent(json!({"name": "a", "labels": ["keys"]})).await;
    let key = json!({"key": "pair", "max": 2});
    let mut held = vec![];
    for _ in 0..2 {
        s.order(body(key.clone())).await;
        let (st, v) = claim_over_http(&s, &a, &a_token).await;
        assert_eq!(st, 200, "{v}");
        held.push(v["id"].as_str().unwrap().to_string());
    }
    let waiting = [
        s.order(body(key.clone())).await,
        s.order(body(key.clone())).await,
    ];
    let mut waiters = vec![];
    for name in ["b", "c"] {
        let (id, token) = s.agent(json!({"name": name, "labels": ["keys"]})).await;
        let url = s.url(&format!("/api/v1/agents/{id}/claim"));
        waiters.push(tokio::spawn(long_poll(url, token)));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Both holders complete at once, before either woken agent claims.
    let paths: Vec<String> = held
        .iter()
        .map(|o| format!("/api/v1/work-orders/{o}/complete"))
        .collect();
    let completes = paths.iter().map(|path| {
        s.call(
            Method::POST,
            path,
            Some(&a_token),
            Some(json!({"agent_id": a, "success": true})),
        )
    });
    for (st, v) in futures::future::join_all(completes).await {
        assert_eq!(st, 200, "{v}");
    }
    let mut got = HashSet::new();
    for w in waiters {
        let (id, waited) = w.await.unwrap();
        assert!(
            waited < Duration::from_secs(10),
            "an agent slept on a free slot ({waited:?}, got {id:?})"
        );
        got.insert(id.unwrap());
    }
    assert_eq!(got, waiting.into_iter().collect::<HashSet<_>>());
}
