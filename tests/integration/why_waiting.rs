//! docs/design.md §10 over HTTP: why an order waits (`GET /work-orders/{id}/explain` and the `waiting`
//! field of `GET /work-orders/{id}`), its 404/409 answers, the backlog of an agent and of a
//! profile (403 for another agent's token, 422 naming an unknown work type), and the gauges of
//! waiting orders by reason. The reasons themselves are checked against the claim path in
//! `queue::waiting_agreement`.

use crate::support;

use serde_json::{Value, json};
use support::cli::{cli_text, create_args};
use support::{TestServer, configmap_order};

async fn get(s: &TestServer, path: &str) -> (u16, Value) {
    s.admin_get(path).await
}

#[tokio::test]
async fn explain_answers_the_reason_and_get_carries_it() {
    let s = TestServer::start().await;
    let o = s.order(configmap_order("gpu")).await;
    let (st, e) = get(&s, &format!("/api/v1/work-orders/{o}/explain")).await;
    assert_eq!(st, 200, "{e}");
    assert_eq!(e["reason"], "no_matching_agent");
    assert_eq!(e["matching_agents"], json!([]));
    assert!(e["waiting_seconds"].as_i64().unwrap() >= 0);
    assert!(e.get("position").is_none(), "{e}");

    let (a, token) = s
        .agent(json!({"name": "runner-1", "labels": ["gpu"]}))
        .await;
    let (st, e) = get(&s, &format!("/api/v1/work-orders/{o}/explain")).await;
    assert_eq!(st, 200);
    assert_eq!(e["reason"], "no_agent_connected", "{e}");
    assert_eq!(e["matching_agents"], json!(["runner-1"]));

    // The pending list reads without recording contact: the agent is still never seen.
    let (st, _) = s
        .get_as(&format!("/api/v1/agents/{a}/work-orders/pending"), &token)
        .await;
    assert_eq!(st, 200);
    let (st, order) = get(&s, &format!("/api/v1/work-orders/{o}")).await;
    assert_eq!(st, 200);
    assert_eq!(order["waiting"]["reason"], "no_agent_connected", "{order}");
    let (st, claimed) = s.claim(&o, &a, &token).await;
    assert_eq!(st, 200, "{claimed}");
    let (st, order) = get(&s, &format!("/api/v1/work-orders/{o}")).await;
    assert_eq!(st, 200);
    assert!(
        order.get("waiting").is_none(),
        "a claimed order does not wait: {order}"
    );
    let (st, e) = get(&s, &format!("/api/v1/work-orders/{o}/explain")).await;
    assert_eq!(st, 409, "{e}");
    assert_eq!(e["error"]["code"], "not_waiting");

    let second = s.order(configmap_order("gpu")).await;
    let (_, order) = get(&s, &format!("/api/v1/work-orders/{second}")).await;
    assert_eq!(order["waiting"]["reason"], "queued", "{order}");
    // GET does not count the orders ahead (`wait` reads it every second); explain does.
    assert!(order["waiting"].get("position").is_none(), "{order}");
    assert!(
        order["waiting"]["message"]
            .as_str()
            .unwrap()
            .contains("is in line for agent runner-1 (`pullman work-orders explain` counts"),
        "{order}"
    );
    let (_, e) = get(&s, &format!("/api/v1/work-orders/{second}/explain")).await;
    assert_eq!(e["position"], 1, "{e}");
    assert!(
        support::message(&e).contains("next in line for agent runner-1"),
        "{e}"
    );
}

#[tokio::test]
async fn explain_404_names_unknown_and_finished() {
    let s = TestServer::start().await;
    let unknown = uuid::Uuid::new_v4();
    let (st, e) = get(&s, &format!("/api/v1/work-orders/{unknown}/explain")).await;
    assert_eq!(st, 404);
    assert_eq!(e["error"]["code"], "not_found");
    assert!(support::error_message(&e).contains(&unknown.to_string()));
    let o = s.order(configmap_order("gpu")).await;
    let (st, _) = s.cancel(&o).await;
    assert_eq!(st, 200);
    let (st, e) = get(&s, &format!("/api/v1/work-orders/{o}/explain")).await;
    assert_eq!(st, 404);
    assert_eq!(e["error"]["code"], "finished", "{e}");
    assert!(support::error_message(&e).contains("cancelled"), "{e}");
    let (st, e) = get(&s, "/api/v1/work-orders/not-a-uuid/explain").await;
    assert_eq!(st, 400, "{e}");
}

