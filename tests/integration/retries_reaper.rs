//! Retries (docs/design.md §2), the reaper, leases, heartbeats, fencing and cancellation, against a
//! real PostgreSQL. Time is moved by rewriting the claim's deadline or lease in the database, the
//! way the clock would; the reaper pass is called directly.

use crate::support;

use chrono::{DateTime, Utc};
use reqwest::Method;
use serde_json::{Value, json};
use support::TestServer;
use support::agent::Agent;
use support::queue::orphan_claims;

fn order_with(max_retries: i64, backoff: i64) -> Value {
    json!({
        "work_type": "custom",
        "yaml_content": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: r\n",
        "max_retries": max_retries,
        "backoff_seconds": backoff,
        "targeting": {"labels": ["r"]},
    })
}

/// Claims `order` by id as `a` with lease `lease` (`null`: the default); the claim.
async fn claim(a: &Agent<'_>, order: &str, lease: Option<i64>) -> Value {
    let path = format!("/api/v1/work-orders/{order}/claim");
    let body = json!({"agent_id": a.id, "lease_seconds": lease});
    let (st, v) = a
        .api
        .call(Method::POST, &path, Some(&a.token), Some(body))
        .await;
    assert_eq!(st, 200, "{v}");
    v
}

/// Claims `order` (the default lease) and completes it with `body`; the complete's answer.
async fn claim_and_complete(a: &Agent<'_>, order: &str, body: Value) -> (u16, Value) {
    claim(a, order, None).await;
    a.complete(order, body).await
}

/// The order as the admin sees it while it is active.
async fn active(s: &TestServer, order: &str) -> Value {
    s.admin_get(&format!("/api/v1/work-orders/{order}")).await.1
}

/// Runs `sql`, an UPDATE with `$1` the id of an order or agent: time moved in the database, as
/// the clock would move it.
async fn exec(s: &TestServer, sql: &str, id: &str) {
    sqlx::query(sql).bind(id).execute(&s.pool).await.unwrap();
}

/// Makes a backing-off order due now, as time passing would.
async fn make_due(s: &TestServer, order: &str) {
    exec(
        s,
        "UPDATE work_orders SET next_retry_after = now() WHERE id = $1::uuid",
        order,
    )
    .await;
}

fn ts(v: &Value) -> DateTime<Utc> {
    v.as_str().unwrap().parse().unwrap()
}

#[tokio::test]
async fn retries_back_off_exponentially_and_stop_at_max_retries() {
    let s = TestServer::start().await;
    let a = Agent::register(&s, json!({"name": "r", "labels": ["r"]})).await;
    for max_retries in [0i64, 1, 3] {
        let o = s.order(order_with(max_retries, 10)).await;
        for k in 1..=max_retries {
            let (st, v) = claim_and_complete(
                &a,
                &o,
                json!({"success": false, "message": format!("boom {k}")}),
            )
            .await;
            assert_eq!(st, 202, "{v}");
            assert_eq!(v["status"], "retry_scheduled");
            let got = active(&s, &o).await;
            assert_eq!(got["status"], "RETRY_PENDING");
            assert_eq!(got["retry_count"], k);
            assert_eq!(got["last_error"], format!("boom {k}"));
            let delay = (ts(&got["next_retry_after"]) - ts(&got["last_error_at"])).num_seconds();
            assert_eq!(delay, 10 * (1 << (k - 1)), "backoff for attempt {k}");
            assert_eq!(ts(&v["next_retry_after"]), ts(&got["next_retry_after"]));
            // Backing off: not claimable yet.
            let (st, v) = a.claim(&o).await;
            assert_eq!(st, 409, "{v}");
            assert_eq!(v["error"]["code"], "backing_off");
            make_due(&s, &o).await;
        }
        let (st, v) =
            claim_and_complete(&a, &o, json!({"success": false, "message": "final"})).await;
        assert_eq!(st, 200, "max_retries {max_retries}: {v}");
        assert_eq!(v["outcome"], "failed");
        assert_eq!(v["retry_count"], max_retries);
        assert_eq!(v["last_error"], "final");
        let (st, v) = s.admin_get(&format!("/api/v1/work-orders/{o}")).await;
        assert_eq!(st, 404);
        assert_eq!(v["error"]["code"], "finished");
    }
}

