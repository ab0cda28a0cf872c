//! Faults and bad input (issue #14, docs/design.md §5 "Retry safety"): text PostgreSQL cannot store,
//! creates raced by fast agents, retried creates and completes, connections killed under load, a
//! database that is down, YAML built to stall the parser, and the log's retention.

use crate::support;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{ADMIN_TOKEN, TestServer, configmap_order, eventually};

/// A claim-next by `agent` that must hand out an order; returns it.
async fn claim_one(s: &TestServer, agent: &str, token: &str) -> Value {
    let (st, v) = s
        .claim_next(agent, token, Some(json!({"max_wait_seconds": 5})))
        .await;
    assert_eq!(st, 200, "claim-next: {v}");
    v
}

async fn complete(s: &TestServer, token: &str, order: &str, body: Value) -> (u16, Value) {
    s.complete(order, token, body).await
}

#[tokio::test]
async fn text_with_nul_is_stored_without_it_and_long_messages_are_cut() {
    let s = TestServer::start().await;
    // Names, labels, annotations and tenants reach text and jsonb columns.
    let (agent, token) = s
        .agent(json!({"name": "nul\u{0}agent", "labels": ["l\u{0}1"],
            "annotations": {"k\u{0}": "v\u{0}"}, "tenant": "t\u{0}"}))
        .await;
    let (st, v) = s.admin_get(&format!("/api/v1/agents/{agent}")).await;
    assert_eq!(st, 200);
    assert_eq!(v["name"], "nulagent");
    assert_eq!(v["labels"], json!(["l1"]));
    assert_eq!(v["annotations"], json!({"k": "v"}));
    assert_eq!(v["tenant"], "t");

    let (st, order) = s
        .admin_post("/api/v1/work-orders", json!({
                "work_type": "custom",
                "tenant": "t\u{0}",
                "yaml_content": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: n\u{0}ul\ndata:\n  a: b\n",
                "targeting": {"labels": ["l\u{0}1"], "agent_names": ["nul\u{0}agent"]}
            }))
        .await;
    assert_eq!(st, 201, "{order}");
    assert_eq!(order["status"], "PENDING");
    assert!(
        order["yaml_content"]
            .as_str()
            .unwrap()
            .contains("name: nul\n")
    );
    let id = order["id"].as_str().unwrap();

    // The order is eligible for the agent as stored: the cleaned label and name match.
    let claimed = claim_one(&s, &agent, &token).await;
    assert_eq!(claimed["id"], id);
    // A complete whose message holds NUL (container logs do) finishes the order: a 500 here
    // left it claimed until the reaper handed it out again.
    let (st, entry) = complete(
        &s,
        &token,
        id,
        json!({"agent_id": agent, "claim_id": claimed["claim_id"], "success": false,
            "retryable": false, "message": "exit 1\u{0}\u{0} done"}),
    )
    .await;
    assert_eq!(st, 200, "{entry}");
    assert_eq!(entry["message"], "exit 1 done");
    assert_eq!(entry["last_error"], "exit 1 done");

    // Over 64 KiB: cut at a character boundary (ü is two bytes) with a marker, not refused.
    let mut body = configmap_order("l1");
    body["tenant"] = json!("t");
    let o2 = s.order(body).await;
    let c2 = claim_one(&s, &agent, &token).await;
    assert_eq!(c2["id"], o2);
    let long = "ü".repeat(40 * 1024); // 80 KiB
    let (st, entry) = complete(
        &s,
        &token,
        &o2,
        json!({"agent_id": agent, "claim_id": c2["claim_id"], "success": true, "message": long}),
    )
    .await;
    assert_eq!(st, 200, "{entry}");
    let stored = entry["message"].as_str().unwrap();
    assert!(stored.len() <= pullman::queue::text::MAX_MESSAGE_BYTES);
    assert!(
        stored.ends_with(pullman::queue::text::CUT_MARKER),
        "marker missing"
    );
    assert!(stored.starts_with(&"ü".repeat(1000)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn create_answers_with_what_it_inserted_while_fast_agents_take_the_orders() {
    let s = Arc::new(TestServer::start().await);
    let stop = Arc::new(AtomicBool::new(false));
    // Agents that long-poll and complete at once: they take an order before its creator reads
    // it back, which used to make the create answer 500 "vanished" or report CLAIMED.
    let mut agents = Vec::new();
    for i in 0..4 {
        let (agent, token) = s
            .agent(json!({"name": format!("fast-{i}"), "labels": ["race"]}))
            .await;
        let (s, stop) = (s.clone(), stop.clone());
        agents.push(tokio::spawn(async move {
            let mut done = 0;
            while !stop.load(Ordering::Relaxed) {
                let (st, v) = s
                    .claim_next(&agent, &token, Some(json!({"max_wait_seconds": 1})))
                    .await;
                if st == 200 {
                    let (st, _) = complete(
                        &s,
                        &token,
                        v["id"].as_str().unwrap(),
                        json!({"agent_id": agent, "claim_id": v["claim_id"], "success": true}),
                    )
                    .await;
                    assert_eq!(st, 200);
                    done += 1;
                }
            }
            done
        }));
    }
    let mut creators = Vec::new();
    for _ in 0..8 {
        let s = s.clone();
        creators.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for _ in 0..40 {
                let (st, v) = s
                    .admin_post("/api/v1/work-orders", configmap_order("race"))
                    .await;
                assert_eq!(st, 201, "create answered {st}: {v}");
                assert_eq!(
                    v["status"], "PENDING",
                    "the answer is what was created: {v}"
                );
                assert!(v["claim_id"].is_null() && v["claimed_by"].is_null(), "{v}");
                ids.push(v["id"].as_str().unwrap().to_string());
            }
            ids
        }));
    }
    let mut created = HashSet::new();
    for c in creators {
        created.extend(c.await.unwrap());
    }
    assert_eq!(created.len(), 320);
    eventually(60, "every created order in the log", || async {
        let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM work_order_log")
            .fetch_one(&s.pool)
            .await
            .unwrap();
        (n == 320).then_some(())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut completed = 0;
    for a in agents {
        completed += a.await.unwrap();
    }
    assert_eq!(completed, 320, "each order completed exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_create_repeated_with_its_idempotency_key_returns_the_same_order() {
    let s = Arc::new(TestServer::start().await);
    let post = |key: &'static str, body: Value| {
        let s = s.clone();
        async move {
            let r = s
                .http
                .post(s.url("/api/v1/work-orders"))
                .bearer_auth(ADMIN_TOKEN)
                .header("Idempotency-Key", key)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let replayed = r.headers().get("idempotent-replayed").is_some();
            (status, replayed, r.json::<Value>().await.unwrap())
        }
    };
    let (st, replayed, first) = post("key-1", configmap_order("idem")).await;
    assert_eq!((st, replayed), (201, false), "{first}");
    let (st, replayed, again) = post("key-1", configmap_order("idem")).await;
    assert_eq!((st, replayed), (201, true), "{again}");
    assert_eq!(again, first, "the recorded answer, byte for byte");

    // Sixteen at once with one new key: one order.
    let racers: Vec<_> = (0..16)
        .map(|_| tokio::spawn(post("key-2", configmap_order("idem"))))
        .collect();
    let mut ids = HashSet::new();
    for r in racers {
        let (st, _, v) = r.await.unwrap();
        assert_eq!(st, 201, "{v}");
        ids.insert(v["id"].as_str().unwrap().to_string());
    }
    assert_eq!(ids.len(), 1, "one order for one key: {ids:?}");
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM work_orders")
        .fetch_one(&s.pool)
        .await
        .unwrap();
    assert_eq!(n, 2);

    // The same key for another request is refused, and creates nothing.
    let mut other = configmap_order("idem");
    other["max_retries"] = json!(7);
    let (st, _, v) = post("key-1", other).await;
    assert_eq!(st, 422, "{v}");
    assert_eq!(v["error"]["code"], "idempotency_key_reused");
    // A key that is not visible ASCII is named in the error.
    let (st, _, v) = post("has space", configmap_order("idem")).await;
    assert_eq!(st, 400, "{v}");
    assert!(support::error_message(&v).contains("Idempotency-Key"));
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM work_orders")
        .fetch_one(&s.pool)
        .await
        .unwrap();
    assert_eq!(n, 2);
}

#[tokio::test]
async fn a_complete_repeated_after_a_lost_answer_gets_the_same_answer() {
    let s = TestServer::start().await;
    let (agent, token) = s.agent(json!({"name": "a", "labels": ["rep"]})).await;

    // Success, repeated: the same log entry; then a different outcome: 409 already_completed.
    let id = s.order(configmap_order("rep")).await;
    let c = claim_one(&s, &agent, &token).await;
    let done =
        json!({"agent_id": agent, "claim_id": c["claim_id"], "success": true, "message": "ok"});
    let (st, first) = complete(&s, &token, &id, done.clone()).await;
    assert_eq!(st, 200, "{first}");
    let (st, again) = complete(&s, &token, &id, done).await;
    assert_eq!(st, 200, "{again}");
    assert_eq!(again, first);
    // Without claim_id a repeat cannot be told from a second report: refused, as before.
    let (st, v) = complete(&s, &token, &id, json!({"agent_id": agent, "success": true})).await;
    assert_eq!(st, 409, "{v}");
    assert_eq!(v["error"]["code"], "not_claim_holder");
    let (st, v) = complete(
        &s,
        &token,
        &id,
        json!({"agent_id": agent, "claim_id": c["claim_id"], "success": false}),
    )
    .await;
    assert_eq!(st, 409, "{v}");
    assert_eq!(v["error"]["code"], "already_completed");

    // Another agent repeating it is not the holder.
    let (other, other_token) = s.agent(json!({"name": "b", "labels": ["x"]})).await;
    let (st, v) = complete(
        &s,
        &other_token,
        &id,
        json!({"agent_id": other, "claim_id": c["claim_id"], "success": true}),
    )
    .await;
    assert_eq!(st, 409, "{v}");
    assert_eq!(v["error"]["code"], "not_claim_holder");

    // A retryable failure, repeated: the same 202 with the same next_retry_after.
    let mut body = configmap_order("rep");
    body["backoff_seconds"] = json!(1);
    let id = s.order(body).await;
    let c = claim_one(&s, &agent, &token).await;
    assert_eq!(c["id"], id);
    let failed =
        json!({"agent_id": agent, "claim_id": c["claim_id"], "success": false, "message": "flaky"});
    let (st, first) = complete(&s, &token, &id, failed.clone()).await;
    assert_eq!(st, 202, "{first}");
    let (st, again) = complete(&s, &token, &id, failed).await;
    assert_eq!(st, 202, "{again}");
    assert_eq!(again, first);
    let (st, v) = complete(
        &s,
        &token,
        &id,
        json!({"agent_id": agent, "claim_id": c["claim_id"], "success": true}),
    )
    .await;
    assert_eq!(st, 409, "{v}");
    assert_eq!(v["error"]["code"], "already_completed");
    // Once the order is claimed again, that claim is history: the holder of old is told so.
    tokio::time::sleep(Duration::from_millis(1200)).await; // the 1 s backoff
    let c2 = claim_one(&s, &agent, &token).await;
    assert_eq!(c2["id"], id);
    let (st, v) = complete(
        &s,
        &token,
        &id,
        json!({"agent_id": agent, "claim_id": c["claim_id"], "success": false, "message": "flaky"}),
    )
    .await;
    assert_eq!(st, 409, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_killed_under_load_answer_503_never_500() {
    let s = Arc::new(TestServer::start().await);
    let (agent, token) = s.agent(json!({"name": "k", "labels": ["kill"]})).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    for i in 0..6 {
        let (s, stop, agent, token) = (s.clone(), stop.clone(), agent.clone(), token.clone());
        load.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let (st, v) = match i % 3 {
                    0 => {
                        s.admin_post("/api/v1/work-orders", configmap_order("kill"))
                            .await
                    }
                    1 => s.admin_get("/api/v1/work-orders?limit=5").await,
                    _ => s.claim_next(&agent, &token, None).await,
                };
                assert_ne!(st, 500, "a killed connection answered 500: {v}");
                statuses.push(st);
            }
            statuses
        }));
    }
    // pg_terminate_backend of every other connection of this database, as an operator or a
    // failover would, for three seconds.
    let started = Instant::now();
    let mut killed = 0i64;
    while started.elapsed() < Duration::from_secs(3) {
        let (n,): (i64,) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_one(&s.pool)
        .await
        .unwrap_or((0,));
        killed += n;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for l in load {
        all.extend(l.await.unwrap());
    }
    assert!(
        killed > 0,
        "no connection was terminated: the test proved nothing"
    );
    assert!(
        all.iter().all(|st| [200, 201, 204, 503].contains(st)),
        "unexpected statuses: {:?}",
        all.iter()
            .filter(|st| ![200, 201, 204, 503].contains(*st))
            .collect::<Vec<_>>()
    );
    // And the server recovers: a request after the storm succeeds.
    eventually(10, "the API to answer again", || async {
        let (st, _) = s.admin_get("/api/v1/work-orders").await;
        (st == 200).then_some(())
    })
    .await;
}

/// The pool hands out a recently used connection without pinging it (`serve::PING_IDLE_AFTER`,
/// issue #34); one idle longer is pinged first. So connections that died while idle (a
/// restart, an operator's `pg_terminate_backend`) are replaced before a request finds them.
#[tokio::test]
async fn connections_that_died_idle_are_replaced_before_a_request_sees_them() {
    use sqlx::Connection;
    const IDLE: usize = 12;
    let s = TestServer::start().await;
    // Several idle connections, so that one request meeting a dead one cannot pass unseen.
    let held: Vec<_> = futures::future::try_join_all((0..IDLE).map(|_| s.pool.acquire()))
        .await
        .unwrap();
    drop(held);
    let options = s.pool.connect_options().as_ref().clone();
    let mut outside = sqlx::PgConnection::connect_with(&options).await.unwrap();
    // Not the notification listener's connection: its loss makes the outage known, and the
    // server's probe would then weed out the dead connections before the requests below.
    let (killed,): (i64,) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid() \
           AND query NOT LIKE 'LISTEN %'",
    )
    .fetch_one(&mut outside)
    .await
    .unwrap();
    assert!(
        killed >= IDLE as i64,
        "killed {killed} connections of {IDLE} idle: the test proves nothing"
    );
    tokio::time::sleep(pullman::serve::PING_IDLE_AFTER + Duration::from_millis(200)).await;
    assert!(
        !s.queue.database_known_down(),
        "the kill made an outage known: the requests below prove nothing"
    );
    // Each request answers at its first try: none meets a dead connection (that one would
    // answer 503, and the requests after it too until the server found the database again).
    for i in 0..IDLE {
        let (st, v) = s.admin_get("/api/v1/work-orders?limit=5").await;
        assert_eq!(st, 200, "request {i} met a dead connection: {v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_is_down_answers_503_at_once_and_comes_back() {
    // A PostgreSQL of this test's own, to stop and start.
    let own = support::own_postgres::OwnPostgres::new();
    let pg = own.start().await;
    let s = own.server(&pg).await;
    let (st, _) = s.admin_get("/api/v1/agents").await;
    assert_eq!(st, 200);

    pg.stop().await.unwrap();
    // The listener's connection drops with the server: the outage is known within moments.
    // Every request then answers 503 with Retry-After without waiting for a connection.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for _ in 0..5 {
        let started = Instant::now();
        let r = s
            .http
            .get(s.url("/api/v1/agents"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 503);
        assert_eq!(r.headers()["retry-after"], "1");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "database_unavailable");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "a known outage still waited {:?} (the pool's timeout is 10 s)",
            started.elapsed()
        );
    }
    let r = s.http.get(s.url("/readyz")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 503);
    // A Prometheus scrape gets the counters without waiting on the database for its gauges.
    let started = Instant::now();
    let r = s.http.get(s.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "/metrics waited {:?} on a known outage",
        started.elapsed()
    );
    let r = s.http.get(s.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200, "the process is alive");

    let _pg = own.start().await;
    eventually(
        30,
        "the API to answer again after PostgreSQL is back",
        || async {
            let (st, _) = s.admin_get("/api/v1/agents").await;
            (st == 200).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_yaml_is_refused_quickly_and_the_server_keeps_answering() {
    let s = Arc::new(TestServer::start().await);
    let yaml = format!("x: {}{}", "[".repeat(100_000), "]".repeat(100_000));
    let body = json!({"work_type": "custom", "yaml_content": yaml, "targeting": {"labels": ["x"]}});
    let creates: Vec<_> = (0..2)
        .map(|_| {
            let (s, body) = (s.clone(), body.clone());
            tokio::spawn(async move { s.admin_post("/api/v1/work-orders", body).await })
        })
        .collect();
    // Meanwhile the server answers health checks (they took 38 s while two of these parsed).
    let started = Instant::now();
    let r = s.http.get(s.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let health_took = started.elapsed();
    for c in creates {
        let (st, v) = tokio::time::timeout(Duration::from_secs(20), c)
            .await
            .expect("a create of nested YAML ran for 20 s")
            .unwrap();
        assert_eq!(st, 400, "{v}");
        assert_eq!(v["error"]["code"], "invalid_field");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("yaml_content") && message.contains("nested"),
            "{message}"
        );
    }
    assert!(
        health_took < Duration::from_secs(5),
        "/healthz took {health_took:?}"
    );
}

#[tokio::test]
async fn the_log_keeps_finished_orders_for_its_retention_then_deletes_them_in_batches() {
    let s = TestServer::start().await;
    // 2,500 finished orders from 40 days ago and 10 from today (more than two batches of 1,000).
    sqlx::query(
        "INSERT INTO work_order_log (id, work_type, yaml_content, max_retries, backoff_seconds, \
           claim_timeout_seconds, max_reclaims, targeting, outcome, retry_count, reclaim_count, \
           source, ended_by, created_at, completed_at) \
         SELECT gen_random_uuid(), 'custom', 'x', 3, 60, 3600, 5, '{}', 'succeeded', 0, 0, 'api', \
           'agent', now() - interval '41 days', \
           CASE WHEN g <= 2500 THEN now() - interval '40 days' ELSE now() END \
         FROM generate_series(1, 2510) g",
    )
    .execute(&s.pool)
    .await
    .unwrap();
    // Two replicas' maintenance at once: each row is deleted once, neither waits on the other.
    let thirty_days = Duration::from_secs(30 * 86_400);
    let (a, b) = tokio::join!(
        s.queue.expire_history(thirty_days),
        s.queue.expire_history(thirty_days)
    );
    assert_eq!(a.unwrap() + b.unwrap(), 2500);
    let (left,): (i64,) = sqlx::query_as("SELECT count(*) FROM work_order_log")
        .fetch_one(&s.pool)
        .await
        .unwrap();
    assert_eq!(left, 10);
    assert_eq!(s.queue.expire_history(thirty_days).await.unwrap(), 0);
}

#[tokio::test]
async fn the_openapi_document_declares_query_parameters_and_their_bounds() {
    let s = TestServer::start().await;
    let (st, doc) = s.get("/api/v1/openapi.json").await;
    assert_eq!(st, 200);
    for (path, names) in [
        (
            "/api/v1/work-orders",
            &["status", "work_type", "limit", "cursor"][..],
        ),
        (
            "/api/v1/work-order-log",
            &["work_type", "success", "agent_id", "limit", "cursor"][..],
        ),
        ("/api/v1/agents", &["limit", "cursor"][..]),
    ] {
        let params = doc["paths"][path]["get"]["parameters"].as_array().unwrap();
        for name in names {
            let p = params
                .iter()
                .find(|p| p["name"] == *name)
                .unwrap_or_else(|| panic!("{path}: no parameter {name}"));
            assert_eq!(p["in"], "query", "{path} {name}: {p}");
            assert_ne!(p["required"], true, "{path} {name}: {p}");
        }
        let limit = params.iter().find(|p| p["name"] == "limit").unwrap();
        assert_eq!(limit["schema"]["maximum"], 1000, "{limit}");
    }
}