#[tokio::test]
async fn backlog_of_an_agent_and_of_a_profile() {
    let s = TestServer::start().await;
    let (a, a_token) = s
        .agent(json!({"name": "a", "labels": ["gpu"], "max_concurrency": 1}))
        .await;
    let (b, b_token) = s.agent(json!({"name": "b", "labels": ["cpu"]})).await;
    for _ in 0..3 {
        s.order(configmap_order("gpu")).await;
    }
    s.order(configmap_order("cpu")).await;
    let path = format!("/api/v1/agents/{a}/backlog");
    let (st, v) = s.get_as(&path, &a_token).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["count"], 3);
    assert!(v["oldest_seconds"].as_i64().unwrap() >= 0);
    // The admin may ask too; another agent's token may not.
    let (st, v) = get(&s, &path).await;
    assert_eq!((st, v["count"].clone()), (200, json!(3)));
    let (st, v) = s.get_as(&path, &b_token).await;
    assert_eq!(st, 403, "{v}");
    assert_eq!(v["error"]["code"], "forbidden");
    let (st, v) = s.get(&path).await;
    assert_eq!(st, 401, "{v}");
    let (st, v) = get(
        &s,
        &format!("/api/v1/agents/{}/backlog", uuid::Uuid::new_v4()),
    )
    .await;
    assert_eq!(st, 404, "{v}");

    // A busy agent keeps its backlog: it is what more agents like it would take.
    let (st, _) = s.claim_next(&a, &a_token, Some(json!({}))).await;
    assert_eq!(st, 200);
    let (_, v) = s.get_as(&path, &a_token).await;
    assert_eq!(v["count"], 2);
    // What a Deployment of such agents is sized on: waiting plus in flight.
    assert_eq!(
        (v["claimed"].clone(), v["total"].clone()),
        (json!(1), json!(3)),
        "{v}"
    );
    let (_, v) = s
        .get_as(&format!("/api/v1/agents/{b}/backlog"), &b_token)
        .await;
    assert_eq!(v["count"], 1);

    // A profile not registered: the same rule over its labels, work types and tenant.
    let (st, v) = get(&s, "/api/v1/backlog?label=gpu&label=cpu").await;
    assert_eq!((st, v["count"].clone()), (200, json!(3)), "{v}");
    assert_eq!(
        (v["claimed"].clone(), v["total"].clone()),
        (json!(0), json!(3)),
        "a profile runs nothing: {v}"
    );
    let (_, v) = get(&s, "/api/v1/backlog?label=gpu&work_type=build").await;
    assert_eq!(v["count"], 0);
    let (_, v) = get(&s, "/api/v1/backlog?label=gpu&tenant=team-a").await;
    assert_eq!(
        v["count"], 0,
        "a tenant's agent takes only its tenant's orders"
    );
    let (st, v) = get(&s, "/api/v1/backlog?label=gpu&work_type=gpu").await;
    assert_eq!(st, 422, "{v}");
    assert_eq!(v["error"]["code"], "unknown_work_type");
    assert!(support::error_message(&v).starts_with("work_type"), "{v}");
    let (st, v) = get(&s, "/api/v1/backlog?labels=gpu").await;
    assert_eq!(st, 400, "{v}");
    // A profile travels in a URL: its bounds are the URL's, each refusal naming the parameter.
    let many = vec!["label=x"; pullman::queue::limits::PROFILE_MAX_VALUES + 1].join("&");
    let (st, v) = get(&s, &format!("/api/v1/backlog?{many}")).await;
    assert_eq!(st, 400, "{v}");
    assert!(support::error_message(&v).starts_with("label:"), "{v}");
    let long = "a".repeat(pullman::queue::limits::PROFILE_MAX_CHARS + 1);
    let (st, v) = get(&s, &format!("/api/v1/backlog?annotation=k={long}")).await;
    assert_eq!(st, 400, "{v}");
    assert!(support::error_message(&v).starts_with("annotation:"), "{v}");
    let (st, v) = get(&s, &format!("/api/v1/backlog?annotation=k={}", &long[3..])).await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = s.get_as("/api/v1/backlog?label=gpu", &a_token).await;
    assert_eq!(st, 403, "{v}");
}

