//! Output of running orders (docs/design.md §9, issue #24), the server side, against real PostgreSQL:
//! storing chunks once under real concurrency, fencing, bad input, the cap and gap markers, the
//! readers (`after`, `tail`, `attempt`). Retention, outages and stale claims:
//! `tests/integration/output_lifecycle.rs`; following: `tests/integration/output_follow.rs`.

use crate::support;

use std::time::Duration;

use pullman::api::OutputSettings;
use pullman::queue::output::STORED_LINE_OVERHEAD_BYTES;
use serde_json::{Value, json};
use support::TestServer;
use support::output::{chunk, claimed, complete, read, send, texts};

#[tokio::test]
async fn chunks_are_stored_once_under_concurrent_resends_and_read_in_order() {
    let s = TestServer::start().await;
    let (agent, token, order, claim) = claimed(&s, "out-a").await;
    // Every chunk sent 8 times at once: each stored once, every answer the same.
    let mut tasks = Vec::new();
    for seq in 0..20i64 {
        for _ in 0..8 {
            let (s_http, url, token) = (
                s.http.clone(),
                s.url(&format!("/api/v1/work-orders/{order}/output")),
                token.clone(),
            );
            let body = chunk(
                &agent,
                &claim,
                seq,
                &[&format!("line {seq}.a"), &format!("line {seq}.b")],
            );
            tasks.push(tokio::spawn(async move {
                loop {
                    let r = s_http
                        .post(&url)
                        .bearer_auth(&token)
                        .json(&body)
                        .send()
                        .await
                        .unwrap();
                    let st = r.status().as_u16();
                    if st == 429 {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                    let v: Value = r.json().await.unwrap();
                    return (st, v);
                }
            }));
        }
    }
    for t in tasks {
        let (st, v) = t.await.unwrap();
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["lines"], 2, "{v}");
    }
    let page = read(&s, &order, "").await;
    let expected: Vec<String> = (0..20)
        .flat_map(|i| [format!("line {i}.a"), format!("line {i}.b")])
        .collect();
    let mut got = texts(&page);
    got.sort();
    let mut want = expected.clone();
    want.sort();
    assert_eq!(got, want, "every line once");
    assert_eq!(page["finished"], false);
    assert_eq!(page["more"], false);
    let first = &page["lines"][0];
    assert_eq!(first["claim_id"], claim.as_str());
    assert_eq!(first["attempt"], 1);
    assert_eq!(first["stream"], "stdout");
    assert_eq!(first["at"], "2026-12-02T10:00:00Z");
    // Cursors grow; paging with limit and after walks the same lines.
    let mut after: Option<i64> = None;
    let mut walked = Vec::new();
    loop {
        let q = match after {
            Some(a) => format!("?limit=7&after={a}"),
            None => "?limit=7".to_string(),
        };
        let p = read(&s, &order, &q).await;
        walked.extend(texts(&p));
        after = p["next_cursor"].as_i64();
        if p["more"] == false {
            break;
        }
    }
    assert_eq!(walked, texts(&page));
    let metrics = s.metrics.encode();
    assert!(
        metrics.contains("pullman_output_lines_received_total 40"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_chunk_of_a_claim_that_is_not_live_is_409_and_bad_input_is_refused_clearly() {
    let s = TestServer::start().await;
    let (agent, token, order, claim) = claimed(&s, "out-b").await;
    let (st, _) = send(&s, &token, &order, chunk(&agent, &claim, 0, &["first"])).await;
    assert_eq!(st, 200);
    // Another claim id: not the live one.
    let stale = uuid::Uuid::new_v4().to_string();
    let (st, v) = send(&s, &token, &order, chunk(&agent, &stale, 1, &["x"])).await;
    assert_eq!(st, 409, "{v}");
    assert_eq!(v["error"]["code"], "reclaimed");
    // Another agent's token for this agent: 403; unknown order: 404.
    let (_, other_token) = s.agent(json!({"name": "other", "labels": ["zz"]})).await;
    let (st, _) = send(&s, &other_token, &order, chunk(&agent, &claim, 1, &["x"])).await;
    assert_eq!(st, 403);
    let unknown = uuid::Uuid::new_v4();
    let (st, v) = send(
        &s,
        &token,
        &unknown.to_string(),
        chunk(&agent, &claim, 1, &["x"]),
    )
    .await;
    assert_eq!(st, 404, "{v}");
    // U+0000 replaced, never a 500; invalid UTF-8 in the body replaced too.
    let (st, v) = send(&s, &token, &order, chunk(&agent, &claim, 1, &["a\u{0}b"])).await;
    assert_eq!(st, 200, "{v}");
    let raw = format!(
        r#"{{"agent_id":"{agent}","claim_id":"{claim}","seq":2,"lines":[{{"stream":"stderr","text":"bad \xFF byte","at":"2026-12-02T10:00:00Z"}}]}}"#
    );
    let mut body = raw.into_bytes();
    let pos = body.windows(4).position(|w| w == b"\\xFF").unwrap();
    body.splice(pos..pos + 4, [0xFFu8]);
    let r = s
        .http
        .post(s.url(&format!("/api/v1/work-orders/{order}/output")))
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let page = read(&s, &order, "").await;
    assert_eq!(
        texts(&page),
        vec!["first", "a\u{FFFD}b", "bad \u{FFFD} byte"]
    );
    // Over 1 MiB: 413 naming the limit.
    let big = "x".repeat(1024 * 1024);
    let (st, v) = send(&s, &token, &order, chunk(&agent, &claim, 3, &[&big])).await;
    assert_eq!(st, 413, "{v}");
    assert!(support::error_message(&v).contains("1048576"), "{v}");
    // A stream name over 253 characters: 400 naming the field.
    let mut c = chunk(&agent, &claim, 3, &["x"]);
    c["lines"][0]["stream"] = json!("s".repeat(254));
    let (st, v) = send(&s, &token, &order, c).await;
    assert_eq!(st, 400, "{v}");
    assert!(
        support::error_message(&v).contains("lines[0].stream"),
        "{v}"
    );
    // After complete, a new chunk is 409; a resent one is answered as the first time.
    complete(&s, &token, &order, &agent, &claim).await;
    let (st, v) = send(&s, &token, &order, chunk(&agent, &claim, 9, &["late"])).await;
    assert_eq!(st, 409, "{v}");
    let (st, v) = send(&s, &token, &order, chunk(&agent, &claim, 0, &["first"])).await;
    assert_eq!((st, v["lines"].clone()), (200, json!(1)));
    // Readable after the order finished; 404 only for an order in neither table.
    let page = read(&s, &order, "").await;
    assert_eq!(page["finished"], true);
    assert_eq!(texts(&page).len(), 3);
    let (st, _) = s
        .admin_get(&format!("/api/v1/work-orders/{unknown}/output"))
        .await;
    assert_eq!(st, 404);
}

#[tokio::test]
async fn the_cap_drops_the_oldest_output_with_a_marker_and_gaps_are_marked() {
    let s = TestServer::start_with_output(OutputSettings {
        cap_bytes: 1000,
        ..OutputSettings::default()
    })
    .await;
    let (agent, token, order, claim) = claimed(&s, "out-c").await;
    let hundred = "y".repeat(100);
    for seq in 0..30 {
        let (st, v) = send(&s, &token, &order, chunk(&agent, &claim, seq, &[&hundred])).await;
        assert_eq!(st, 200, "{v}");
    }
    let page = read(&s, &order, "").await;
    let lines = page["lines"].as_array().unwrap();
    assert_eq!(lines[0]["marker"], "dropped", "{page}");
    // A line costs its text, its stream and a fixed overhead: 8 such lines fit the cap of 1000.
    let per_line = 100 + "stdout".len() as i64 + STORED_LINE_OVERHEAD_BYTES;
    let kept = 1000 / per_line;
    assert_eq!(kept, 8);
    let dropped = (30 - kept) * per_line;
    assert!(
        lines[0]["text"]
            .as_str()
            .unwrap()
            .contains(&format!("{dropped} bytes")),
        "{page}"
    );
    assert_eq!(lines.len() as i64, kept + 1, "{page}");
    // Marker times are the database's, when the chunk was stored, and the same at every read
    // (the agent's lines here carry a time long past).
    let received = |seq: i64| {
        let (order, pool) = (order.clone(), s.pool.clone());
        async move {
            let (at,): (chrono::DateTime<chrono::Utc>,) = sqlx::query_as(
                "SELECT received_at FROM work_order_output WHERE work_order_id = $1::uuid AND seq = $2",
            )
            .bind(&order)
            .bind(seq)
            .fetch_one(&pool)
            .await
            .unwrap();
            serde_json::to_value(at).unwrap()
        }
    };
    assert_eq!(
        lines[0]["at"],
        received(30 - kept).await,
        "the oldest chunk kept: {page}"
    );
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    assert_eq!(
        read(&s, &order, "").await["lines"][0],
        lines[0],
        "read again"
    );
    let (stored,): (i64,) = sqlx::query_as(
        "SELECT sum(bytes)::bigint FROM work_order_output WHERE work_order_id = $1::uuid",
    )
    .bind(&order)
    .fetch_one(&s.pool)
    .await
    .unwrap();
    assert!(stored <= 1000);
    // A reader already past the dropped part sees no marker.
    let after = lines[1]["cursor"].as_i64().unwrap();
    let later = read(&s, &order, &format!("?after={after}")).await;
    assert!(
        later["lines"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["marker"].is_null())
    );
    // A gap reported by the agent comes before that chunk's lines.
    let mut c = chunk(&agent, &claim, 30, &["after the gap"]);
    c["dropped_bytes"] = json!(4096);
    let (st, _) = send(&s, &token, &order, c).await;
    assert_eq!(st, 200);
    let tail = read(&s, &order, "?tail=2").await;
    let lines = tail["lines"].as_array().unwrap();
    assert_eq!(lines[0]["marker"], "gap", "{tail}");
    assert!(lines[0]["text"].as_str().unwrap().contains("4096 bytes"));
    assert_eq!(lines[0]["at"], received(30).await, "{tail}");
    assert_eq!(lines[1]["text"], "after the gap");
    let metrics = s.metrics.encode();
    assert!(
        metrics.contains("pullman_output_dropped_bytes_total{reason=\"gap\"} 4096"),
        "{metrics}"
    );
    assert!(
        // The gap's chunk pushed one more 100-byte chunk out.
        metrics.contains(&format!(
            "pullman_output_dropped_bytes_total{{reason=\"cap\"}} {}",
            dropped + per_line
        )),
        "{metrics}"
    );
}

#[tokio::test]
async fn tail_attempt_and_after_select_lines_and_the_holder_may_read() {
    let s = TestServer::start().await;
    let (agent, token, order, claim) = claimed(&s, "out-d").await;
    send(
        &s,
        &token,
        &order,
        chunk(&agent, &claim, 0, &["a1", "a2", "a3"]),
    )
    .await;
    // The holder of the live claim may read (to resume); another agent may not.
    let (st, v) = s
        .get_as(&format!("/api/v1/work-orders/{order}/output"), &token)
        .await;
    assert_eq!(st, 200, "{v}");
    // Second attempt: a retryable failure, then claimed again.
    let (st, _) = s
        .complete(
            &order,
            &token,
            json!({"agent_id": agent, "claim_id": claim, "success": false}),
        )
        .await;
    assert_eq!(st, 202);
    let (st, v) = s
        .get_as(&format!("/api/v1/work-orders/{order}/output"), &token)
        .await;
    assert_eq!(st, 403, "no live claim any more: {v}");
    sqlx::query("UPDATE work_orders SET next_retry_after = now() WHERE id = $1::uuid")
        .bind(&order)
        .execute(&s.pool)
        .await
        .unwrap();
    let (st, v) = s.claim(&order, &agent, &token).await;
    assert_eq!(st, 200, "{v}");
    let claim2 = v["claim_id"].as_str().unwrap().to_string();
    send(&s, &token, &order, chunk(&agent, &claim2, 0, &["b1", "b2"])).await;
    assert_eq!(
        texts(&read(&s, &order, "").await),
        ["a1", "a2", "a3", "b1", "b2"]
    );
    assert_eq!(
        texts(&read(&s, &order, "?tail=3").await),
        ["a3", "b1", "b2"]
    );
    let second = read(&s, &order, "?attempt=2").await;
    assert_eq!(texts(&second), ["b1", "b2"]);
    assert_eq!(second["lines"][0]["attempt"], 2);
    assert_eq!(second["lines"][0]["claim_id"], claim2.as_str());
    assert_eq!(texts(&read(&s, &order, "?attempt=1&tail=1").await), ["a3"]);
    let all = read(&s, &order, "").await;
    let after = all["lines"][1]["cursor"].as_i64().unwrap();
    assert_eq!(
        texts(&read(&s, &order, &format!("?after={after}")).await),
        ["a3", "b1", "b2"]
    );
    for bad in [
        "?tail=0",
        "?tail=3&after=1",
        "?attempt=0",
        "?after=-1",
        "?limit=0",
        "?tail=3&limit=-5",
        "?follow=true&limit=5",
        "?nope=1",
    ] {
        let (st, v) = s
            .admin_get(&format!("/api/v1/work-orders/{order}/output{bad}"))
            .await;
        assert_eq!(st, 400, "{bad}: {v}");
    }
}
