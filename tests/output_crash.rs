//! `kill -9` of `pullman serve` while 16 agents stream output (docs/design.md §9, issue #24): after a
//! restart every agent resends from its first chunk and no line is stored twice.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::serve::Restartable;

const SENDERS: usize = 16;
const CHUNKS: i64 = 600;
const LINES: i64 = 5;

fn chunk(agent: &str, claim: &str, order: usize, seq: i64) -> Value {
    let lines: Vec<Value> = (0..LINES)
        .map(|i| json!({"stream": "stdout", "text": format!("o{order} s{seq} l{i}"), "at": "2026-12-02T10:00:00Z"}))
        .collect();
    json!({"agent_id": agent, "claim_id": claim, "seq": seq, "lines": lines})
}

/// Sends chunks `from..CHUNKS` in order; stops at the first failure (the server died). Returns
/// how many were acknowledged.
async fn stream(
    base: String,
    token: String,
    agent: String,
    order: String,
    claim: String,
    n: usize,
) -> i64 {
    let http = reqwest::Client::new();
    let mut acked = 0;
    for seq in 0..CHUNKS {
        loop {
            let r = http
                .post(format!("{base}/work-orders/{order}/output"))
                .bearer_auth(&token)
                .json(&chunk(&agent, &claim, n, seq))
                .send()
                .await;
            match r {
                Ok(r) if r.status().as_u16() == 429 => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Ok(r) if r.status().is_success() => {
                    acked += 1;
                    break;
                }
                _ => return acked,
            }
        }
    }
    acked
}

#[tokio::test]
async fn kill_9_while_agents_stream_then_resend_stores_no_line_twice() {
    let mut serve = Restartable::start(&[]).await;
    let base = format!("{}/api/v1", serve.base);
    let api = serve.api.clone();
    let (agent, token) = api
        .agent(json!({"name": "streamer", "labels": ["crash"]}))
        .await;
    let mut orders = Vec::new();
    for _ in 0..SENDERS {
        api.order(support::configmap_order("crash")).await;
        let (status, c) = api.claim_next(&agent, &token, Some(json!({}))).await;
        assert_eq!(status, 200, "{c}");
        orders.push((
            c["id"].as_str().unwrap().to_string(),
            c["claim_id"].as_str().unwrap().to_string(),
        ));
    }
    // Each agent streams its order's chunks from seq 0; says how many were acknowledged.
    let stream_all = || -> Vec<_> {
        orders
            .iter()
            .enumerate()
            .map(|(n, (o, c))| {
                let (base, token, agent) = (base.clone(), token.clone(), agent.clone());
                tokio::spawn(stream(base, token, agent, o.clone(), c.clone(), n))
            })
            .collect()
    };
    let senders = stream_all();
    tokio::time::sleep(Duration::from_millis(700)).await;
    serve.kill();
    let mut before = 0;
    for s in senders {
        before += s.await.unwrap();
    }
    assert!(
        before > 0 && before < SENDERS as i64 * CHUNKS,
        "killed mid-stream: {before} chunks acknowledged"
    );
    serve.start_again().await;
    // Every agent resends everything from seq 0 (it cannot know what the dead server stored).
    let resent = stream_all();
    for s in resent {
        assert_eq!(
            s.await.unwrap(),
            CHUNKS,
            "every chunk accepted after the restart"
        );
    }
    for (n, (order, _)) in orders.iter().enumerate() {
        let (status, page) = api
            .admin_get(&format!("/api/v1/work-orders/{order}/output?limit=10000"))
            .await;
        assert_eq!(status, 200, "{page}");
        let got: Vec<String> = page["lines"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["text"].as_str().unwrap().to_string())
            .collect();
        let want: Vec<String> = (0..CHUNKS)
            .flat_map(|s| (0..LINES).map(move |i| format!("o{n} s{s} l{i}")))
            .collect();
        assert_eq!(got, want, "order {n}: every line once, in order");
    }
}