#[tokio::test]
async fn metrics_count_waiting_orders_by_reason() {
    let s = TestServer::start().await;
    s.order(configmap_order("nobody")).await;
    s.order(configmap_order("nobody")).await;
    s.agent(json!({"name": "a", "labels": ["gpu"]})).await;
    s.order(configmap_order("gpu")).await;
    let text = s.scrape().await;
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
            .to_string()
    };
    assert!(
        line("pullman_work_orders_waiting{reason=\"no_matching_agent\"}").ends_with(" 2"),
        "{text}"
    );
    assert!(line("pullman_work_orders_waiting{reason=\"no_agent_connected\"}").ends_with(" 1"));
    assert!(line("pullman_work_orders_waiting{reason=\"queued\"}").ends_with(" 0"));
    line("pullman_work_orders_waiting_oldest_seconds{reason=\"no_matching_agent\"}");
    line("pullman_work_orders_waiting_oldest_seconds{reason=\"agents_busy\"}");
}

/// Orders per tenant (issue #40), bounded: the 20 busiest tenants get their own series (the
/// orders without a tenant as `tenant=""`), the others are summed; a claim's wait lands in its
/// tenant's histogram.
#[tokio::test]
async fn metrics_count_orders_per_tenant_with_the_rest_summed() {
    let s = TestServer::start().await;
    let order = |tenant: Option<String>| {
        let mut body = configmap_order("gpu");
        body["tenant"] = json!(tenant);
        body
    };
    for _ in 0..3 {
        s.order(order(Some("big".into()))).await;
    }
    for _ in 0..2 {
        s.order(order(None)).await;
    }
    // t00..t17 tie at one order and go by name into the busiest 20; t18..t20 are the others.
    for i in 0..21 {
        s.order(order(Some(format!("t{i:02}")))).await;
    }
    let (agent, token) = s
        .agent(json!({"name": "a", "labels": ["gpu"], "tenant": "big"}))
        .await;
    let (st, v) = s.claim_next(&agent, &token, Some(json!({}))).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["tenant"], "big");
    let text = s.scrape().await;
    for line in [
        r#"pullman_tenant_work_orders{tenant="big",state="waiting"} 2"#,
        r#"pullman_tenant_work_orders{tenant="big",state="claimed"} 1"#,
        r#"pullman_tenant_work_orders{tenant="",state="waiting"} 2"#,
        r#"pullman_tenant_work_orders{tenant="t17",state="waiting"} 1"#,
        r#"pullman_other_tenants_work_orders{state="waiting"} 3"#,
        r#"pullman_other_tenants_work_orders{state="claimed"} 0"#,
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    }
    assert!(!text.contains(r#"tenant="t18""#), "{text}");
    // The claim came before the first scrape, when no tenant had its own series yet.
    assert!(
        text.contains("pullman_other_tenants_queue_wait_seconds_count 1"),
        "{text}"
    );
}

#[tokio::test]
async fn the_cli_says_why_by_id_prefix() {
    let s = TestServer::start().await;
    let o = s.order(configmap_order("gpu")).await;
    let prefix = &o[..8];
    let (ok, out, err) = cli_text(&s.base, &["work-orders", "explain", prefix]).await;
    assert!(ok, "{err}");
    assert!(out.contains("No live agent may take work order"), "{out}");
    assert!(out.contains("(no_matching_agent)"), "{out}");
    let (ok, out, err) = cli_text(&s.base, &["work-orders", "get", prefix]).await;
    assert!(ok, "{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("Waiting") && l.contains("No live agent")),
        "{out}"
    );
    let (ok, out, _) = cli_text(&s.base, &["work-orders", "explain", prefix, "-o", "json"]).await;
    assert!(ok);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["reason"], "no_matching_agent");
    let (st, _) = s.cancel(&o).await;
    assert_eq!(st, 200);
    // An order that no longer waits is described, not an error.
    let (ok, out, err) = cli_text(&s.base, &["work-orders", "explain", prefix]).await;
    assert!(ok, "{err}");
    assert!(out.contains("finished: cancelled"), "{out}");
    let (ok, out, err) = cli_text(&s.base, &["work-orders", "explain", prefix, "-o", "json"]).await;
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["reason"].clone(), v["outcome"].clone()),
        (json!("finished"), json!("cancelled"))
    );

    let (a, token) = s.agent(json!({"name": "laptop", "labels": ["gpu"]})).await;
    let running = s.order(configmap_order("gpu")).await;
    let (st, v) = s.claim_next(&a, &token, Some(json!({}))).await;
    assert_eq!((st, v["id"].clone()), (200, json!(running)), "{v}");
    let (ok, out, err) = cli_text(&s.base, &["work-orders", "explain", &running[..8]]).await;
    assert!(ok, "{err}");
    assert!(out.contains("is running on agent laptop since"), "{out}");
    let (ok, out, _) = cli_text(&s.base, &["work-orders", "explain", &running, "-o", "json"]).await;
    assert!(ok);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["reason"].clone(), v["agent"].clone()),
        (json!("running"), json!("laptop"))
    );
    // laptop registered no max_concurrency, so by the server's count it has room; whether it
    // does depends on the worker's own --concurrency. "Next in line" alone would read as "starts
    // now": the sentence says what laptop runs (issue #36, point 9).
    let next = s.order(configmap_order("gpu")).await;
    let (ok, out, err) = cli_text(&s.base, &["work-orders", "explain", &next]).await;
    assert!(ok, "{err}");
    assert!(
        out.contains("is next in line for agent laptop.")
            && out.contains("laptop is running 1 order now; it starts when laptop takes another"),
        "{out}"
    );
}

