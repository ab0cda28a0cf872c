//! Following an order's output (docs/design.md §9, issues #24, #35), against real PostgreSQL: 100
//! followers to the end, a follower that leaves, the follower limit, and followers woken by
//! NOTIFY for a line and for the order's finish.

use crate::support;

use std::time::{Duration, Instant};

use pullman::api::OutputSettings;
use serde_json::{Value, json};
use support::output::{chunk, claimed, complete, follow, read, send};
use support::{ADMIN_TOKEN, TestServer};

/// Waits up to `secs` seconds (`what` naming the wait) for the server's followers gauge
/// (`pullman_output_followers`) to read `n`.
async fn followers_gauge(s: &TestServer, n: usize, secs: u64, what: &str) {
    let want = format!("pullman_output_followers {n}");
    support::eventually(secs, what, || async {
        s.metrics.encode().contains(&want).then_some(())
    })
    .await;
}

#[tokio::test]
async fn followers_see_every_line_once_in_order_and_end_when_the_order_finishes() {
    let s = TestServer::start().await;
    let (agent, token, order, claim) = claimed(&s, "out-e").await;
    send(&s, &token, &order, chunk(&agent, &claim, 0, &["before"])).await;
    let followers: Vec<_> = (0..100)
        .map(|_| tokio::spawn(follow(s.base.clone(), order.clone())))
        .collect();
    followers_gauge(&s, 100, 10, "100 followers connected").await;
    let mut want = vec!["before".to_string()];
    for seq in 1..=50 {
        let batch: Vec<String> = (0..10).map(|i| format!("{seq}-{i}")).collect();
        let refs: Vec<&str> = batch.iter().map(String::as_str).collect();
        let (st, v) = send(&s, &token, &order, chunk(&agent, &claim, seq, &refs)).await;
        assert_eq!(st, 200, "{v}");
        want.extend(batch);
    }
    complete(&s, &token, &order, &agent, &claim).await;
    for f in followers {
        let got = tokio::time::timeout(Duration::from_secs(20), f)
            .await
            .expect("a follower ends once the order finished")
            .unwrap();
        assert_eq!(got, want);
    }
    followers_gauge(&s, 0, 5, "the followers gauge back to 0").await;
}

#[tokio::test]
async fn a_follower_that_disconnects_frees_its_resources_at_once() {
    let s = TestServer::start().await;
    let (agent, token, order, claim) = claimed(&s, "out-f").await;
    send(&s, &token, &order, chunk(&agent, &claim, 0, &["one"])).await;
    let r = s
        .http
        .get(s.url(&format!(
            "/api/v1/work-orders/{order}/output?follow=true&tail=5"
        )))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    let mut r = r;
    let first = r.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("\"one\""));
    assert!(s.metrics.encode().contains("pullman_output_followers 1"));
    drop(r);
    followers_gauge(&s, 0, 3, "the followers gauge to drop").await;
}

/// `serve --max-output-followers`: past it a new follower is refused with `503` and
/// `Retry-After`; a follower that leaves gives its place back.
#[tokio::test]
async fn followers_past_the_limit_are_told_to_come_back() {
    let s = TestServer::start_with_output(OutputSettings {
        max_followers: 1,
        ..OutputSettings::default()
    })
    .await;
    let (_, _, order, _) = claimed(&s, "out-f").await;
    let url = s.url(&format!("/api/v1/work-orders/{order}/output?follow=true"));
    let http = reqwest::Client::new();
    let follow = || http.get(&url).bearer_auth(ADMIN_TOKEN).send();
    let first = follow().await.unwrap();
    assert_eq!(first.status(), 200);
    let refused = follow().await.unwrap();
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "5");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_many_followers", "{body}");
    // Pages are not followers: still served.
    let page = read(&s, &order, "").await;
    assert_eq!(page["lines"], json!([]), "{page}");
    drop(first);
    support::eventually(5, "a follower's place given back", || async {
        (follow().await.unwrap().status() == 200).then_some(())
    })
    .await;
}

/// Followers wake on NOTIFY, not on a poll (docs/design.md §9, issue #35): a stored line reaches an
/// idle follower well within the old 500 ms poll, and the finish of a followed order ends its
/// stream at once (the safety re-read is a minute, so without the finish NOTIFY this test waits
/// out its bound and fails); the follower's row is gone after its stream ends.
#[tokio::test]
async fn idle_followers_wake_on_notify_for_a_line_and_for_the_finish() {
    let s = TestServer::start().await;
    let (agent, token, order, claim) = claimed(&s, "out-n").await;
    let mut r = s
        .http
        .get(s.url(&format!("/api/v1/work-orders/{order}/output?follow=true")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    support::eventually(5, "the follower's row", || async {
        let (n,): (i64,) =
            sqlx::query_as("SELECT count(*) FROM output_followers WHERE work_order_id = $1::uuid")
                .bind(&order)
                .fetch_one(&s.pool)
                .await
                .unwrap();
        (n == 1).then_some(())
    })
    .await;
    // Idle for longer than the old poll: nothing is read meanwhile.
    tokio::time::sleep(Duration::from_millis(700)).await;
    for seq in 0..3 {
        let sent = Instant::now();
        let (st, v) = send(&s, &token, &order, chunk(&agent, &claim, seq, &["ping"])).await;
        assert_eq!(st, 200, "{v}");
        let got = tokio::time::timeout(Duration::from_secs(5), r.chunk())
            .await
            .expect("the line arrives")
            .unwrap()
            .unwrap();
        assert!(String::from_utf8_lossy(&got).contains("\"ping\""));
        let took = sent.elapsed();
        assert!(
            took < Duration::from_millis(250),
            "a stored line reached the follower {took:?} after it was sent"
        );
    }
    let finished = Instant::now();
    complete(&s, &token, &order, &agent, &claim).await;
    let end = tokio::time::timeout(Duration::from_secs(5), r.chunk())
        .await
        .expect("the stream ends within seconds of the finish, not at the minute's re-read")
        .unwrap();
    assert!(end.is_none(), "a clean end");
    assert!(
        finished.elapsed() < Duration::from_secs(2),
        "{:?}",
        finished.elapsed()
    );
    support::eventually(5, "the follower's row deleted", || async {
        let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM output_followers")
            .fetch_one(&s.pool)
            .await
            .unwrap();
        (n == 0).then_some(())
    })
    .await;
}
