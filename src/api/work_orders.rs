//! Admin routes on work orders and the log (docs/design.md §5).

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use utoipa::IntoParams;
use uuid::Uuid;

use super::error::{ApiJson, ApiPath, ApiQuery, page_limit};
use super::pages::{LogEntryPage, WorkOrderPage};
use super::{Admin, ApiError, AppState, ErrorBody};
use crate::queue::validate::{parse_work_type, validate_work_order_off_thread};
use crate::queue::{
    Attempt, Created, Explanation, IdPrefix, IdempotencyKey, LogEntry, LogFilter, NewWorkOrder,
    OrderFilter, OrderStatus, Outcome, Page, WorkOrder, WorkType,
};

/// Query of `GET /api/v1/work-orders`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// `PENDING`, `CLAIMED` or `RETRY_PENDING`.
    #[param(value_type = Option<OrderStatus>)]
    status: Option<String>,
    /// `build` or `custom`.
    #[param(value_type = Option<WorkType>)]
    work_type: Option<String>,
    /// Only orders targeting this label.
    label: Option<String>,
    /// Only orders this agent holds a claim on now.
    agent_id: Option<Uuid>,
    /// Only orders created at or after this time (RFC 3339, e.g. `2026-12-01T08:00:00Z`).
    since: Option<DateTime<Utc>>,
    /// Only orders whose id starts with these hex digits (dashes ignored), as git and docker
    /// take id prefixes: 1–32 digits.
    #[param(pattern = "^-*[0-9a-fA-F](-*[0-9a-fA-F]){0,31}-*$")]
    id_prefix: Option<String>,
    /// Page size, 1–1000 (default 100).
    limit: Option<i64>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// Query of `GET /api/v1/work-order-log`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct LogQuery {
    /// `build` or `custom`.
    #[param(value_type = Option<WorkType>)]
    work_type: Option<String>,
    /// `true`: succeeded only; `false`: failed or cancelled.
    success: Option<bool>,
    /// `succeeded`, `failed` or `cancelled`.
    #[param(value_type = Option<Outcome>)]
    outcome: Option<String>,
    /// Agent of the last claim.
    agent_id: Option<Uuid>,
    /// Only orders that targeted this label.
    label: Option<String>,
    /// Only orders finished at or after this time (RFC 3339).
    since: Option<DateTime<Utc>>,
    /// Only orders whose id starts with these hex digits (dashes ignored): 1–32 digits.
    #[param(pattern = "^-*[0-9a-fA-F](-*[0-9a-fA-F]){0,31}-*$")]
    id_prefix: Option<String>,
    /// Page size, 1–1000 (default 100).
    limit: Option<i64>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// The `Idempotency-Key` request header (docs/design.md §5 "Retry safety").
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Set to `true` on a create answered from an earlier call with the same `Idempotency-Key`.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// Create a work order. With an `Idempotency-Key` header, a repeat of the same request returns
/// the order the first call created (`201`, header `Idempotent-Replayed: true`) instead of a
/// second one; the same key with a different request is `422 idempotency_key_reused`. Keys are
/// remembered for 24 hours.
#[utoipa::path(post, path = "/api/v1/work-orders", tag = "work orders",
    request_body = NewWorkOrder,
    params(("Idempotency-Key" = Option<String>, Header,
        description = "1–255 visible ASCII characters chosen by the client, e.g. a UUID; a retry with the same key and body returns the same order")),
    responses(
        (status = 201, description = "Created (or, with `Idempotent-Replayed: true`, created by an earlier call with this key)", body = WorkOrder,
            headers(("Idempotent-Replayed" = String, description = "`true` when this is the answer of an earlier call with the same `Idempotency-Key`; absent otherwise"))),
        (status = 400, description = "Invalid field (a `retry_on_disruption` other than `never` or `safe` among them), unknown work type, empty targeting, bad YAML, bad Idempotency-Key", body = ErrorBody),
        (status = 413, description = "yaml_content over 1 MiB", body = ErrorBody),
        (status = 415, description = "No `Content-Type: application/json`", body = ErrorBody),
        (status = 422, description = "Wrong JSON types or unknown fields; `idempotency_key_reused`", body = ErrorBody),
        (status = 503, description = "Database unavailable; retry after `Retry-After` seconds", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    State(state): State<AppState>,
    _: Admin,
    headers: HeaderMap,
    ApiJson(body): ApiJson<NewWorkOrder>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers, &body)?;
    let spec = validate_work_order_off_thread(body).await?;
    let created = state
        .queue
        .create_new_work_order(&spec, key.as_ref())
        .await?;
    let order = &created.order;
    if created.replayed {
        tracing::info!(work_order = %order.id, "create repeated with its Idempotency-Key; same order returned");
    } else {
        tracing::info!(work_order = %order.id, work_type = %order.work_type, "work order created");
    }
    Ok(created_response(created))
}