#[tokio::test]
async fn non_retryable_failure_goes_straight_to_the_log_and_success_returns_the_entry() {
    let s = TestServer::start().await;
    let a = Agent::register(&s, json!({"name": "r", "labels": ["r"]})).await;
    let o = s.order(order_with(3, 10)).await;
    let (st, v) = claim_and_complete(
        &a,
        &o,
        json!({"success": false, "retryable": false, "message": "bad"}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["outcome"], "failed");
    assert_eq!(v["success"], false);
    assert_eq!(v["retry_count"], 0);
    assert_eq!(
        orphan_claims(&s.pool).await,
        0,
        "the claim left with its order"
    );

    let o = s.order(order_with(3, 10)).await;
    let (st, v) = claim_and_complete(&a, &o, json!({"success": true, "message": "done"})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["outcome"], "succeeded");
    assert_eq!(v["message"], "done");
    assert_eq!(v["claimed_by"], json!(a.id));
    let (st, log) = s.admin_get(&format!("/api/v1/work-order-log/{o}")).await;
    assert_eq!(st, 200);
    assert!(log["yaml_content"].is_string());
}

#[tokio::test]
async fn huge_backoff_never_overflows() {
    let s = TestServer::start().await;
    let a = Agent::register(&s, json!({"name": "r", "labels": ["r"]})).await;
    let o = s.order(order_with(100, 86_400)).await;
    exec(
        &s,
        "UPDATE work_orders SET retry_count = 99 WHERE id = $1::uuid",
        &o,
    )
    .await;
    claim(&a, &o, None).await;
    let (st, v) = a.complete(&o, json!({"success": false})).await;
    assert_eq!(st, 202, "{v}");
    let got = active(&s, &o).await;
    assert_eq!(got["retry_count"], 100);
    let delay = (ts(&got["next_retry_after"]) - ts(&got["last_error_at"])).num_seconds();
    assert_eq!(delay, 86_400, "capped at 24 h");
}

#[tokio::test]
async fn reaper_returns_timed_out_and_lease_expired_claims_to_pending() {
    let s = TestServer::start().await;
    let a = Agent::register(&s, json!({"name": "r", "labels": ["r"]})).await;
    let timed_out = s.order(order_with(3, 10)).await;
    let leased = s.order(order_with(3, 10)).await;
    let alive = s.order(order_with(3, 10)).await;
    let first = claim(&a, &timed_out, None).await;
    claim(&a, &leased, Some(30)).await;
    claim(&a, &alive, Some(30)).await;
    exec(
        &s,
        "UPDATE work_orders SET retry_count = 1 WHERE id = $1::uuid",
        &timed_out,
    )
    .await;
    // claim_timeout passes for one; the lease runs out for another.
    exec(&s, "UPDATE work_order_claims SET deadline = now() - interval '1 second' WHERE work_order_id = $1::uuid", &timed_out).await;
    exec(&s, "UPDATE work_order_claims SET lease_expires_at = now() - interval '1 second' WHERE work_order_id = $1::uuid", &leased).await;
    let report = s.queue.maintain().await.unwrap();
    assert_eq!(report.reclaimed, 2);
    for (o, retries) in [(&timed_out, 1), (&leased, 0)] {
        let v = active(&s, o).await;
        assert_eq!(v["status"], "PENDING");
        assert_eq!(v["retry_count"], retries, "retry_count unchanged");
        assert_eq!(v["reclaim_count"], 1);
        assert!(
            v["claimed_by"].is_null() && v["claim_id"].is_null() && v["lease_expires_at"].is_null()
        );
    }
    let v = active(&s, &alive).await;
    assert_eq!(v["status"], "CLAIMED", "a live lease is left alone");

    // The superseded claim's heartbeat and complete are refused and change nothing.
    let second = claim(&a, &timed_out, None).await;
    assert_ne!(
        first["claim_id"], second["claim_id"],
        "a fresh fencing token per claim"
    );
    let (st, v) = a
        .heartbeat(&timed_out, json!({"claim_id": first["claim_id"]}))
        .await;
    assert_eq!(st, 409, "{v}");
    assert_eq!(v["error"]["code"], "reclaimed");
    let (st, v) = a
        .complete(
            &timed_out,
            json!({"claim_id": first["claim_id"], "success": true}),
        )
        .await;
    assert_eq!(st, 409, "{v}");
    let v = active(&s, &timed_out).await;
    assert_eq!(v["status"], "CLAIMED");
    assert_eq!(v["claim_id"], second["claim_id"]);
}

#[tokio::test]
async fn a_late_result_from_another_agent_is_refused() {
    let s = TestServer::start().await;
    let a = Agent::register(&s, json!({"name": "a", "labels": ["r"]})).await;
    let b = Agent::register(&s, json!({"name": "b", "labels": ["r"]})).await;
    let o = s.order(order_with(3, 10)).await;
    claim(&a, &o, Some(30)).await;
    sqlx::query("UPDATE work_order_claims SET lease_expires_at = now() - interval '1 second'")
        .execute(&s.pool)
        .await
        .unwrap();
    // Expired but not yet reaped: the holder's result is already refused.
    let (st, v) = a.complete(&o, json!({"success": true})).await;
    assert_eq!(st, 409, "{v}");
    assert_eq!(v["error"]["code"], "reclaimed");
    s.queue.maintain().await.unwrap();
    claim(&b, &o, Some(30)).await;
    let (st, v) = a.complete(&o, json!({"success": true})).await;
    assert_eq!(st, 409, "{v}");
    assert_eq!(v["error"]["code"], "reclaimed");
    let (st, v) = b
        .complete(&o, json!({"success": true, "message": "b did it"}))
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["claimed_by"], json!(b.id));
    let (st, v) = b.complete(&o, json!({"success": true})).await;
    assert_eq!(st, 409, "a second complete is refused: {v}");
    assert_eq!(v["error"]["code"], "not_claim_holder");
}

