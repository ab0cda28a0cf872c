//! Admin routes on work orders and the log (DESIGN.md §5).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use utoipa::IntoParams;
use uuid::Uuid;

use super::error::{ApiJson, ApiPath, ApiQuery, page_limit};
use super::{ApiError, AppState, Caller, ErrorBody};
use crate::queue::validate::{parse_work_type, validate_work_order};
use crate::queue::{
    LogEntry, LogFilter, Lookup, NewWorkOrder, OrderFilter, OrderStatus, Page, WorkOrder,
};

/// Query of `GET /api/v1/work-orders`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// `PENDING`, `CLAIMED` or `RETRY_PENDING`.
    status: Option<String>,
    /// `build` or `custom`.
    work_type: Option<String>,
    /// Page size, 1–1000 (default 100).
    limit: Option<i64>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// Query of `GET /api/v1/work-order-log`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct LogQuery {
    /// `build` or `custom`.
    work_type: Option<String>,
    /// `true`: succeeded only; `false`: failed or cancelled.
    success: Option<bool>,
    /// Agent of the last claim.
    agent_id: Option<Uuid>,
    /// Page size, 1–1000 (default 100).
    limit: Option<i64>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// Create a work order.
#[utoipa::path(post, path = "/api/v1/work-orders", tag = "work orders",
    request_body = NewWorkOrder,
    responses(
        (status = 201, description = "Created", body = WorkOrder),
        (status = 400, description = "Invalid field, unknown work type, empty targeting, bad YAML", body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 413, description = "yaml_content over 1 MiB", body = ErrorBody),
        (status = 422, description = "Wrong JSON types or unknown fields", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiJson(body): ApiJson<NewWorkOrder>,
) -> Result<(StatusCode, Json<WorkOrder>), ApiError> {
    caller.require_admin()?;
    let spec = validate_work_order(body)?;
    match state
        .queue
        .create_work_order(&spec, None, crate::queue::SOURCE_API)
        .await?
    {
        Lookup::Active(order) => {
            tracing::info!(work_order = %order.id, work_type = %order.work_type, "work order created");
            Ok((StatusCode::CREATED, Json(*order)))
        }
        // A fresh random id cannot already exist.
        _ => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "work order vanished right after creation",
        )),
    }
}

/// List active work orders (oldest first, without `yaml_content`).
#[utoipa::path(get, path = "/api/v1/work-orders", tag = "work orders", params(ListQuery),
    responses((status = 200, body = Page<WorkOrder>), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<Page<WorkOrder>>, ApiError> {
    caller.require_admin()?;
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
        limit: page_limit(q.limit)?,
        cursor: q.cursor,
    };
    Ok(Json(state.queue.list_work_orders(&filter).await?))
}

/// One active work order with `yaml_content`; `404` with code `finished` when it is in the log.
#[utoipa::path(get, path = "/api/v1/work-orders/{id}", tag = "work orders",
    params(("id" = Uuid, Path, description = "Work order id")),
    responses((status = 200, body = WorkOrder),
        (status = 404, description = "Unknown (`not_found`) or already in the log (`finished`)", body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get_one(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<WorkOrder>, ApiError> {
    caller.require_admin()?;
    Ok(Json(state.queue.get_work_order(id).await?))
}

/// Cancel a work order: it moves to the log as `cancelled`.
#[utoipa::path(delete, path = "/api/v1/work-orders/{id}", tag = "work orders",
    params(("id" = Uuid, Path, description = "Work order id")),
    responses((status = 200, description = "The log entry", body = LogEntry),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Already finished (`already_finished`)", body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn cancel(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<LogEntry>, ApiError> {
    caller.require_admin()?;
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
    responses((status = 200, body = Page<LogEntry>), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_log(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiQuery(q): ApiQuery<LogQuery>,
) -> Result<Json<Page<LogEntry>>, ApiError> {
    caller.require_admin()?;
    let filter = LogFilter {
        work_type: q
            .work_type
            .map(|t| parse_work_type("work_type", &t))
            .transpose()?,
        success: q.success,
        agent_id: q.agent_id,
        limit: page_limit(q.limit)?,
        cursor: q.cursor,
    };
    Ok(Json(state.queue.list_log(&filter).await?))
}

/// One finished work order, with `yaml_content`.
#[utoipa::path(get, path = "/api/v1/work-order-log/{id}", tag = "log",
    params(("id" = Uuid, Path, description = "Work order id")),
    responses((status = 200, body = LogEntry), (status = 404, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get_log(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<LogEntry>, ApiError> {
    caller.require_admin()?;
    Ok(Json(state.queue.get_log_entry(id).await?))
}
