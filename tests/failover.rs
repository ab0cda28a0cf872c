//! The database failing over under a running server (issue #41, docs/design.md §5): the address
//! the server connects to leads for a while to a read-only standby (a demoted primary), then to a
//! promoted one. The server never holds a connection to the standby, answers `503` (never `500`)
//! meanwhile, says why in `/readyz`, and goes on by itself once the standby is promoted.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::eventually;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_behind_the_address_is_refused_until_promoted_then_work_goes_on() {
    let own = support::own_postgres::OwnPostgres::new();
    let pg = own.start().await;
    let s = own.server(&pg).await;
    let (agent, token) = s
        .agent(json!({"name": "failover", "labels": ["failover"]}))
        .await;
    let before = s.order(support::configmap_order("failover")).await;

    // The same data directory and port, now a hot standby: it answers, read-only.
    pg.stop().await.unwrap();
    std::fs::write(own.data_dir().join("standby.signal"), "").unwrap();
    let standby = own.start().await;

    let readyz = |s: &support::TestServer| {
        let (http, url) = (s.http.clone(), s.url("/readyz"));
        async move {
            let r = http.get(url).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    eventually(30, "/readyz to name the standby", || async {
        let (st, body) = readyz(&s).await;
        (st == 503 && body.contains("read-only standby")).then_some(())
    })
    .await;
    for _ in 0..5 {
        let (st, v) = s
            .admin_post("/api/v1/work-orders", support::configmap_order("failover"))
            .await;
        assert_eq!(st, 503, "a create against a standby: {v}");
        assert_eq!(v["error"]["code"], "database_unavailable", "{v}");
        let (st, v) = s
            .claim_next(&agent, &token, Some(json!({"max_wait_seconds": 0})))
            .await;
        assert_eq!(st, 503, "a claim against a standby: {v}");
    }

    // A connection that reaches the standby is never handed out: the pool's own check, for an
    // address that leads there before anything noticed an outage.
    let refused = pullman::serve::pool_options(1)
        .acquire_timeout(Duration::from_secs(2))
        .connect_with(standby.options())
        .await;
    assert!(refused.is_err(), "a pool connected to a standby");

    // Promoted in place, as CloudNativePG's new primary: no restart of the server.
    let mut conn = sqlx::ConnectOptions::connect(&standby.options())
        .await
        .unwrap();
    let (promoted,): (bool,) = sqlx::query_as("SELECT pg_promote(true, 30)")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(promoted, "pg_promote");
    eventually(
        30,
        "the server to answer again on the promoted primary",
        || async {
            let (st, _) = readyz(&s).await;
            (st == 200).then_some(())
        },
    )
    .await;
    let (st, v): (u16, Value) = s
        .claim_next(&agent, &token, Some(json!({"max_wait_seconds": 5})))
        .await;
    assert_eq!(st, 200, "claim after the promotion: {v}");
    assert_eq!(
        v["id"],
        before.as_str(),
        "the order from before the failover"
    );
    let after = s.order(support::configmap_order("failover")).await;
    assert_ne!(after, before);
}
