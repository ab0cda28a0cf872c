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
    modifiers(&BearerAuth)
)]
pub struct ApiDoc;

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
    match state.queue.count_by_status().await {
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