#[tokio::test]
async fn reclaim_bound_sends_the_order_to_the_log_as_failed() {
    let s = TestServer::start().await;
    let a = Agent::register(&s, json!({"name": "r", "labels": ["r"]})).await;
    let mut body = order_with(3, 10);
    body["max_reclaims"] = json!(2);
    let o = s.order(body).await;
    for round in 0..3 {
        claim(&a, &o, None).await;
        sqlx::query("UPDATE work_order_claims SET deadline = now() - interval '1 second'")
            .execute(&s.pool)
            .await
            .unwrap();
        let r = s.queue.maintain().await.unwrap();
        if round < 2 {
            assert_eq!(r.reclaimed, 1);
        } else {
            assert_eq!(r.reclaims_exhausted, 1);
        }
    }
    let (st, v) = s.admin_get(&format!("/api/v1/work-order-log/{o}")).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["outcome"], "failed");
    assert_eq!(v["message"], "no agent completed it within 3 claims");
    assert_eq!(v["reclaim_count"], 2);
    assert_eq!(
        orphan_claims(&s.pool).await,
        0,
        "the claim left with its order"
    );
    let (st, v) = a.heartbeat(&o, json!({})).await;
    assert_eq!(st, 409);
    assert_eq!(v["error"]["code"], "reclaimed");
}

#[tokio::test]
async fn heartbeats_keep_a_lease_alive_through_reaper_passes() {
    let s = TestServer::start().await;
    let a = Agent::register(&s, json!({"name": "r", "labels": ["r"]})).await;
    let o = s.order(order_with(3, 10)).await;
    let c = claim(&a, &o, Some(5)).await;
    let first_expiry = ts(&c["lease_expires_at"]);
    for _ in 0..4 {
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        let (st, v) = a.heartbeat(&o, json!({"claim_id": c["claim_id"]})).await;
        assert_eq!(st, 200, "{v}");
        assert!(ts(&v["lease_expires_at"]) > first_expiry);
        assert_eq!(s.queue.maintain().await.unwrap().reclaimed, 0);
    }
    // 8 s later, past the first 5 s lease, the claim still holds.
    let v = active(&s, &o).await;
    assert_eq!(v["status"], "CLAIMED");
    // Without heartbeats the lease runs out for real.
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    assert_eq!(s.queue.maintain().await.unwrap().reclaimed, 1);
}

#[tokio::test]
async fn a_lease_never_extends_past_the_claim_timeout() {
    let s = TestServer::start().await;
    let a = Agent::register(&s, json!({"name": "r", "labels": ["r"]})).await;
    let mut body = order_with(3, 10);
    body["claim_timeout_seconds"] = json!(60);
    let o = s.order(body).await;
    let c = claim(&a, &o, Some(3600)).await;
    let claimed_at = ts(&c["claimed_at"]);
    assert_eq!((ts(&c["lease_expires_at"]) - claimed_at).num_seconds(), 60);
    let (_, v) = a.heartbeat(&o, json!({})).await;
    assert_eq!((ts(&v["lease_expires_at"]) - claimed_at).num_seconds(), 60);
    assert_eq!(ts(&v["claim_expires_at"]), ts(&v["lease_expires_at"]));
}

