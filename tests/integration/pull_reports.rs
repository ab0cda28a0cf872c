//! How the pull loop reports (`pullman::pull::report`, issue #34): the verdicts of orders that
//! finish together go in one batch complete, and a server without that route gets single
//! completes. The loop talks to a real server through a proxy that counts (and, for the older
//! server, refuses) the requests; every order must reach the log once either way.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use pullman::client::Client;
use pullman::pull::{self, Carrier, LoopConfig, Shutdown, Verdict};
use pullman::testing::TestServer;
use pullman::wire::WorkOrder;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// How the proxy answers the batch complete.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Batches {
    /// Forwarded to the server.
    Served,
    /// `404 not_found`, as a server older than the route.
    Missing,
    /// `400 invalid_field`, as a server refusing the batch as a whole.
    Refused,
}

/// Forwards every request to the real server, counting the completes; the batch complete as
/// `batches` says.
struct Proxy {
    upstream: String,
    http: reqwest::Client,
    batches_answer: Batches,
    singles: AtomicUsize,
    batches: AtomicUsize,
    batched_items: AtomicUsize,
}

async fn forward(State(proxy): State<Arc<Proxy>>, req: axum::extract::Request) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let post = parts.method == axum::http::Method::POST;
    if post && path.starts_with("/api/v1/agents/") && path.ends_with("/complete") {
        proxy.batches.fetch_add(1, Ordering::SeqCst);
        let (status, code) = match proxy.batches_answer {
            Batches::Served => (StatusCode::OK, ""),
            Batches::Missing => (StatusCode::NOT_FOUND, "not_found"),
            Batches::Refused => (StatusCode::BAD_REQUEST, "invalid_field"),
        };
        if status != StatusCode::OK {
            let error = json!({"error": {"code": code, "message": "refused by the test's proxy"}});
            return (status, axum::Json(error)).into_response();
        }
        let batch: Value = serde_json::from_slice(&bytes).unwrap();
        let items = batch["completes"].as_array().unwrap().len();
        proxy.batched_items.fetch_add(items, Ordering::SeqCst);
    } else if post && path.starts_with("/api/v1/work-orders/") && path.ends_with("/complete") {
        proxy.singles.fetch_add(1, Ordering::SeqCst);
    }
    let mut request = proxy
        .http
        .request(parts.method.clone(), format!("{}{path}", proxy.upstream))
        .body(bytes);
    for (name, value) in &parts.headers {
        if name != header::HOST && name != header::CONTENT_LENGTH {
            request = request.header(name, value);
        }
    }
    let answer = request.send().await.unwrap();
    let status = answer.status();
    let content_type = answer.headers().get(header::CONTENT_TYPE).cloned();
    let body = answer.bytes().await.unwrap();
    let mut response = (status, body).into_response();
    if let Some(content_type) = content_type {
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, content_type);
    }
    response
}