/// Where people wait on an order, they are told why it waits (issue #36, point 3): `wait` and
/// `create --wait --logs` say the reason on stderr after a few seconds, and their timeout
/// message carries it.
#[tokio::test]
async fn waiting_commands_say_why_the_order_waits() {
    let s = TestServer::start().await;
    let o = s.order(configmap_order("nobody-has-this")).await;
    let out = support::cli::cli(&s.base, &["work-orders", "wait", &o, "--timeout", "5"]).await;
    let err = support::cli::text(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "timeout exit: {err}");
    let note = err
        .lines()
        .find(|l| l.starts_with("No live agent may take work order"))
        .unwrap_or_else(|| panic!("the reason said while waiting: {err}"));
    assert!(note.ends_with("(no_matching_agent)."), "{note}");
    assert!(
        err.lines().any(|l| l.starts_with("timed out after 5 s")
            && l.contains("still PENDING: No live agent may take")),
        "{err}"
    );

    let (_dir, file) =
        support::cli::yaml_file("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: w\n");
    let out = support::cli::cli(
        &s.base,
        &create_args(
            file.to_str().unwrap(),
            "nobody-has-this",
            &["--wait", "--logs", "--timeout", "5", "-o", "name"],
        ),
    )
    .await;
    let err = support::cli::text(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "timeout exit: {err}");
    // -o name is the created order's format: its id, then the lines as text.
    let id = support::cli::text(&out.stdout);
    assert!(uuid::Uuid::parse_str(id.trim()).is_ok(), "{id}");
    assert!(
        err.lines()
            .any(|l| l.starts_with("No live agent may take work order")),
        "the reason said while following: {err}"
    );
    assert!(
        err.lines()
            .any(|l| l.contains("has not finished: No live agent may take")),
        "{err}"
    );
}

/// DESIGN §10: past 10,000 orders ahead, `explain` says so instead of counting on.
#[tokio::test]
async fn a_position_past_the_bound_says_so_not_the_number() {
    let s = TestServer::start().await;
    let (a, token) = s.agent(json!({"name": "deep-1", "labels": ["deep"]})).await;
    // In contact, with room: a claim attempt that finds nothing.
    let (st, v) = s.claim_next(&a, &token, Some(json!({}))).await;
    assert_eq!(st, 204, "{v}");
    let ahead = pullman::queue::limits::MAX_POSITION_COUNTED;
    sqlx::query(
        "INSERT INTO work_orders (id, work_type, yaml_content, max_retries, backoff_seconds, \
         claim_timeout_seconds, max_reclaims, target_labels, status, created_at, updated_at) \
         SELECT gen_random_uuid(), 'custom', 'x', 3, 60, 3600, 5, ARRAY['deep'], 'PENDING', \
           now() - interval '1 hour' + make_interval(secs => g / 1000.0), now() \
         FROM generate_series(1, $1) g",
    )
    .bind(ahead)
    .execute(&s.pool)
    .await
    .unwrap();
    // Exactly the bound ahead: still counted.
    let exact = s.order(configmap_order("deep")).await;
    let (st, e) = get(&s, &format!("/api/v1/work-orders/{exact}/explain")).await;
    assert_eq!(st, 200, "{e}");
    assert_eq!(e["position"], ahead + 1, "{e}");
    assert!(e.get("position_past").is_none(), "{e}");
    // One more ahead: past the bound, said so.
    let o = s.order(configmap_order("deep")).await;
    let (st, e) = get(&s, &format!("/api/v1/work-orders/{o}/explain")).await;
    assert_eq!(st, 200, "{e}");
    assert_eq!(e["reason"], "queued", "{e}");
    assert!(e.get("position").is_none(), "{e}");
    assert_eq!(e["position_past"], 10_000, "{e}");
    assert!(
        support::message(&e).contains("more than 10000 orders go first"),
        "{e}"
    );
}