#[tokio::test]
async fn cancel_of_a_claimed_order_answers_the_next_heartbeat_with_cancelled() {
    let s = TestServer::start().await;
    let a = Agent::register(&s, json!({"name": "r", "labels": ["r"]})).await;
    let o = s.order(order_with(3, 10)).await;
    let c = claim(&a, &o, Some(30)).await;
    let (st, v) = s.cancel(&o).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["outcome"], "cancelled");
    assert_eq!(
        orphan_claims(&s.pool).await,
        0,
        "the claim left with its order"
    );
    let (st, v) = a.heartbeat(&o, json!({"claim_id": c["claim_id"]})).await;
    assert_eq!(st, 409, "{v}");
    assert_eq!(v["error"]["code"], "cancelled");
    let (st, v) = a.complete(&o, json!({"success": true})).await;
    assert_eq!(st, 409);
    assert_eq!(v["error"]["code"], "cancelled");
    let (_, v) = s.admin_get(&format!("/api/v1/work-order-log/{o}")).await;
    assert_eq!(
        v["outcome"], "cancelled",
        "the late complete changed nothing"
    );
    let (st, v) = s.cancel(&o).await;
    assert_eq!(st, 409);
    assert_eq!(v["error"]["code"], "already_finished");
}

#[tokio::test]
async fn due_retries_are_promoted_and_wake_long_polls() {
    let s = std::sync::Arc::new(TestServer::start().await);
    let a = Agent::register(&s, json!({"name": "r", "labels": ["r"]})).await;
    let o = s.order(order_with(3, 10)).await;
    claim(&a, &o, None).await;
    let (st, _) = a.complete(&o, json!({"success": false})).await;
    assert_eq!(st, 202);
    let waiter = {
        let (s, a, tok) = (s.clone(), a.id.clone(), a.token.clone());
        tokio::spawn(async move {
            s.claim_next(&a, &tok, Some(json!({"max_wait_seconds": 15})))
                .await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    make_due(&s, &o).await;
    assert_eq!(s.queue.maintain().await.unwrap().promoted, 1);
    let (st, v) = waiter.await.unwrap();
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["id"], json!(o));
    assert_eq!(v["retry_count"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_is_claimable_when_due_not_at_the_next_maintenance_tick() {
    // Maintenance at serve's default interval; its first pass runs before the retry exists.
    let s = std::sync::Arc::new(TestServer::start().await);
    tokio::spawn(pullman::queue::run_maintenance(
        s.queue.clone(),
        std::time::Duration::from_secs(10),
        None,
        s.shutdown.clone(),
        |_| {},
    ));
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let a = Agent::register(&s, json!({"name": "r", "labels": ["r"]})).await;
    let o = s.order(order_with(3, 1)).await;
    claim(&a, &o, None).await;
    let (st, v) = a.complete(&o, json!({"success": false})).await;
    assert_eq!(st, 202, "{v}");
    let failed_at = std::time::Instant::now();
    // An agent long-polling for work gets the retry at its time (1 s), not up to 10 s later.
    let (st, v) = a.claim_next(15).await;
    let took = failed_at.elapsed();
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["id"], json!(o));
    assert!(
        took < std::time::Duration::from_millis(2500),
        "claimed {took:?} after the failure"
    );
}

/// A retirement cut short after its first transaction (the agent marked retired, its claim still
/// held, as when the server dies between the two): the next maintenance pass returns the claim
/// to `PENDING` as the retirement would have, a `released` attempt and no reclaim counted, before
/// the reaper could take it as a reclaim.
#[tokio::test]
async fn maintenance_releases_what_a_retirement_cut_short_left_held() {
    let s = TestServer::start().await;
    let agent = Agent::register(&s, json!({"name": "cut-short", "labels": ["cut-short"]})).await;
    let order = s.order(support::configmap_order("cut-short")).await;
    claim(&agent, &order, Some(60)).await;
    // The first transaction of a retirement, alone, a minute ago (maintenance leaves a
    // retirement of the last 10 s to finish by itself).
    exec(
        &s,
        "UPDATE agents SET retired_at = now() - interval '1 minute' WHERE id = $1::uuid",
        &agent.id,
    )
    .await;
    let report = s.queue.maintain().await.unwrap();
    assert_eq!(report.released_from_retired, 1, "{report:?}");
    assert_eq!(report.reclaimed, 0, "{report:?}");
    let (st, v) = s.admin_get(&format!("/api/v1/work-orders/{order}")).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["status"], "PENDING", "{v}");
    assert_eq!(v["reclaim_count"], 0, "{v}");
    let ended: Vec<String> = v["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["result"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(ended, ["released"], "{v}");
    // Nothing left to release on the next pass.
    assert_eq!(s.queue.maintain().await.unwrap().released_from_retired, 0);
}
