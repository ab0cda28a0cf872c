//! Request helpers for tests: the API of a server, in-process ([`super::TestServer`] derefs to
//! one) or a `pullman serve` process started by the test.

use serde_json::Value;

use super::poll::eventually;

/// The admin token of every [`super::TestServer`], and of a `pullman serve` a test starts.
pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789abcdef";

/// A client of one server's REST API (DESIGN.md §5) at `base`, with the test admin token at hand.
/// The request helpers return the status and the JSON body (`Value::Null` when empty, a string
/// when not JSON) and panic only when no answer comes at all; `agent` and `order` assert the
/// `201` and return ids, and `log_entry` waits for the log.
#[derive(Clone)]
pub struct ApiClient {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    pub http: reqwest::Client,
}

impl ApiClient {
    /// A client of the server at `base` (`http://host:port`, no trailing slash).
    pub fn new(base: &str) -> Self {
        ApiClient {
            base: base.trim_end_matches('/').to_string(),
            http: reqwest::Client::new(),
        }
    }

    /// `base` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Sends a request with an optional bearer token and JSON body; returns status and JSON body
    /// (`Value::Null` when empty, a string when not JSON).
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self.http.request(method, self.url(path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("request failed");
        let status = resp.status().as_u16();
        let text = resp.text().await.expect("a response body");
        let value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        (status, value)
    }

    /// Claim-next as `agent` with its `token` (`POST /api/v1/agents/{agent}/claim`,
    /// docs/design.md §5) and `body` (`None`: no body); returns status and JSON body as
    /// [`Self::call`] (`Value::Null` for a `204`).
    pub async fn claim_next(&self, agent: &str, token: &str, body: Option<Value>) -> (u16, Value) {
        let path = format!("/api/v1/agents/{agent}/claim");
        self.call(reqwest::Method::POST, &path, Some(token), body)
            .await
    }

    /// [`Self::call`] with the admin token.
    pub async fn admin(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        self.call(method, path, Some(ADMIN_TOKEN), body).await
    }

    /// `GET path` with the admin token; returns status and JSON body as [`Self::call`].
    pub async fn admin_get(&self, path: &str) -> (u16, Value) {
        self.admin(reqwest::Method::GET, path, None).await
    }

    /// `GET path` without a token; returns status and JSON body as [`Self::call`].
    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.call(reqwest::Method::GET, path, None, None).await
    }

    /// `GET path` with `token`; returns status and JSON body as [`Self::call`].
    pub async fn get_as(&self, path: &str, token: &str) -> (u16, Value) {
        self.call(reqwest::Method::GET, path, Some(token), None)
            .await
    }

    /// `POST path` with the admin token and JSON `body`; returns status and JSON body as
    /// [`Self::call`].
    pub async fn admin_post(&self, path: &str, body: Value) -> (u16, Value) {
        self.admin(reqwest::Method::POST, path, Some(body)).await
    }

    /// Cancels work order `order` as the admin (`DELETE /api/v1/work-orders/{order}`,
    /// DESIGN.md §5); returns status and JSON body as [`Self::call`].
    pub async fn cancel(&self, order: &str) -> (u16, Value) {
        let path = format!("/api/v1/work-orders/{order}");
        self.admin(reqwest::Method::DELETE, &path, None).await
    }

    /// Retires agent `agent` as the admin (`DELETE /api/v1/agents/{agent}`, DESIGN.md §5);
    /// returns status and JSON body as [`Self::call`].
    pub async fn retire(&self, agent: &str) -> (u16, Value) {
        let path = format!("/api/v1/agents/{agent}");
        self.admin(reqwest::Method::DELETE, &path, None).await
    }

    /// Heartbeats work order `order` with the claim holder's `token` and `body`
    /// (`POST /api/v1/work-orders/{order}/heartbeat`, DESIGN.md §5); returns status and JSON body
    /// as [`Self::call`].
    pub async fn heartbeat(&self, order: &str, token: &str, body: Value) -> (u16, Value) {
        let path = format!("/api/v1/work-orders/{order}/heartbeat");
        self.call(reqwest::Method::POST, &path, Some(token), Some(body))
            .await
    }

    /// Claims work order `order` by id as `agent` with its `token`
    /// (`POST /api/v1/work-orders/{order}/claim`, docs/design.md §5); returns status and JSON body
    /// as [`Self::call`].
    pub async fn claim(&self, order: &str, agent: &str, token: &str) -> (u16, Value) {
        let path = format!("/api/v1/work-orders/{order}/claim");
        let body = serde_json::json!({ "agent_id": agent });
        self.call(reqwest::Method::POST, &path, Some(token), Some(body))
            .await
    }

    /// Completes work order `order` with the claim holder's `token` and the complete `body`
    /// (`POST /api/v1/work-orders/{order}/complete`, DESIGN.md §5); returns status and JSON
    /// body as [`Self::call`].
    pub async fn complete(&self, order: &str, token: &str, body: Value) -> (u16, Value) {
        let path = format!("/api/v1/work-orders/{order}/complete");
        self.call(reqwest::Method::POST, &path, Some(token), Some(body))
            .await
    }

    /// Waits up to `secs` seconds for work order `id` to reach the log; returns the entry.
    pub async fn log_entry(&self, id: &str, secs: u64) -> Value {
        eventually(secs, &format!("work order {id} in the log"), || async {
            let (st, v) = self
                .admin_get(&format!("/api/v1/work-order-log/{id}"))
                .await;
            (st == 200).then_some(v)
        })
        .await
    }

    /// Registers an agent; returns (id, token).
    pub async fn agent(&self, body: Value) -> (String, String) {
        let (status, v) = self.admin_post("/api/v1/agents", body).await;
        assert_eq!(status, 201, "{v}");
        (
            v["agent"]["id"].as_str().expect("agent.id").to_string(),
            v["token"].as_str().expect("token").to_string(),
        )
    }

    /// Creates a work order; returns its id.
    pub async fn order(&self, body: Value) -> String {
        let (status, v) = self.admin_post("/api/v1/work-orders", body).await;
        assert_eq!(status, 201, "{v}");
        v["id"].as_str().expect("id").to_string()
    }
}