/// docs/design.md §12: a claimed order waits only as its agent says with its heartbeats
/// (`node_unreachable`, with the node); the next heartbeat that says nothing clears it, another
/// agent cannot say it, and anything but `node_unreachable` is refused (400) naming the field.
#[tokio::test]
async fn a_claimed_order_waits_as_its_agent_says_a_node_is_lost() {
    let s = TestServer::start().await;
    let (a, token) = s.agent(json!({"name": "ex", "labels": ["lost"]})).await;
    let (b, other) = s.agent(json!({"name": "ex-2", "labels": ["lost"]})).await;
    let o = s.order(configmap_order("lost")).await;
    let (st, c) = s.claim(&o, &a, &token).await;
    assert_eq!(st, 200, "{c}");
    let explain = format!("/api/v1/work-orders/{o}/explain");
    let (st, e) = get(&s, &explain).await;
    assert_eq!(
        (st, &e["error"]["code"]),
        (409, &json!("not_waiting")),
        "{e}"
    );

    let lost = json!({"reason": "node_unreachable", "message": "pod p may still run on node n1",
                      "node": {"name": "n1", "since": "2026-01-01T00:00:00Z"}});
    let beat =
        |waiting: Value| json!({"agent_id": a, "claim_id": c["claim_id"], "waiting": waiting});
    let (st, v) = s.heartbeat(&o, &token, beat(lost.clone())).await;
    assert_eq!(st, 200, "{v}");
    let (st, e) = get(&s, &explain).await;
    assert_eq!(st, 200, "{e}");
    assert_eq!(e["reason"], "node_unreachable", "{e}");
    assert_eq!(e["message"], "pod p may still run on node n1");
    assert_eq!(
        e["node"],
        json!({"name": "n1", "since": "2026-01-01T00:00:00Z"})
    );
    assert!(
        e["waiting_seconds"].as_i64().unwrap() > 86_400,
        "since the node stopped: {e}"
    );
    let (_, order) = get(&s, &format!("/api/v1/work-orders/{o}")).await;
    assert_eq!(order["status"], "CLAIMED");
    assert_eq!(order["waiting"]["reason"], "node_unreachable", "{order}");

    // Refused, naming the field; what was said stays.
    for (bad, field) in [
        (
            json!({"reason": "queued", "message": "m", "node": {"name": "n1"}}),
            "waiting.reason",
        ),
        (
            json!({"reason": "node_unreachable", "message": "m", "node": {"name": "n".repeat(254)}}),
            "waiting.node.name",
        ),
        (
            json!({"reason": "node_unreachable", "message": "x".repeat(4097), "node": {"name": "n1"}}),
            "waiting.message",
        ),
    ] {
        let (st, v) = s.heartbeat(&o, &token, beat(bad)).await;
        assert_eq!(st, 400, "{v}");
        assert!(support::error_message(&v).contains(field), "{field}: {v}");
    }
    let (st, v) = s
        .heartbeat(&o, &other, json!({"agent_id": b, "waiting": lost}))
        .await;
    assert_eq!(
        (st, &v["error"]["code"]),
        (409, &json!("not_claim_holder")),
        "{v}"
    );
    assert_eq!(get(&s, &explain).await.1["reason"], "node_unreachable");

    // A heartbeat that says nothing: nothing holds the order up.
    let (st, v) = s
        .heartbeat(
            &o,
            &token,
            json!({"agent_id": a, "claim_id": c["claim_id"]}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let (st, e) = get(&s, &explain).await;
    assert_eq!(
        (st, &e["error"]["code"]),
        (409, &json!("not_waiting")),
        "{e}"
    );
    let (_, order) = get(&s, &format!("/api/v1/work-orders/{o}")).await;
    assert!(order.get("waiting").is_none_or(Value::is_null), "{order}");
}
