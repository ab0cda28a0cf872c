//! The agent side of the pull protocol (docs/design.md §5): claim by id, claim-next with long-poll,
//! heartbeat, complete.

use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use uuid::Uuid;

use super::error::{ApiJson, ApiPath, parse_optional_json};
use super::{ApiError, AppState, Caller, ErrorBody};
use crate::queue::limits::{self, MAX_WAIT_SECONDS};
use crate::queue::validate::{parse_work_type, validate_claim_waiting, validate_lease};
use crate::queue::{
    ClaimRequest, Completion, CompletionResult, Heartbeat, LogEntry, WorkOrder, WorkType,
};
pub use crate::wire::{
    ClaimBody, ClaimNextBody, ClaimedOrders, CompleteBody, HeartbeatBody, RetryScheduled,
};

fn claimed(state: &AppState, order: &WorkOrder, started: Instant) {
    state.metrics.claims.inc();
    state
        .metrics
        .claim_duration
        .observe(started.elapsed().as_secs_f64());
    if let Some(at) = order.claimed_at {
        let wait = (at - order.created_at).num_microseconds().unwrap_or(0) as f64 / 1e6;
        state.metrics.queue_wait.observe(wait.max(0.0));
        state
            .metrics
            .tenants
            .observe_wait(order.tenant.as_deref(), wait.max(0.0));
    }
    let agent = order.claimed_by.map(|a| a.to_string()).unwrap_or_default();
    let claim = order.claim_id.map(|c| c.to_string()).unwrap_or_default();
    tracing::info!(work_order = %order.id, %agent, %claim, "work order claimed");
}

/// How long claim-next waits for `max_wait_seconds` (docs/design.md §5): not at all when absent
/// or 0, at most [`MAX_WAIT_SECONDS`] (a longer ask is capped, not refused), and `400
/// invalid_field` naming the field when negative.
fn long_poll_wait(max_wait_seconds: Option<i64>) -> Result<Duration, ApiError> {
    match max_wait_seconds {
        None | Some(0) => Ok(Duration::ZERO),
        Some(s) if s < 0 => Err(ApiError::bad_request(
            "invalid_field",
            format!("max_wait_seconds must be between 0 and {MAX_WAIT_SECONDS}, got {s}"),
        )),
        Some(s) => Ok(Duration::from_secs(
            (s as u64).min(u64::from(MAX_WAIT_SECONDS)),
        )),
    }
}

