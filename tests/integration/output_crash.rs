//! `kill -9` of `pullman serve` while output streams in (docs/design.md §9): 16 agents that resend
//! from their first chunk after the restart (issue #24), and a real `pullman worker` whose chunks
//! in flight when the server died are sent again (issue #35). No line is stored twice or lost.

use crate::support;

use std::time::Duration;

use serde_json::{Value, json};
use support::serve::Restartable;
use support::worker::{all_output, run_worker_once};

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

/// The real worker, a command printing 60,000 numbered lines in 60 paced batches (about 6 s, a
/// chunk a second or more), and `kill -9` of the server once the first lines are stored. The
/// worker holds what it could not send (5 MB, under its 8 MiB buffer), resends the chunk the dead
/// server may or may not have stored, and goes on after the restart: every line once, in order,
/// no gap, one attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_a_real_worker_loses_and_doubles_no_line() {
    const BATCHES: usize = 60;
    let mut serve = Restartable::start(&["--maintenance-interval-seconds", "1"]).await;
    let (api, base) = (serve.api.clone(), serve.base.clone());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_, token) = api.agent(json!({"name": "killed", "labels": ["k9"]})).await;
    let id = api.order(support::configmap_order("k9")).await;
    let exec = format!(
        r#"b=0; while [ $b -lt {BATCHES} ]; do seq $((b*1000+1)) $((b*1000+1000)); b=$((b+1)); sleep 0.1; done
        touch {d}/printed; while [ ! -f {d}/go ]; do sleep 0.05; done; echo done"#,
        d = d.display()
    );
    let worker = tokio::spawn({
        let (base, token) = (base.clone(), token.clone());
        async move { run_worker_once(&base, &token, &["--exec", &exec], &[], 120).await }
    });
    support::eventually(30, "the first lines stored", || {
        let (api, id) = (api.clone(), id.clone());
        async move {
            let (st, page) = api
                .admin_get(&format!("/api/v1/work-orders/{id}/output?limit=1"))
                .await;
            (st == 200 && !page["lines"].as_array()?.is_empty()).then_some(())
        }
    })
    .await;
    serve.kill();
    assert!(
        !d.join("printed").exists(),
        "the server was killed while the command still printed"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    serve.start_again().await;
    support::eventually(60, "the command to print its last batch", || async {
        d.join("printed").exists().then_some(())
    })
    .await;
    std::fs::write(d.join("go"), "").unwrap();
    let run = worker.await.unwrap();
    assert_eq!(run.code, Some(0), "{}", run.stderr);

    let lines = all_output(&base, &id).await;
    let markers: Vec<&Value> = lines.iter().filter(|l| !l["marker"].is_null()).collect();
    assert!(markers.is_empty(), "no gap: {markers:?}");
    let got: Vec<&str> = lines.iter().map(|l| l["text"].as_str().unwrap()).collect();
    let want: Vec<String> = (1..=BATCHES * 1000)
        .map(|i| i.to_string())
        .chain(["done".to_string()])
        .collect();
    assert_eq!(got.len(), want.len(), "every line once");
    assert!(got.iter().zip(&want).all(|(g, w)| g == w), "in order");
    let mut seqs: Vec<i64> = lines.iter().map(|l| l["seq"].as_i64().unwrap()).collect();
    seqs.dedup();
    assert_eq!(seqs.first(), Some(&0), "one attempt, from its first chunk");
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    assert_eq!(api.log_entry(&id, 30).await["outcome"], "succeeded");
    serve.stop();
}
