//! The API server in-process, over a fresh database.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::api::{ADMIN_TOKEN, ApiClient};
use super::fresh_pool;
use crate::api::{self, AppState};
use crate::auth::AdminToken;
use crate::queue::{self, Notifications, Queue};
use crate::telemetry::Metrics;

/// An API server on an ephemeral port over one database, wired as `serve` wires it
/// (notification listener, availability probe). Maintenance does not run on its own unless
/// started with [`TestServer::start_maintained`]; tests call `queue.maintain()` to make the
/// reaper deterministic. Dropping it stops the server.
pub struct TestServer {
    /// The server's address (`base`) and the request helpers, reached through `Deref`.
    pub api: ApiClient,
    pub queue: Queue,
    pub notifications: Notifications,
    pub pool: PgPool,
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
    /// commit, and no group claims either: nothing batched); the others take serve's default.
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
        let claim_batch = if complete_batch > 1 {
            crate::queue::limits::CLAIM_BATCH_DEFAULT as usize
        } else {
            1
        };
        let queue = Queue::new(pool.clone())
            .with_group_commit(complete_batch)
            .with_group_claims(claim_batch);
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
            api: ApiClient::new(&base),
            queue,
            notifications,
            pool,
            metrics,
            shutdown,
        }
    }

    /// `GET /metrics` as text, after computing the database gauges now (`queue::gauges`, which
    /// `serve` does in the background every `--gauge-refresh-seconds`), so the scrape reports the
    /// queue as the test left it.
    pub async fn scrape(&self) -> String {
        let computed = self
            .queue
            .refresh_gauges(Duration::ZERO, crate::telemetry::tenants::TOP_TENANTS)
            .await
            .expect("computing the database gauges");
        assert!(
            computed,
            "the gauges' turn was free: nothing else computes them here"
        );
        let r = self.http.get(self.url("/metrics")).send().await;
        r.expect("GET /metrics").text().await.expect("its text")
    }
}

impl std::ops::Deref for TestServer {
    type Target = ApiClient;

    fn deref(&self) -> &ApiClient {
        &self.api
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
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
