//! `GET /api/v1/agents/me/backlog` (docs/design.md §10, issue #25): what KEDA's `metrics-api` scaler
//! reads with an Executor's own token, against a real PostgreSQL.

mod support;

use reqwest::Method;
use serde_json::json;
use support::{ADMIN_TOKEN, TestServer, configmap_order};

/// `GET /agents/me/backlog` (docs/design.md §10): the backlog of the agent the token belongs to, for a
/// scaler that holds an Executor's token but not its id; the admin token is no agent.
#[tokio::test]
async fn own_backlog_is_the_backlog_of_the_tokens_agent() {
    let s = TestServer::start().await;
    let (a, a_tok) = s.agent(json!({"name": "a", "labels": ["gpu"]})).await;
    let (_, b_tok) = s.agent(json!({"name": "b", "labels": ["cpu"]})).await;
    for _ in 0..3 {
        s.order(configmap_order("gpu")).await;
    }
    s.order(configmap_order("cpu")).await;
    let own = "/api/v1/agents/me/backlog";
    let (st, v) = s.call(Method::GET, own, Some(&a_tok), None).await;
    assert_eq!((st, v["count"].clone()), (200, json!(3)), "{v}");
    let by_id = format!("/api/v1/agents/{a}/backlog");
    let (_, w) = s.call(Method::GET, &by_id, Some(&a_tok), None).await;
    assert_eq!(v["count"], w["count"]);
    let (st, v) = s.call(Method::GET, own, Some(&b_tok), None).await;
    assert_eq!((st, v["count"].clone()), (200, json!(1)), "{v}");
    let (st, v) = s.call(Method::GET, own, Some(ADMIN_TOKEN), None).await;
    assert_eq!(
        (st, v["error"]["code"].clone()),
        (403, json!("forbidden")),
        "{v}"
    );
    let (st, v) = s.call(Method::GET, own, None, None).await;
    assert_eq!(
        (st, v["error"]["code"].clone()),
        (401, json!("unauthorized")),
        "{v}"
    );
    // Reading it is no contact: the agent is still never seen (a scaler polls while no replica runs).
    let (_, agent) = s
        .call(
            Method::GET,
            &format!("/api/v1/agents/{a}"),
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(agent["health"], "never_seen", "{agent}");
}