/// The `Idempotency-Key` header, checked (1–255 visible ASCII characters), with the SHA-256 of
/// the request as parsed.
fn idempotency_key(
    headers: &HeaderMap,
    body: &impl serde::Serialize,
) -> Result<Option<IdempotencyKey>, ApiError> {
    let Some(value) = headers.get(IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    let key = value
        .to_str()
        .ok()
        .filter(|k| (1..=255).contains(&k.len()) && k.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| {
            ApiError::bad_request(
                "invalid_header",
                "Idempotency-Key must be 1 to 255 visible ASCII characters (no spaces)",
            )
        })?;
    let canonical = serde_json::to_vec(body).expect("a parsed body serializes");
    Ok(Some(IdempotencyKey {
        key: key.to_string(),
        request_sha256: Sha256::digest(&canonical).into(),
    }))
}

/// List active work orders (oldest first, without `yaml_content`).
#[utoipa::path(get, path = "/api/v1/work-orders", tag = "work orders", operation_id = "list_work_orders", params(ListQuery),
    responses((status = 200, description = "A page of active orders, oldest first", body = WorkOrderPage), (status = 400, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    _: Admin,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<Page<WorkOrder>>, ApiError> {
    let status = q
        .status
        .map(|s| {
            OrderStatus::parse(&s).ok_or_else(|| {
                ApiError::bad_request(
                    "invalid_query",
                    format!("status must be PENDING, CLAIMED or RETRY_PENDING, got {s:?}"),
                )
            })
        })
        .transpose()?;
    let work_type = q
        .work_type
        .map(|t| parse_work_type("work_type", &t))
        .transpose()?;
    let filter = OrderFilter {
        status,
        work_type,
        label: q.label,
        agent_id: q.agent_id,
        since: q.since,
        id_prefix: q.id_prefix.as_deref().map(IdPrefix::parse).transpose()?,
        limit: page_limit(q.limit)?,
        cursor: q.cursor,
    };
    Ok(Json(state.queue.list_work_orders(&filter).await?))
}

/// One active work order with `yaml_content`; `404` with code `finished` when it is in the log.
#[utoipa::path(get, path = "/api/v1/work-orders/{id}", tag = "work orders", operation_id = "get_work_order",
    params(("id" = Uuid, Path, description = "Work order id")),
    responses((status = 200, description = "The order in full, with its attempts and, while unclaimed, why it waits (without `position`: `GET …/explain` counts it); while claimed, `node_unreachable` when its agent says a pod of it may still run on a node that does not report", body = WorkOrder),
        (status = 404, description = "Unknown (`not_found`) or already in the log (`finished`)", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get_one(
    State(state): State<AppState>,
    _: Admin,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<WorkOrder>, ApiError> {
    let mut order = state.queue.get_work_order(id).await?;
    order.attempts = Some(state.queue.attempts(id).await?);
    order.waiting = state.queue.waiting_reason(id).await?;
    Ok(Json(order))
}

/// Why a work order waits (docs/design.md §10): `no_matching_agent`, `no_agent_connected`,
/// `agents_busy`, `backing_off` (until when) or `queued` (with its position), the matching
/// agents (at most 10 names) and how long it has waited. A claimed order waits only when its agent
/// says a pod of it may still run on a node that does not report (`node_unreachable` with the
/// node, §12). `404` names an unknown id (`not_found`) or a finished one (`finished`); any other
/// claimed order does not wait (`409 not_waiting`).
#[utoipa::path(get, path = "/api/v1/work-orders/{id}/explain", tag = "work orders",
    params(("id" = Uuid, Path, description = "Work order id")),
    responses((status = 200, description = "Why the order waits", body = Explanation),
        (status = 404, description = "Unknown (`not_found`) or already in the log (`finished`)", body = ErrorBody),
        (status = 409, description = "Claimed and not held up by a lost node, so not waiting (`not_waiting`)", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn explain(
    State(state): State<AppState>,
    _: Admin,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<Explanation>, ApiError> {
    Ok(Json(state.queue.explain(id).await?))
}

/// Cancel a work order: it moves to the log as `cancelled`.
#[utoipa::path(delete, path = "/api/v1/work-orders/{id}", tag = "work orders",
    params(("id" = Uuid, Path, description = "Work order id")),
    responses((status = 200, description = "The log entry", body = LogEntry),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Already finished (`already_finished`)", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn cancel(
    State(state): State<AppState>,
    _: Admin,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<LogEntry>, ApiError> {
    let entry = state
        .queue
        .cancel_work_order(id, "cancelled through the API")
        .await?;
    state.metrics.count_completion("cancelled");
    tracing::info!(work_order = %id, "work order cancelled");
    Ok(Json(entry))
}

/// Finished work orders, newest first (without `yaml_content`).
#[utoipa::path(get, path = "/api/v1/work-order-log", tag = "log", params(LogQuery),
    responses((status = 200, description = "A page of finished orders, newest first", body = LogEntryPage), (status = 400, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_log(
    State(state): State<AppState>,
    _: Admin,
    ApiQuery(q): ApiQuery<LogQuery>,
) -> Result<Json<Page<LogEntry>>, ApiError> {
    let filter = LogFilter {
        work_type: q
            .work_type
            .map(|t| parse_work_type("work_type", &t))
            .transpose()?,
        success: q.success,
        outcome: q.outcome.as_deref().map(parse_outcome).transpose()?,
        agent_id: q.agent_id,
        label: q.label,
        since: q.since,
        id_prefix: q.id_prefix.as_deref().map(IdPrefix::parse).transpose()?,
        limit: page_limit(q.limit)?,
        cursor: q.cursor,
    };
    Ok(Json(state.queue.list_log(&filter).await?))
}

/// One finished work order, with `yaml_content`.
#[utoipa::path(get, path = "/api/v1/work-order-log/{id}", tag = "log",
    params(("id" = Uuid, Path, description = "Work order id")),
    responses((status = 200, description = "The finished order in full, with its attempts", body = LogEntry), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get_log(
    State(state): State<AppState>,
    _: Admin,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<LogEntry>, ApiError> {
    let mut entry = state.queue.get_log_entry(id).await?;
    entry.attempts = Some(state.queue.attempts(id).await?);
    Ok(Json(entry))
}

/// Every attempt (claim) of an active or finished order, oldest first: agent, `claim_id`, when
/// it started and ended, and how it ended (`running`, `succeeded`, `failed`, `retry_scheduled`,
/// `reclaimed`, `released`, `cancelled`, `disrupted`) with the message. Empty for an order never claimed.
#[utoipa::path(get, path = "/api/v1/work-orders/{id}/attempts", tag = "work orders",
    params(("id" = Uuid, Path, description = "Work order id (active or finished)")),
    responses((status = 200, description = "The attempts, oldest first", body = Vec<Attempt>), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn attempts(
    State(state): State<AppState>,
    _: Admin,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<Vec<Attempt>>, ApiError> {
    Ok(Json(state.queue.attempts(id).await?))
}

/// Re-run a finished order: a new `PENDING` order with the same work, settings and targeting,
/// whose `rerun_of` names the original. Honours `Idempotency-Key` as create does.
#[utoipa::path(post, path = "/api/v1/work-orders/{id}/rerun", tag = "work orders",
    params(("id" = Uuid, Path, description = "Id of a finished work order"),
        ("Idempotency-Key" = Option<String>, Header,
        description = "1–255 visible ASCII characters; a retry with the same key returns the same new order")),
    responses(
        (status = 201, description = "The new order (with `Idempotent-Replayed: true`: made by an earlier call with this key)", body = WorkOrder,
            headers(("Idempotent-Replayed" = String, description = "`true` when this is the answer of an earlier call with the same `Idempotency-Key`; absent otherwise"))),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The order has not finished (`not_finished`)", body = ErrorBody),
        (status = 422, description = "`idempotency_key_reused`", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn rerun(
    State(state): State<AppState>,
    _: Admin,
    headers: HeaderMap,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers, &serde_json::json!({ "rerun_of": id }))?;
    let created = state.queue.rerun(id, key.as_ref()).await?;
    if !created.replayed {
        tracing::info!(work_order = %created.order.id, rerun_of = %id, "work order re-run");
    }
    Ok(created_response(created))
}

/// `201` with the order; `Idempotent-Replayed: true` when it is an earlier call's answer.
fn created_response(created: Created) -> Response {
    let mut response = (StatusCode::CREATED, Json(created.order)).into_response();
    if created.replayed {
        response
            .headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

/// `succeeded`, `failed` or `cancelled`; the error names the `outcome` query parameter.
fn parse_outcome(value: &str) -> Result<Outcome, ApiError> {
    match value {
        "succeeded" => Ok(Outcome::Succeeded),
        "failed" => Ok(Outcome::Failed),
        "cancelled" => Ok(Outcome::Cancelled),
        other => Err(ApiError::bad_request(
            "invalid_query",
            format!("outcome must be succeeded, failed or cancelled, got {other:?}"),
        )),
    }
}
