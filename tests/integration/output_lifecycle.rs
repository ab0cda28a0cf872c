//! Output of running orders (docs/design.md §9, issues #24 and #35) around an order's life,
//! against real PostgreSQL: retention deletes it with the log entry, in batches bounded by its
//! bytes; while the database is away a chunk is answered 503 and stored after; a chunk being
//! uploaded holds its write permit; a stale claim's chunks are refused before and after the
//! reaper. Storing and reading: `output.rs`; following: `output_follow.rs`.

use crate::support;

use std::time::Duration;

use pullman::api::OutputSettings;
use serde_json::{Value, json};
use support::output::{chunk, claimed, complete, read, send, texts};
use support::{TestServer, configmap_order};

#[tokio::test]
async fn retention_deletes_the_output_with_the_log_entry() {
    let s = TestServer::start().await;
    let (agent, token, order, claim) = claimed(&s, "out-g").await;
    send(
        &s,
        &token,
        &order,
        chunk(&agent, &claim, 0, &["kept until retention"]),
    )
    .await;
    complete(&s, &token, &order, &agent, &claim).await;
    let count = || async {
        let (n,): (i64,) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM work_order_output WHERE work_order_id = $1::uuid) + \
                    (SELECT count(*) FROM work_order_output_totals WHERE work_order_id = $1::uuid)",
        )
        .bind(&order)
        .fetch_one(&s.pool)
        .await
        .unwrap();
        n
    };
    assert_eq!(count().await, 2);
    let day = Duration::from_secs(86_400);
    assert_eq!(s.queue.expire_history(day).await.unwrap(), 0);
    assert_eq!(count().await, 2, "within retention the output stays");
    sqlx::query(
        "UPDATE work_order_log SET completed_at = now() - interval '2 days' WHERE id = $1::uuid",
    )
    .bind(&order)
    .execute(&s.pool)
    .await
    .unwrap();
    assert_eq!(s.queue.expire_history(day).await.unwrap(), 1);
    assert_eq!(count().await, 0);
    let (st, _) = s
        .admin_get(&format!("/api/v1/work-orders/{order}/output"))
        .await;
    assert_eq!(st, 404);
}

#[tokio::test]
async fn output_answers_503_while_the_database_is_down_and_is_stored_after() {
    let own = support::own_postgres::OwnPostgres::new();
    let pg = own.start().await;
    let s = own.server(&pg).await;
    let (agent, token, order, claim) = claimed(&s, "out-h").await;
    let (st, _) = send(&s, &token, &order, chunk(&agent, &claim, 0, &["before"])).await;
    assert_eq!(st, 200);
    pg.stop().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for seq in 1..4 {
        let r = s
            .http
            .post(s.url(&format!("/api/v1/work-orders/{order}/output")))
            .bearer_auth(&token)
            .json(&chunk(&agent, &claim, seq, &["while down"]))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 503);
        assert_eq!(r.headers()["retry-after"], "1");
    }
    let _pg = own.start().await;
    support::eventually(
        30,
        "output stored again after PostgreSQL is back",
        || async {
            let (st, _) = send(&s, &token, &order, chunk(&agent, &claim, 1, &["after"])).await;
            (st == 200).then_some(())
        },
    )
    .await;
    assert_eq!(texts(&read(&s, &order, "").await), ["before", "after"]);
}

/// The write bound holds from the first byte of a body: a chunk still being uploaded takes its
/// permit, so bodies being read count against `--max-output-writes`, not only database writes.
#[tokio::test]
async fn a_chunk_being_uploaded_holds_its_write_permit() {
    use tokio::io::AsyncWriteExt;
    let s = TestServer::start_with_output(OutputSettings {
        max_writes: 1,
        ..OutputSettings::default()
    })
    .await;
    let (agent, token, order, claim) = claimed(&s, "out-p").await;
    let body = serde_json::to_vec(&chunk(&agent, &claim, 0, &["slow"])).unwrap();
    let addr = s.base.trim_start_matches("http://").to_string();
    let mut slow = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /api/v1/work-orders/{order}/output HTTP/1.1\r\nHost: {addr}\r\n\
         Authorization: Bearer {token}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    slow.write_all(&body[..10]).await.unwrap();
    slow.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (st, v) = send(&s, &token, &order, chunk(&agent, &claim, 1, &["fast"])).await;
    assert_eq!(st, 429, "the only permit is held by the upload: {v}");
    assert_eq!(v["error"]["code"], "too_many_output_writes");
    // The upload ends: stored, and the permit is free again.
    slow.write_all(&body[10..]).await.unwrap();
    let mut answer = vec![0u8; 1024];
    let n = tokio::io::AsyncReadExt::read(&mut slow, &mut answer)
        .await
        .unwrap();
    assert!(
        answer[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer[..n])
    );
    let (st, v) = send(&s, &token, &order, chunk(&agent, &claim, 1, &["fast"])).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(texts(&read(&s, &order, "").await), ["slow", "fast"]);
    // A JSON array of the fields is no chunk, though serde would read one as the struct.
    let (st, v) = send(&s, &token, &order, json!([agent, claim, 2, null, null, []])).await;
    assert_eq!(
        (st, v["error"]["code"].clone()),
        (422, json!("invalid_body")),
        "{v}"
    );
}