/// Claim one work order by id.
#[utoipa::path(post, path = "/api/v1/work-orders/{id}/claim", tag = "claims",
    params(("id" = Uuid, Path, description = "Work order id")), request_body = ClaimBody,
    responses(
        (status = 200, description = "Claimed: the full order with claim_id, claimed_at, lease_seconds, lease_expires_at, claim_timeout_seconds", body = WorkOrder),
        (status = 404, description = "Unknown or not visible to this agent", body = ErrorBody),
        (status = 409, description = "Not claimable now: `already_claimed`, `backing_off`, `max_concurrency`", body = ErrorBody),
        (status = 400, body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn claim(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<Uuid>,
    ApiJson(body): ApiJson<ClaimBody>,
) -> Result<Json<WorkOrder>, ApiError> {
    caller.require_agent(body.agent_id)?;
    let started = Instant::now();
    let req = ClaimRequest {
        agent_id: body.agent_id,
        lease_seconds: validate_lease(body.lease_seconds)?,
    };
    let order = state.queue.claim(id, &req).await?;
    claimed(&state, &order, started);
    Ok(Json(order))
}

/// Claim the next eligible work order (or, with `max_orders`, up to that many), waiting up to
/// `max_wait_seconds` (cap 30) for one. Hand-out order: the tenant served least recently first
/// (orders without a tenant are one tenant), then `priority` (higher first), then the oldest.
#[utoipa::path(post, path = "/api/v1/agents/{id}/claim", tag = "claims",
    params(("id" = Uuid, Path, description = "Agent id")), request_body = ClaimNextBody,
    responses(
        (status = 200, description = "Claimed: the full order; with `max_orders`, `{orders: [...]}` holding one to `max_orders` full orders, each with its own claim_id", body = ClaimAnswer),
        (status = 204, description = "Nothing eligible within the wait (or the server is stopping)"),
        (status = 404, description = "`not_found`: unknown agent", body = ErrorBody),
        (status = 409, description = "`agent_retired`: the agent was retired", body = ErrorBody),
        (status = 503, description = "`too_many_long_polls` or `database_unavailable`; retry after `Retry-After` seconds", body = ErrorBody),
        (status = 400, body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn claim_next(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(agent_id): ApiPath<Uuid>,
    body: Bytes,
) -> Result<Response, ApiError> {
    caller.require_agent(agent_id)?;
    let started = Instant::now();
    let body: ClaimNextBody = parse_optional_json(&body)?;
    let work_types: Vec<WorkType> = body
        .work_types
        .unwrap_or_default()
        .iter()
        .map(|t| parse_work_type("work_types", t))
        .collect::<Result<_, _>>()?;
    let wait = long_poll_wait(body.max_wait_seconds)?;
    let req = ClaimRequest {
        agent_id,
        lease_seconds: validate_lease(body.lease_seconds)?,
    };
    let max_orders = limits::MAX_ORDERS.check_optional(body.max_orders)?;

    let _permit = if wait.is_zero() {
        None
    } else {
        match state.long_polls.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                let mut e = ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "too_many_long_polls",
                    "the server holds its maximum of concurrent long-polls; retry shortly",
                );
                e.retry_after = Some(1);
                return Err(e);
            }
        }
    };
    let _waiting = _permit.as_ref().map(|_| LongPollGauge::enter(&state));

    let mut orders = state
        .queue
        .claim_next_waiting(
            &req,
            &work_types,
            max_orders.map_or(1, |n| n as usize),
            wait,
            &state.notifications,
        )
        .await?;
    for order in &orders {
        claimed(&state, order, started);
    }
    let answer = match (max_orders, orders.pop()) {
        (_, None) => return Ok(StatusCode::NO_CONTENT.into_response()),
        (None, Some(order)) => ClaimAnswer::Order(Box::new(order)),
        (Some(_), Some(last)) => {
            orders.push(last);
            ClaimAnswer::Orders(ClaimedOrders { orders })
        }
    };
    Ok(Json(answer).into_response())
}

/// The two shapes of a claim-next `200`: the order itself, or the list a multi-claim
/// (`max_orders`) asked for.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ClaimAnswer {
    Order(Box<WorkOrder>),
    Orders(ClaimedOrders),
}

/// Keeps `pullman_long_polls` in step with the waits in flight, also when a client disconnects.
struct LongPollGauge(std::sync::Arc<crate::telemetry::Metrics>);

impl LongPollGauge {
    fn enter(state: &AppState) -> Self {
        state.metrics.long_polls.inc();
        LongPollGauge(state.metrics.clone())
    }
}

impl Drop for LongPollGauge {
    fn drop(&mut self) {
        self.0.long_polls.dec();
    }
}

