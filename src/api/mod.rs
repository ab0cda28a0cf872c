//! The REST API (docs/design.md §5): JSON over HTTP under `/api/v1`, plus `/healthz`, `/readyz`,
//! `/metrics` and `/api/v1/openapi.json`.

mod agents;
pub mod backlog;
mod claims;
mod completes;
pub mod error;
mod ops;
mod output;
mod pages;
mod work_orders;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRequestParts, MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

pub use agents::WhoAmI;
pub use claims::{ClaimBody, ClaimNextBody, CompleteBody, HeartbeatBody, RetryScheduled};
pub use error::{ApiError, DatabaseUnavailable, ErrorBody};
pub use ops::ApiDoc;

use crate::auth::{AdminToken, Principal, VerifiedTokens, authenticate};
use crate::queue::{Notifications, Queue};
use crate::telemetry::{HttpLabels, Metrics, RouteLabel};

/// Largest request body accepted, in bytes. Above `yaml_content`'s 1 MiB limit so that an
/// oversized YAML is answered with a `413` naming the field; JSON escaping can inflate a body.
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// `serve --request-timeout-seconds`' default (seconds: 60).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Everything a request handler needs. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub queue: Queue,
    pub admin: AdminToken,
    /// Agent tokens verified a moment ago (`auth::cache`).
    pub verified_tokens: Arc<VerifiedTokens>,
    pub metrics: Arc<Metrics>,
    pub notifications: Notifications,
    /// Permits for concurrently held long-polls; past them claim-next answers `503`.
    pub long_polls: Arc<Semaphore>,
    /// Settings of order output (docs/design.md §9): the per-order cap and the bound on concurrent
    /// output writes (past it `POST …/output` answers `429`).
    pub output: OutputSettings,
    /// Permits for concurrent output writes (`OutputSettings::max_writes`).
    pub output_writes: Arc<Semaphore>,
    /// Permits for open `follow=true` streams (`OutputSettings::max_followers`).
    pub output_followers: Arc<Semaphore>,
    /// Cancelled when the process starts to stop (`serve --shutdown-delay-seconds`): `/readyz`
    /// answers `503` from then on while every other route keeps answering.
    pub stopping: CancellationToken,
    /// Longest an `/api/v1` request goes unanswered apart from a long-poll's wait
    /// (`serve --request-timeout-seconds`; [`database_gate`]).
    pub request_timeout: Duration,
}

impl AppState {
    /// State for a server allowing `max_long_polls` concurrent claim-next waits.
    pub fn new(
        queue: Queue,
        admin: AdminToken,
        metrics: Arc<Metrics>,
        notifications: Notifications,
        max_long_polls: usize,
    ) -> Self {
        AppState {
            queue,
            admin,
            verified_tokens: Default::default(),
            metrics,
            notifications,
            long_polls: Arc::new(Semaphore::new(max_long_polls)),
            output: OutputSettings::default(),
            output_writes: Arc::new(Semaphore::new(OutputSettings::default().max_writes)),
            output_followers: Arc::new(Semaphore::new(OutputSettings::default().max_followers)),
            stopping: CancellationToken::new(),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        }
    }

    /// The same state, reporting not ready once `stopping` is cancelled.
    pub fn with_stopping(mut self, stopping: CancellationToken) -> Self {
        self.stopping = stopping;
        self
    }

    /// The same state answering `503` past `timeout` (`serve --request-timeout-seconds`).
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The same state with other output settings.
    pub fn with_output(mut self, output: OutputSettings) -> Self {
        self.output_writes = Arc::new(Semaphore::new(output.max_writes));
        self.output_followers = Arc::new(Semaphore::new(output.max_followers));
        self.output = output;
        self
    }
}

/// Settings of order output (docs/design.md §9; `serve --output-cap-bytes`, `--max-output-writes`,
/// `--max-output-followers`).
#[derive(Debug, Clone, Copy)]
pub struct OutputSettings {
    /// Bytes of line text kept per order; past it the oldest chunks are dropped.
    pub cap_bytes: u64,
    /// Output chunks stored at once; past it `429` with `Retry-After`, so output never takes
    /// the connections claims need.
    pub max_writes: usize,
    /// Open `follow=true` streams of this replica; past it `503 too_many_followers` with
    /// `Retry-After`, so followers cannot take the memory and the database reads claims need.
    pub max_followers: usize,
}

impl Default for OutputSettings {
    fn default() -> Self {
        OutputSettings {
            cap_bytes: crate::queue::output::DEFAULT_OUTPUT_CAP_BYTES,
            max_writes: crate::queue::limits::MAX_OUTPUT_WRITES_DEFAULT as usize,
            max_followers: crate::queue::limits::MAX_FOLLOWERS_DEFAULT as usize,
        }
    }
}