/// A claim that is no longer live cannot add output, whichever way it stopped being live (issue
/// #35): its lease ran out but the reaper has not run yet, and after the reaper released it and
/// another agent claimed the order. The new claim's output is its own attempt.
#[tokio::test]
async fn a_stale_claims_chunks_are_refused_before_and_after_the_reaper() {
    let s = TestServer::start().await;
    let (agent, token) = s.agent(json!({"name": "out-s", "labels": ["out-s"]})).await;
    let order = s.order(configmap_order("out-s")).await;
    let (st, v) = s
        .claim_next(
            &agent,
            &token,
            Some(json!({"max_wait_seconds": 5, "lease_seconds": 5})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let old = v["claim_id"].as_str().unwrap().to_string();
    let (st, v) = send(&s, &token, &order, chunk(&agent, &old, 0, &["before"])).await;
    assert_eq!(st, 200, "{v}");
    // The lease runs out; nothing reaps (this server runs no maintenance).
    tokio::time::sleep(Duration::from_millis(5500)).await;
    let (st, v) = send(&s, &token, &order, chunk(&agent, &old, 1, &["late"])).await;
    assert_eq!(st, 409, "an expired lease, not yet reaped: {v}");
    assert_eq!(v["error"]["code"], "reclaimed", "{v}");

    let (reclaimed, _) = s.queue.reap_stale_claims().await.unwrap();
    assert_eq!(reclaimed, 1);
    let (next, next_token) = s
        .agent(json!({"name": "out-s2", "labels": ["out-s"]}))
        .await;
    let (st, v) = s
        .claim_next(&next, &next_token, Some(json!({"max_wait_seconds": 5})))
        .await;
    assert_eq!((st, v["id"].clone()), (200, json!(order)), "{v}");
    let new = v["claim_id"].as_str().unwrap().to_string();
    let (st, v) = send(&s, &token, &order, chunk(&agent, &old, 1, &["later still"])).await;
    assert_eq!(st, 409, "the reaped claim, the order claimed again: {v}");
    let (st, v) = send(&s, &next_token, &order, chunk(&next, &new, 0, &["after"])).await;
    assert_eq!(st, 200, "{v}");
    let page = read(&s, &order, "").await;
    assert_eq!(texts(&page), vec!["before", "after"]);
    let attempts: Vec<Value> = page["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["attempt"].clone())
        .collect();
    assert_eq!(attempts, vec![json!(1), json!(2)]);
}

/// Retention deletes in batches bounded by the bytes of output too (issue #35): with a budget of
/// one order's output, each batch takes one entry (the first always goes, however large), and the
/// next batch takes the next; an entry without output adds nothing to a batch.
#[tokio::test]
async fn retention_batches_are_bounded_by_the_bytes_of_output() {
    let s = TestServer::start().await;
    let text = "r".repeat(5000);
    let mut orders = Vec::new();
    for i in 0..3 {
        let (agent, token, order, claim) = claimed(&s, &format!("out-r{i}")).await;
        let (st, v) = send(&s, &token, &order, chunk(&agent, &claim, 0, &[&text])).await;
        assert_eq!(st, 200, "{v}");
        complete(&s, &token, &order, &agent, &claim).await;
        orders.push(order);
    }
    let quiet = s.order(configmap_order("nobody")).await;
    let (st, _) = s.cancel(&quiet).await;
    assert_eq!(st, 200);
    // Oldest first: the three with output, then the one without.
    for (i, id) in orders.iter().chain([&quiet]).enumerate() {
        sqlx::query(
            "UPDATE work_order_log SET completed_at = now() - interval '2 days' \
             + make_interval(secs => $2) WHERE id = $1::uuid",
        )
        .bind(id)
        .bind(i as f64)
        .execute(&s.pool)
        .await
        .unwrap();
    }
    let left = || async {
        let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM work_order_log")
            .fetch_one(&s.pool)
            .await
            .unwrap();
        n
    };
    let day = chrono::Utc::now() - chrono::Duration::days(1);
    // As the cap counts it: the text, the stream and the per-line overhead.
    let (one_order,): (i64,) = sqlx::query_as(
        "SELECT stored_bytes FROM work_order_output_totals WHERE work_order_id = $1::uuid",
    )
    .bind(&orders[0])
    .fetch_one(&s.pool)
    .await
    .unwrap();
    assert!(one_order >= 5000, "{one_order}");
    assert_eq!(
        s.queue
            .expire_log_batch(day, 1000, one_order)
            .await
            .unwrap(),
        1
    );
    assert_eq!(left().await, 3);
    assert_eq!(
        s.queue
            .expire_log_batch(day, 1000, one_order + 1)
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        left().await,
        1,
        "the third with output went, the quiet one is next"
    );
    assert_eq!(
        s.queue
            .expire_log_batch(day, 1000, one_order)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        s.queue
            .expire_log_batch(day, 1000, one_order)
            .await
            .unwrap(),
        0
    );
}
