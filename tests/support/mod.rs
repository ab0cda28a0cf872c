//! Test support: one throwaway PostgreSQL per test process (started on a free loopback port unless
//! `PULLMAN_TEST_DATABASE_URL` names one), a fresh migrated database per test, and an in-process
//! API server bound to an ephemeral port.
#![allow(dead_code)]

#[cfg(feature = "k8s-tests")]
pub mod kube;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use pullman::api::{self, AppState};
use pullman::auth::AdminToken;
use pullman::queue::{self, Notifications, Queue};
use pullman::telemetry::Metrics;
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;

pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789abcdef";

/// URL of the server-wide `postgres` database of the test PostgreSQL.
fn server_url() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        if let Ok(url) = std::env::var("PULLMAN_TEST_DATABASE_URL") {
            return url;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        // The server is started from a thread that lives as long as the process: the kernel
        // stops PostgreSQL (PR_SET_PDEATHSIG) when that thread dies, i.e. when the tests end.
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let root = std::env::temp_dir().join(format!("pullman-test-pg-{}", std::process::id()));
            clean_stale_dirs();
            let _ = std::fs::remove_dir_all(&root);
            let port = free_port();
            let pg = rt.block_on(pullman::postgres::EmbeddedPostgres::start(
                pullman::postgres::Options {
                    root,
                    listen: pullman::postgres::Listen::Loopback(port),
                    database: "postgres".into(),
                    bin_dir: None,
                    die_with_parent: true,
                },
            ));
            match pg {
                Ok(pg) => {
                    tx.send(Ok(pg.url())).unwrap();
                    loop {
                        std::thread::park();
                    }
                }
                Err(e) => tx.send(Err(format!("{e:#}"))).unwrap(),
            }
        });
        rx.recv()
            .unwrap()
            .unwrap_or_else(|e| panic!("could not start the test PostgreSQL: {e}"))
    })
}

/// Removes data directories of earlier test processes that are gone.
fn clean_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if let Some(pid) = name.strip_prefix("pullman-test-pg-")
            && let Ok(pid) = pid.parse::<u32>()
            && !std::path::Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A new, empty, migrated database for one test.
pub async fn fresh_pool(max_connections: u32) -> PgPool {
    let server = server_url();
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(server)
        .await
        .expect("connecting to the test PostgreSQL");
    let name = format!("t_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;
    let url = match server.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{name}"),
        None => unreachable!(),
    };
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&url)
        .await
        .unwrap();
    queue::MIGRATOR.run(&pool).await.unwrap();
    pool
}

/// A database URL for a fresh database (for processes started by the test).
pub async fn fresh_database_url() -> String {
    let pool = fresh_pool(1).await;
    let name: (String,) = sqlx::query_as("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    let server = server_url();
    let (base, _) = server.rsplit_once('/').unwrap();
    format!("{base}/{}", name.0)
}

/// An API server on an ephemeral port over a fresh database. Maintenance does not run on its own;
/// tests call `queue.maintain()` to make the reaper deterministic.
pub struct TestServer {
    pub base: String,
    pub queue: Queue,
    pub notifications: Notifications,
    pub pool: PgPool,
    pub http: reqwest::Client,
    pub metrics: Arc<Metrics>,
    pub shutdown: CancellationToken,
}

impl TestServer {
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

    pub async fn start_with(max_connections: u32, max_long_polls: usize) -> Self {
        Self::start_on(fresh_pool(max_connections).await, max_long_polls).await
    }

    /// A server over `pool`, wired as `serve` wires it (notification listener, availability
    /// probe); maintenance does not run.
    pub async fn start_on(pool: PgPool, max_long_polls: usize) -> Self {
        let queue = Queue::new(pool.clone());
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
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let stop = shutdown.clone();
        tokio::spawn(async move {
            axum::serve(listener, api::router(state))
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await
                .unwrap();
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

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Sends a request with an optional bearer token and JSON body; returns status and JSON body
    /// (`Value::Null` when empty).
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
        let text = resp.text().await.unwrap();
        let value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        (status, value)
    }

    pub async fn admin(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        self.call(method, path, Some(ADMIN_TOKEN), body).await
    }

    /// Waits up to `secs` seconds for work order `id` to reach the log; returns the entry.
    pub async fn log_entry(&self, id: &str, secs: u64) -> Value {
        eventually(secs, &format!("work order {id} in the log"), || async {
            let (st, v) = self
                .admin(
                    reqwest::Method::GET,
                    &format!("/api/v1/work-order-log/{id}"),
                    None,
                )
                .await;
            (st == 200).then_some(v)
        })
        .await
    }

    /// Registers an agent; returns (id, token).
    pub async fn agent(&self, body: Value) -> (String, String) {
        let (status, v) = self
            .admin(reqwest::Method::POST, "/api/v1/agents", Some(body))
            .await;
        assert_eq!(status, 201, "{v}");
        (
            v["agent"]["id"].as_str().unwrap().to_string(),
            v["token"].as_str().unwrap().to_string(),
        )
    }

    /// Creates a work order; returns its id.
    pub async fn order(&self, body: Value) -> String {
        let (status, v) = self
            .admin(reqwest::Method::POST, "/api/v1/work-orders", Some(body))
            .await;
        assert_eq!(status, 201, "{v}");
        v["id"].as_str().unwrap().to_string()
    }
}

/// The `pullman` binary built for these tests.
pub fn pullman_bin() -> &'static str {
    env!("CARGO_BIN_EXE_pullman")
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