/// Starts a [`Proxy`] in front of `server`; returns it and its base URL.
async fn proxy(server: &TestServer, batches_answer: Batches) -> (Arc<Proxy>, String) {
    let proxy = Arc::new(Proxy {
        upstream: server.base.clone(),
        http: reqwest::Client::new(),
        batches_answer,
        singles: AtomicUsize::new(0),
        batches: AtomicUsize::new(0),
        batched_items: AtomicUsize::new(0),
    });
    let app = axum::Router::new()
        .fallback(forward)
        .with_state(proxy.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (proxy, base)
}

/// Work that is done as soon as it starts: every fifth order fails for good, the others
/// succeed. Drains the loop once `all` orders were handed out.
struct Instant {
    given: AtomicUsize,
    all: usize,
    drain: CancellationToken,
}

impl Carrier for Instant {
    type Started = usize;

    async fn start(&self, _: &WorkOrder, _: &CancellationToken) -> Result<usize, Verdict> {
        let n = self.given.fetch_add(1, Ordering::SeqCst) + 1;
        if n >= self.all {
            self.drain.cancel();
        }
        Ok(n)
    }

    async fn finish(
        &self,
        _: &WorkOrder,
        n: usize,
        _: &CancellationToken,
        _: &pull::Progress,
    ) -> Verdict {
        if n.is_multiple_of(5) {
            Verdict::Failure {
                message: "broken".into(),
                retryable: false,
            }
        } else {
            Verdict::Success {
                message: "done".into(),
            }
        }
    }
}

/// One agent of 16 slots works `orders` orders through a proxy answering batches as `batches`;
/// returns the proxy once the loop has ended, after checking that every order is in the log
/// once, a fifth of them failed.
async fn work_through_proxy(orders: usize, batches: Batches) -> Arc<Proxy> {
    let server = TestServer::start_with(40, 1024).await;
    let (proxy, base) = proxy(&server, batches).await;
    let (agent, token) = server
        .agent(json!({"name": "reporter", "labels": ["reports"]}))
        .await;
    for _ in 0..orders {
        server
            .order(pullman::testing::configmap_order("reports"))
            .await;
    }
    let shutdown = Shutdown::default();
    let carrier = Arc::new(Instant {
        given: AtomicUsize::new(0),
        all: orders,
        drain: shutdown.drain.clone(),
    });
    let config = LoopConfig {
        agent_id: agent.parse().unwrap(),
        work_types: Vec::new(),
        lease_seconds: 60,
        concurrency: 16,
        max_wait_seconds: 1,
        heartbeat_every: None,
    };
    let client = Client::new(&base, &token).unwrap();
    tokio::time::timeout(
        std::time::Duration::from_secs(120),
        pull::run(client, config, carrier, shutdown),
    )
    .await
    .expect("the loop did not finish within 120 s")
    .unwrap();
    let (logged, distinct, failed): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT id), count(*) FILTER (WHERE outcome = 'failed') \
         FROM work_order_log",
    )
    .fetch_one(&server.pool)
    .await
    .unwrap();
    assert_eq!(
        (logged, distinct, failed),
        (orders as i64, orders as i64, (orders / 5) as i64),
        "every order logged once, a fifth failed"
    );
    proxy
}

/// Orders that finish together are reported together: some completes went in batches, and every
/// order was reported exactly once (one request carried it, in a healthy run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_that_finish_together_are_reported_in_one_request() {
    const ORDERS: usize = 320;
    let proxy = work_through_proxy(ORDERS, Batches::Served).await;
    let singles = proxy.singles.load(Ordering::SeqCst);
    let batches = proxy.batches.load(Ordering::SeqCst);
    let batched = proxy.batched_items.load(Ordering::SeqCst);
    assert_eq!(
        singles + batched,
        ORDERS,
        "each order reported once: {singles} alone, {batched} in {batches} batches"
    );
    assert!(
        batches >= 1 && batched > batches,
        "no report shared a request: {singles} alone, {batched} in {batches} batches"
    );
}

/// A server without the batch route (`404`, older than the agent): the agent reports each order
/// alone from then on, having tried a batch at most once per runner, and loses none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_batch_completes_gets_single_ones_and_loses_nothing() {
    const ORDERS: usize = 160;
    let proxy = work_through_proxy(ORDERS, Batches::Missing).await;
    let batches = proxy.batches.load(Ordering::SeqCst);
    assert!(
        (1..=pull::report::RUNNERS).contains(&batches),
        "the batch route was tried {batches} times (once at least, then no more after its 404)"
    );
    assert_eq!(proxy.singles.load(Ordering::SeqCst), ORDERS);
}

/// A batch refused as a whole (`400`): its reports go again as single completes, each batch
/// alike, and no order is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_batch_is_sent_again_as_single_completes() {
    const ORDERS: usize = 160;
    let proxy = work_through_proxy(ORDERS, Batches::Refused).await;
    let batches = proxy.batches.load(Ordering::SeqCst);
    let singles = proxy.singles.load(Ordering::SeqCst);
    assert_eq!(singles, ORDERS, "every order reported alone once");
    assert!(batches >= 1, "no batch was tried: {singles} singles");
}
