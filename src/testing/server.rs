//! The API server in-process, over a fresh database, and request helpers for tests.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::fresh_pool;
use crate::api::{self, AppState};
use crate::auth::AdminToken;
use crate::queue::{self, Notifications, Queue};
use crate::telemetry::Metrics;

/// The admin token of every [`TestServer`].
pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789abcdef";

/// An API server on an ephemeral port over one database, wired as `serve` wires it
/// (notification listener, availability probe). Maintenance does not run on its own unless
/// started with [`TestServer::start_maintained`]; tests call `queue.maintain()` to make the
/// reaper deterministic. Dropping it stops the server.
pub struct TestServer {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    pub queue: Queue,
    pub notifications: Notifications,
    pub pool: PgPool,
    pub http: reqwest::Client,
    pub metrics: Arc<Metrics>,
    pub shutdown: CancellationToken,
}

impl TestServer {
    /// A server over a fresh database (64 connections, 1024 long-polls).
    pub async fn start() -> Self {
        Self::start_with(64, 1024).await
    }

    /// A server whose maintenance (reaper, retry promotion) runs every second, as `serve` does.
    pub async fn start_maintained() -> Self {
        let s = Self::start().await;
        tokio::spawn(queue::run_maintenance(
            s.queue.clone(),
            Duration::from_secs(1),
            None,
            s.shutdown.clone(),
            |_| {},
        ));
        s
    }

    /// A server over a fresh database of `max_connections`, admitting `max_long_polls`.
    pub async fn start_with(max_connections: u32, max_long_polls: usize) -> Self {
        Self::start_on(fresh_pool(max_connections).await, max_long_polls).await
    }

    /// A server over a fresh database with these output settings (docs/design.md §9).
    pub async fn start_with_output(output: api::OutputSettings) -> Self {
        Self::start_on_with(fresh_pool(64).await, 1024, output).await
    }

    /// A server over `pool` (migrated), admitting `max_long_polls`.
    pub async fn start_on(pool: PgPool, max_long_polls: usize) -> Self {
        Self::start_on_with(pool, max_long_polls, api::OutputSettings::default()).await
    }

    /// [`Self::start_with`] with `complete_batch` as `serve --complete-batch` (1: no group
    /// commit); the others take serve's default.
    pub async fn start_with_batch(
        max_connections: u32,
        max_long_polls: usize,
        complete_batch: usize,
    ) -> Self {
        let pool = fresh_pool(max_connections).await;
        Self::start_full(pool, max_long_polls, Default::default(), complete_batch).await
    }

    /// [`Self::start_on`] with output settings.
    pub async fn start_on_with(
        pool: PgPool,
        max_long_polls: usize,
        output: api::OutputSettings,
    ) -> Self {
        let batch = crate::queue::limits::COMPLETE_BATCH_DEFAULT as usize;
        Self::start_full(pool, max_long_polls, output, batch).await
    }

    async fn start_full(
        pool: PgPool,
        max_long_polls: usize,
        output: api::OutputSettings,
        complete_batch: usize,
    ) -> Self {
        let queue = Queue::new(pool.clone()).with_group_commit(complete_batch);
        let notifications = Notifications::new();
        let shutdown = CancellationToken::new();
        queue::spawn_listener(&queue, notifications.clone(), shutdown.clone());
        queue::spawn_availability_probe(queue.clone(), shutdown.clone());
        let metrics = Arc::new(Metrics::new());
        let state = AppState::new(
            queue.clone(),
            AdminToken::from_secret(ADMIN_TOKEN),
            metrics.clone(),
            notifications.clone(),
            max_long_polls,
        )
        .with_output(output);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding an ephemeral port");
        let base = format!(
            "http://{}",
            listener.local_addr().expect("the listener's address")
        );
        let stop = shutdown.clone();
        tokio::spawn(async move {
            axum::serve(listener, api::router(state))
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await
                .expect("the in-process server");
        });
        // Let the LISTEN connection come up before tests rely on wake-ups.
        tokio::time::sleep(Duration::from_millis(200)).await;
        TestServer {
            base,
            queue,
            notifications,
            pool,
            http: reqwest::Client::new(),
            metrics,
            shutdown,
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

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Polls `check` every 100 ms until it returns `Some`, or panics after `secs` seconds naming `what`.
pub async fn eventually<T, F, Fut>(secs: u64, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {secs} s waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A ConfigMap-only custom order targeted at `label`.
pub fn configmap_order(label: &str) -> Value {
    json!({
        "work_type": "custom",
        "yaml_content": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: demo\ndata:\n  a: b\n",
        "targeting": {"labels": [label]}
    })
}