/// The authenticated caller of a request (`401` when the token is missing or bad).
pub struct Caller(pub Principal);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        Ok(Caller(
            authenticate(header, &state.admin, &state.verified_tokens, &state.queue).await?,
        ))
    }
}

/// The caller of an admin route, proven to hold the admin token: `401` without a valid token,
/// `403 forbidden` for an agent's (docs/design.md §4). A handler that takes it cannot forget
/// the check; the `401`/`403` answers of every authenticated route are documented once, by
/// `ops::CommonAnswers`.
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let Caller(caller) = Caller::from_request_parts(parts, state).await?;
        caller.require_admin()?;
        Ok(Admin)
    }
}

/// Builds the router with every route of docs/design.md §5.
pub fn router(state: AppState) -> Router {
    let api = Router::new()
        .route(
            "/work-orders",
            post(work_orders::create).get(work_orders::list),
        )
        .route(
            "/work-orders/{id}",
            get(work_orders::get_one).delete(work_orders::cancel),
        )
        .route("/work-orders/{id}/claim", post(claims::claim))
        .route("/work-orders/{id}/heartbeat", post(claims::heartbeat))
        .route("/work-orders/{id}/complete", post(claims::complete))
        .route("/work-orders/{id}/explain", get(work_orders::explain))
        .route("/work-orders/{id}/attempts", get(work_orders::attempts))
        .route("/work-orders/{id}/rerun", post(work_orders::rerun))
        .route(
            "/work-orders/{id}/output",
            post(output::append).get(output::read),
        )
        .route("/work-order-log", get(work_orders::list_log))
        .route("/work-order-log/{id}", get(work_orders::get_log))
        .route("/agents", post(agents::register).get(agents::list))
        .route("/agents/{id}", get(agents::get_one).delete(agents::retire))
        .route("/agents/{id}/token", post(agents::rotate_token))
        .route("/agents/{id}/work-orders/pending", get(agents::pending))
        .route("/agents/me/backlog", get(backlog::own))
        .route("/agents/{id}/backlog", get(backlog::agent))
        .route("/backlog", get(backlog::profile))
        .route("/agents/{id}/claim", post(claims::claim_next))
        .route("/agents/{id}/complete", post(completes::complete_many))
        .route("/whoami", get(agents::whoami))
        .route("/openapi.json", get(ops::openapi));
    Router::new()
        .nest("/api/v1", api)
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .fallback(ops::not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            database_gate,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            record_http_metrics,
        ))
        .with_state(state)
}

/// docs/design.md §5: a database that is down answers `503 database_unavailable` "at once once the
/// outage is known". Requests under `/api/v1` (all need the database, except the OpenAPI
/// document) are answered without touching the pool while the queue knows the database is
/// down; an answer that found it unavailable tells the queue, whose prober clears the mark.
/// A request unanswered after `request_timeout` (plus the long-poll's longest wait for a
/// claim-next) is answered `503` too and tells the queue the same: its handler is dropped, and
/// with it its wait on a database that acknowledges but does not answer (`db_keepalive` ends
/// the waits on one that is gone).
async fn database_gate(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let needs_database = path.starts_with("/api/v1/") && path != "/api/v1/openapi.json";
    if !needs_database {
        return next.run(req).await;
    }
    if state.queue.database_known_down() {
        return ApiError::database_unavailable().into_response();
    }
    let claim_next = req.method() == axum::http::Method::POST
        && path.starts_with("/api/v1/agents/")
        && path.ends_with("/claim");
    let bound = if claim_next {
        state.request_timeout + Duration::from_secs(crate::queue::limits::MAX_WAIT_SECONDS.into())
    } else {
        state.request_timeout
    };
    let uri = req.uri().clone();
    let response = match tokio::time::timeout(bound, next.run(req)).await {
        Ok(response) => response,
        Err(_) => {
            tracing::warn!(
                route = uri.path(),
                seconds = bound.as_secs(),
                "a request went unanswered: answered 503, the database taken for down"
            );
            let mut e = ApiError::database_unavailable();
            e.message = format!(
                "no answer within {} s: the database is not answering; retry later",
                bound.as_secs()
            );
            e.into_response()
        }
    };
    if response.extensions().get::<DatabaseUnavailable>().is_some() {
        state.queue.note_database_unavailable();
    }
    response
}

/// Counts every request by method, matched route and status, and times it. The route label is
/// the template, so ids never become label values.
async fn record_http_metrics(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".to_string());
    let method = req.method().to_string();
    let started = Instant::now();
    let response = next.run(req).await;
    let labels = HttpLabels {
        method,
        route: route.clone(),
        status: response.status().as_u16(),
    };
    state.metrics.http_requests.get_or_create(&labels).inc();
    state
        .metrics
        .http_duration
        .get_or_create(&RouteLabel { route })
        .observe(started.elapsed().as_secs_f64());
    response
}
