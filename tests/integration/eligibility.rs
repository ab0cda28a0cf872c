//! Targeting and eligibility (docs/design.md §3) through the API, against a real PostgreSQL: the
//! pending list shows exactly what claim accepts.

use crate::support;

use std::collections::BTreeSet;

use reqwest::Method;
use serde_json::{Value, json};
use support::TestServer;

const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n";
const BUILD: &str =
    "apiVersion: shipwright.io/v1beta1\nkind: Build\nmetadata:\n  name: b\nspec: {}\n";

async fn pending(s: &TestServer, id: &str, token: &str, query: &str) -> BTreeSet<String> {
    let (status, v) = s
        .get_as(
            &format!("/api/v1/agents/{id}/work-orders/pending{query}"),
            token,
        )
        .await;
    assert_eq!(status, 200, "{v}");
    for item in v["items"].as_array().unwrap() {
        assert!(
            item.get("yaml_content").is_none(),
            "lists never carry yaml_content"
        );
    }
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["id"].as_str().unwrap().to_string())
        .collect()
}

/// Claims every order one by one and returns the set that claim accepted (2xx).
async fn claimable(s: &TestServer, id: &str, token: &str, orders: &[String]) -> BTreeSet<String> {
    let mut ok = BTreeSet::new();
    for o in orders {
        let (status, body) = s.claim(o, id, token).await;
        match status {
            200 => {
                ok.insert(o.clone());
            }
            404 | 409 => {}
            other => panic!("unexpected {other}: {body}"),
        }
    }
    ok
}

fn order(work_type: &str, tenant: Option<&str>, targeting: Value) -> Value {
    json!({
        "work_type": work_type,
        "yaml_content": if work_type == "build" { BUILD } else { CM },
        "tenant": tenant,
        "targeting": targeting,
    })
}

#[tokio::test]
async fn targeting_criteria_are_or_and_gates_are_and() {
    let s = TestServer::start().await;
    let (a, a_tok) = s
        .agent(json!({
            "name": "team-a/builder",
            "labels": ["gpu", "eu"],
            "annotations": {"zone": "a", "tier": "gold"},
            "work_types": ["custom"],
            "tenant": "team-a",
        }))
        .await;
    let (_other, _) = s.agent(json!({"name": "other", "labels": ["x"]})).await;

    // Each order as (work type, tenant, targeting, whether the agent sees it), created in turn.
    #[rustfmt::skip]
    let cases = [
        ("custom", Some("team-a"), json!({"agent_ids": [a]}), true),
        ("custom", Some("team-a"), json!({"agent_names": ["team-a/builder"]}), true),
        ("custom", Some("team-a"), json!({"labels": ["cpu", "eu"]}), true),
        ("custom", Some("team-a"), json!({"annotations": {"zone": "a"}}), true),
        // annotations match on key *and* value
        ("custom", Some("team-a"), json!({"annotations": {"zone": "b"}}), false),
        // a miss on one criterion does not hide an order matched by another
        ("custom", Some("team-a"), json!({"labels": ["nope"], "agent_names": ["team-a/builder"]}), true),
        ("custom", Some("team-a"), json!({"labels": ["nope"]}), false),
        // work type outside the agent's capabilities
        ("build", Some("team-a"), json!({"labels": ["gpu"]}), false),
        // tenant gate: a tenant-bound agent sees only its tenant's orders
        ("custom", Some("team-b"), json!({"labels": ["gpu"]}), false),
        ("custom", None, json!({"labels": ["gpu"]}), false),
    ];
    let mut expect = BTreeSet::new();
    let mut all = Vec::new();
    for (work_type, tenant, targeting, visible) in cases {
        let id = s.order(order(work_type, tenant, targeting)).await;
        if visible {
            expect.insert(id.clone());
        }
        all.push(id);
    }

    let listed = pending(&s, &a, &a_tok, "").await;
    assert_eq!(listed, expect);
    let claimed = claimable(&s, &a, &a_tok, &all).await;
    assert_eq!(claimed, expect, "pending list == what claim accepts");
}

#[tokio::test]
async fn instance_wide_agents_see_every_tenant_and_empty_work_types_mean_all() {
    let s = TestServer::start().await;
    let (a, tok) = s.agent(json!({"name": "any", "labels": ["l"]})).await;
    let mut all = Vec::new();
    all.push(
        s.order(order("custom", Some("t1"), json!({"labels": ["l"]})))
            .await,
    );
    all.push(
        s.order(order("build", None, json!({"labels": ["l"]})))
            .await,
    );
    let expect: BTreeSet<String> = all.iter().cloned().collect();
    assert_eq!(pending(&s, &a, &tok, "").await, expect);
    let only_build = pending(&s, &a, &tok, "?work_type=build").await;
    assert_eq!(only_build, BTreeSet::from([all[1].clone()]));
    assert_eq!(claimable(&s, &a, &tok, &all).await, expect);
}

