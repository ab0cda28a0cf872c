//! `GET /api/v1/agents/me/backlog` (docs/design.md §10, issue #25): what KEDA's `metrics-api` scaler
//! reads with an Executor's own token, against a real PostgreSQL.

use crate::support;

use reqwest::Method;
use serde_json::json;
use support::{ADMIN_TOKEN, TestServer, configmap_order};

/// Two agents, `gpu` (labelled gpu) and `cpu` (labelled cpu), and a backlog of 3 orders for the
/// first and 1 for the second: (first's id, first's token, second's token).
async fn gpu_and_cpu(s: &TestServer, gpu: &str, cpu: &str) -> (String, String, String) {
    let (a, a_tok) = s.agent(json!({"name": gpu, "labels": ["gpu"]})).await;
    let (_, b_tok) = s.agent(json!({"name": cpu, "labels": ["cpu"]})).await;
    for _ in 0..3 {
        s.order(configmap_order("gpu")).await;
    }
    s.order(configmap_order("cpu")).await;
    (a, a_tok, b_tok)
}

/// `GET /agents/me/backlog` (docs/design.md §10): the backlog of the agent the token belongs to, for a
/// scaler that holds an Executor's token but not its id; the admin token is no agent.
#[tokio::test]
async fn own_backlog_is_the_backlog_of_the_tokens_agent() {
    let s = TestServer::start().await;
    let (a, a_tok, b_tok) = gpu_and_cpu(&s, "a", "b").await;
    let own = "/api/v1/agents/me/backlog";
    let (st, v) = s.get_as(own, &a_tok).await;
    assert_eq!((st, v["count"].clone()), (200, json!(3)), "{v}");
    let by_id = format!("/api/v1/agents/{a}/backlog");
    let (_, w) = s.get_as(&by_id, &a_tok).await;
    assert_eq!(v["count"], w["count"]);
    let (st, v) = s.get_as(own, &b_tok).await;
    assert_eq!((st, v["count"].clone()), (200, json!(1)), "{v}");
    let (st, v) = s.get_as(own, ADMIN_TOKEN).await;
    support::assert_refused(st, &v, 403, "forbidden");
    let (st, v) = s.get(own).await;
    support::assert_refused(st, &v, 401, "unauthorized");
    // Reading it is no contact: the agent is still never seen (a scaler polls while no replica runs).
    let (_, agent) = s.get_as(&format!("/api/v1/agents/{a}"), ADMIN_TOKEN).await;
    assert_eq!(agent["health"], "never_seen", "{agent}");
}

/// `GET /agents/{id}/backlog` takes an agent's name as `pullman agents` does (issue #36): before,
/// a name was a UUID parse error. A name means its live agent, else the newest retired one; an
/// unknown name is a 404 that says what was looked for; an agent token may name only itself.
#[tokio::test]
async fn agent_backlog_by_name() {
    let s = TestServer::start().await;
    let (a, a_tok, b_tok) = gpu_and_cpu(&s, "gpu-box", "cpu-box").await;
    let by_name = "/api/v1/agents/gpu-box/backlog";
    let (st, v) = s.get_as(by_name, ADMIN_TOKEN).await;
    assert_eq!((st, v["count"].clone()), (200, json!(3)), "{v}");
    let (_, w) = s
        .get_as(&format!("/api/v1/agents/{a}/backlog"), ADMIN_TOKEN)
        .await;
    assert_eq!(v, w, "by name and by id answer alike");
    let (st, v) = s.get_as(by_name, &a_tok).await;
    assert_eq!((st, v["count"].clone()), (200, json!(3)), "{v}");
    let (st, v) = s.get_as(by_name, &b_tok).await;
    support::assert_refused(st, &v, 403, "forbidden");
    // Another agent's token learns nothing of which names exist.
    let (st, _) = s.get_as("/api/v1/agents/nobody/backlog", &b_tok).await;
    assert_eq!(st, 403);

    let (st, v) = s.get_as("/api/v1/agents/nobody/backlog", ADMIN_TOKEN).await;
    support::assert_refused(st, &v, 404, "not_found");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("\"nobody\""), "{message}");
    assert!(!message.to_lowercase().contains("uuid"), "{message}");

    // A name freed by retirement and taken again means the live agent.
    let (st, _) = s
        .call(
            Method::DELETE,
            &format!("/api/v1/agents/{a}"),
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(st, 200);
    let (again, _) = s.agent(json!({"name": "gpu-box", "labels": ["cpu"]})).await;
    let (st, v) = s.get_as(by_name, ADMIN_TOKEN).await;
    assert_eq!((st, v["count"].clone()), (200, json!(1)), "{v}");
    let (_, w) = s
        .get_as(&format!("/api/v1/agents/{again}/backlog"), ADMIN_TOKEN)
        .await;
    assert_eq!(v, w, "the name is the live agent's");
}
