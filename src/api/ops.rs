//! Operational routes: `/healthz`, `/readyz`, `/metrics`, `/api/v1/openapi.json` (DESIGN.md §5).

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};

use super::{ApiError, AppState, agents, claims, work_orders};
use crate::telemetry::{HealthLabel, StatusLabel};

/// The OpenAPI 3.1 description of every route, generated from the handlers' annotations.
#[derive(OpenApi)]
#[openapi(
    info(title = "Pullman", description = "Pull-based work-order queue (DESIGN.md §5)"),
    paths(
        work_orders::create, work_orders::list, work_orders::get_one, work_orders::cancel,
        work_orders::list_log, work_orders::get_log,
        agents::register, agents::list, agents::get_one, agents::rotate_token, agents::retire,
        agents::pending, agents::whoami,
        claims::claim, claims::claim_next, claims::heartbeat, claims::complete,
        healthz, readyz, metrics, openapi,
    ),
    modifiers(&BearerAuth, &CommonAnswers)
)]
pub struct ApiDoc;

/// Answers every route of a kind can give, added where a route's own annotation leaves them out,
/// so the document describes the server (generated clients and schemathesis rely on it):
/// `400 invalid_path` and `404` on routes with an id, `400 malformed_json`, `415` and `422` on
/// routes with a JSON body, `401`/`403` on authenticated routes, `503 database_unavailable` on
/// every route that needs the database.
struct CommonAnswers;

impl utoipa::Modify for CommonAnswers {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        let error = |description: &str| {
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("ErrorBody")))
                        .build(),
                )
                .build()
        };
        for (path, item) in openapi.paths.paths.iter_mut() {
            let needs_database = path.starts_with("/api/v1/") && path != "/api/v1/openapi.json";
            let has_id = path.contains('{');
            for op in [&mut item.get, &mut item.post, &mut item.delete]
                .into_iter()
                .flatten()
            {
                let has_body = op.request_body.is_some();
                let authenticated = op.security.as_ref().is_some_and(|s| !s.is_empty());
                let answers = &mut op.responses.responses;
                let mut add = |status: &str, description: &str| {
                    answers
                        .entry(status.to_string())
                        .or_insert_with(|| error(description).into());
                };
                if has_id || has_body {
                    add(
                        "400",
                        "`invalid_path` (an id is not a UUID), `malformed_json`, or a field out of bounds",
                    );
                }
                if has_id {
                    add("404", "`not_found`: no such id");
                }
                if has_body {
                    add(
                        "415",
                        "`unsupported_media_type`: no `Content-Type: application/json`",
                    );
                    add(
                        "422",
                        "`invalid_body`: wrong JSON types, missing or unknown fields",
                    );
                }
                if authenticated {
                    add("401", "`unauthorized`: missing or bad bearer token");
                    add("403", "`forbidden`: the token may not do this");
                }
                if needs_database {
                    add(
                        "503",
                        "`database_unavailable`: retry after `Retry-After` seconds",
                    );
                }
            }
        }
    }
}

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Process liveness.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, description = "alive")))]
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// Readiness: database reachable and migrations applied.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses((status = 200, description = "ready"), (status = 503, description = "not ready, with the reason")))]
pub async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    match state.queue.readiness().await {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
    }
}

/// Prometheus metrics (text exposition format).
#[utoipa::path(get, path = "/metrics", tag = "operations", responses((status = 200, description = "Prometheus text")))]
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    // While the database is known down, serve the counters without waiting on it.
    let counts = if state.queue.database_known_down() {
        Err(crate::queue::QueueError::Unavailable(
            sqlx::Error::PoolTimedOut,
        ))
    } else {
        state.queue.count_by_status().await
    };
    match counts {
        Ok(counts) => {
            for status in ["PENDING", "CLAIMED", "RETRY_PENDING"] {
                let n = counts
                    .iter()
                    .find(|(s, _)| s == status)
                    .map_or(0, |(_, n)| *n);
                state
                    .metrics
                    .work_orders
                    .get_or_create(&StatusLabel {
                        status: status.to_string(),
                    })
                    .set(n);
            }
        }
        Err(error) => tracing::warn!(%error, "could not count work orders for /metrics"),
    }
    match state.queue.oldest_claimable_age().await {
        Ok(age) => {
            state.metrics.queue_lag.set(age);
        }
        Err(error) => tracing::warn!(%error, "could not read the queue lag for /metrics"),
    }
    match state.queue.count_agents_by_health().await {
        Ok(c) => {
            for (health, n) in [
                ("never_seen", c.never_seen),
                ("active", c.active),
                ("stale", c.stale),
            ] {
                state
                    .metrics
                    .agents
                    .get_or_create(&HealthLabel {
                        health: health.to_string(),
                    })
                    .set(n);
            }
        }
        Err(error) => tracing::warn!(%error, "could not count agents for /metrics"),
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}

/// This document.
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "operations", responses((status = 200, description = "OpenAPI 3.1 JSON")))]
pub async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}

/// Unknown routes answer in the API's error body.
pub async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}