#[tokio::test]
async fn max_concurrency_and_retirement_gate_claims() {
    let s = TestServer::start().await;
    let (a, tok) = s
        .agent(json!({"name": "capped", "labels": ["c"], "max_concurrency": 2}))
        .await;
    let mut all = Vec::new();
    for _ in 0..3 {
        all.push(
            s.order(order("custom", None, json!({"labels": ["c"]})))
                .await,
        );
    }
    assert_eq!(pending(&s, &a, &tok, "").await.len(), 3);
    for o in &all[..2] {
        let (st, b) = s.claim(o, &a, &tok).await;
        assert_eq!(st, 200, "{b}");
    }
    let (st, b) = s
        .call(
            Method::POST,
            &format!("/api/v1/work-orders/{}/claim", all[2]),
            Some(&tok),
            Some(json!({"agent_id": a})),
        )
        .await;
    assert_eq!(st, 409, "{b}");
    assert_eq!(b["error"]["code"], "max_concurrency");
    assert!(
        pending(&s, &a, &tok, "").await.is_empty(),
        "at capacity, claim accepts nothing"
    );
    let (st, _) = s.claim_next(&a, &tok, None).await;
    assert_eq!(st, 204);

    // Concurrent claim-next by one capped agent never exceeds the cap.
    let (b_id, b_tok) = s
        .agent(json!({"name": "capped-2", "labels": ["d"], "max_concurrency": 3}))
        .await;
    for _ in 0..10 {
        s.order(order("custom", None, json!({"labels": ["d"]})))
            .await;
    }
    let mut tasks = Vec::new();
    let s = std::sync::Arc::new(s);
    for _ in 0..10 {
        let (s, b_id, b_tok) = (s.clone(), b_id.clone(), b_tok.clone());
        tasks.push(tokio::spawn(async move {
            s.claim_next(&b_id, &b_tok, None).await.0
        }));
    }
    let mut won = 0;
    for t in tasks {
        if t.await.unwrap() == 200 {
            won += 1;
        }
    }
    assert_eq!(won, 3, "max_concurrency holds under concurrent claims");

    // Retiring: the token stops working, claims go back to PENDING.
    let (st, agent) = s.retire(&a).await;
    assert_eq!(st, 200, "{agent}");
    assert_eq!(agent["health"], "retired");
    for o in &all[..2] {
        let (_, v) = s.admin_get(&format!("/api/v1/work-orders/{o}")).await;
        assert_eq!(v["status"], "PENDING");
        assert!(v["claimed_by"].is_null());
    }
    let (st, _) = s
        .get_as(&format!("/api/v1/agents/{a}/work-orders/pending"), &tok)
        .await;
    assert_eq!(st, 401, "a retired agent's token is revoked");
}

#[tokio::test]
async fn agents_report_derived_health() {
    let s = TestServer::start().await;
    let (a, tok) = s.agent(json!({"name": "h", "labels": ["h"]})).await;
    let (_, v) = s.admin_get(&format!("/api/v1/agents/{a}")).await;
    assert_eq!(v["health"], "never_seen");
    s.claim_next(&a, &tok, None).await;
    let (_, v) = s.admin_get(&format!("/api/v1/agents/{a}")).await;
    assert_eq!(v["health"], "active");
    sqlx::query("UPDATE agents SET last_seen_at = now() - interval '6 minutes'")
        .execute(&s.pool)
        .await
        .unwrap();
    let (_, v) = s.admin_get("/api/v1/agents").await;
    assert_eq!(v["items"][0]["health"], "stale");
}

/// Claim-next's `work_types` narrows the agent's capabilities for that call: the order's type
/// must be both requested (if any are) and within the capabilities (if any are declared).
#[tokio::test]
async fn requested_work_types_narrow_capabilities() {
    let s = TestServer::start().await;
    let (any, any_tok) = s.agent(json!({"name": "any", "labels": ["n"]})).await;
    let (only_custom, oc_tok) = s
        .agent(json!({"name": "only-custom", "labels": ["n"], "work_types": ["custom"]}))
        .await;
    let custom = s
        .order(order("custom", None, json!({"labels": ["n"]})))
        .await;
    let build = s
        .order(order("build", None, json!({"labels": ["n"]})))
        .await;
    let claim = |id: String, tok: String, body: Value| {
        let s = &s;
        async move { s.claim_next(&id, &tok, Some(body)).await }
    };
    // Capable of custom only, asking for build only: nothing is left.
    let (st, _) = claim(
        only_custom.clone(),
        oc_tok.clone(),
        json!({"work_types": ["build"]}),
    )
    .await;
    assert_eq!(st, 204);
    // No declared capabilities, asking for build: the older custom order is passed over.
    let (st, v) = claim(
        any.clone(),
        any_tok.clone(),
        json!({"work_types": ["build"]}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["id"], json!(build));
    // Capable of custom, asking for both: custom.
    let (st, v) = claim(
        only_custom,
        oc_tok,
        json!({"work_types": ["build", "custom"]}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["id"], json!(custom));
}