/// Extend the lease of a claim, saying what holds the order up (`waiting`, docs/design.md §12).
#[utoipa::path(post, path = "/api/v1/work-orders/{id}/heartbeat", tag = "claims",
    params(("id" = Uuid, Path, description = "Work order id")), request_body = HeartbeatBody,
    responses((status = 200, description = "Lease extended: its new end and the claim's hard end", body = Heartbeat),
        (status = 400, description = "`invalid_field`: `waiting` gives a reason other than `node_unreachable`, or a text past its bound (the field is named); an unknown reason is `422`", body = ErrorBody),
        (status = 409, description = "`cancelled`, `reclaimed` or `not_claim_holder`: stop working on it", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn heartbeat(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<Uuid>,
    ApiJson(body): ApiJson<HeartbeatBody>,
) -> Result<Json<Heartbeat>, ApiError> {
    caller.require_agent(body.agent_id)?;
    let waiting = validate_claim_waiting(body.waiting)?;
    Ok(Json(
        state
            .queue
            .heartbeat(id, body.agent_id, body.claim_id, waiting.as_ref())
            .await?,
    ))
}

/// Report the result of a claim; `disrupted: true` with `success: false` reports an attempt ended
/// by a disruption, which the order's `retry_on_disruption` decides about (docs/design.md §12).
#[utoipa::path(post, path = "/api/v1/work-orders/{id}/complete", tag = "claims",
    params(("id" = Uuid, Path, description = "Work order id")), request_body = CompleteBody,
    responses(
        (status = 200, description = "The order reached a terminal state: its log entry", body = LogEntry),
        (status = 202, description = "A retry was scheduled (for a disrupted attempt with `retry_on_disruption: safe`: due at once)", body = RetryScheduled),
        (status = 400, description = "`invalid_field`: `disrupted: true` with `success: true` (the field is named); nothing changed", body = ErrorBody),
        (status = 409, description = "`cancelled`, `reclaimed` or `not_claim_holder`; nothing changed", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn complete(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<Uuid>,
    ApiJson(body): ApiJson<CompleteBody>,
) -> Result<Response, ApiError> {
    caller.require_agent(body.agent_id)?;
    let completion = completion(body.success, body.message, body.retryable, body.disrupted);
    let result = state
        .queue
        .complete(id, body.agent_id, body.claim_id, &completion)
        .await?;
    note_completion(&state, id, body.agent_id, &result);
    Ok(match result {
        CompletionResult::Finished(entry) => Json(entry).into_response(),
        CompletionResult::RetryScheduled { next_retry_after } => (
            StatusCode::ACCEPTED,
            Json(RetryScheduled::at(next_retry_after)),
        )
            .into_response(),
    })
}

/// The [`Completion`] a complete's fields describe (docs/design.md §5, §12).
pub(super) fn completion(
    success: bool,
    message: Option<String>,
    retryable: Option<bool>,
    disrupted: Option<bool>,
) -> Completion {
    Completion {
        success,
        message,
        // For a disrupted attempt `retryable` says its run is known to have stopped: not said,
        // it may still run, and `retry_on_disruption: safe` must not start a second one
        // (docs/design.md §12).
        retryable: retryable.unwrap_or(disrupted != Some(true)),
        disrupted: disrupted.unwrap_or(false),
    }
}

/// Counts and logs what a complete of `order` by `agent` led to, whichever route reported it.
pub(super) fn note_completion(
    state: &AppState,
    order: Uuid,
    agent: Uuid,
    result: &CompletionResult,
) {
    match result {
        CompletionResult::Finished(entry) => {
            state.metrics.count_completion(entry.outcome.as_str());
            tracing::info!(work_order = %order, %agent, outcome = entry.outcome.as_str(), "work order finished");
        }
        CompletionResult::RetryScheduled { next_retry_after } => {
            state.metrics.count_completion("retry_scheduled");
            tracing::info!(work_order = %order, %agent, %next_retry_after, "retry scheduled");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_long_poll_is_capped_not_refused_and_never_negative() {
        let cap = Duration::from_secs(u64::from(MAX_WAIT_SECONDS));
        assert_eq!(long_poll_wait(None).unwrap(), Duration::ZERO);
        assert_eq!(long_poll_wait(Some(0)).unwrap(), Duration::ZERO);
        let at_cap = i64::from(MAX_WAIT_SECONDS);
        assert_eq!(
            long_poll_wait(Some(at_cap - 1)).unwrap(),
            cap - Duration::from_secs(1)
        );
        assert_eq!(long_poll_wait(Some(at_cap)).unwrap(), cap);
        assert_eq!(long_poll_wait(Some(at_cap + 1)).unwrap(), cap);
        assert_eq!(long_poll_wait(Some(i64::MAX)).unwrap(), cap);
        assert!(long_poll_wait(Some(-1)).is_err());
    }
}
