//! Agent routes (docs/design.md §5): registration, listing with health, token rotation, retirement, and
//! the agent's side-effect-free pending list.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use utoipa::IntoParams;
use uuid::Uuid;

use super::error::{ApiJson, ApiPath, ApiQuery, page_limit};
use super::pages::{AgentPage, WorkOrderPage};
use super::{Admin, ApiError, AppState, Caller, ErrorBody};
use crate::auth::Principal;
use crate::queue::validate::{parse_work_type, validate_agent};
use crate::queue::{Agent, AgentWithToken, NewAgent, Page, WorkOrder, WorkType};
pub use crate::wire::WhoAmI;

/// Query of `GET /api/v1/agents`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AgentListQuery {
    /// Page size, 1–1000 (default 100).
    limit: Option<i64>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// Query of the pending list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PendingQuery {
    /// Only this work type: `build` or `custom`.
    #[param(value_type = Option<WorkType>)]
    work_type: Option<String>,
    /// Page size, 1–1000 (default 100).
    limit: Option<i64>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// Register an agent; the token is in the answer, once.
#[utoipa::path(post, path = "/api/v1/agents", tag = "agents", request_body = NewAgent,
    responses((status = 201, description = "Registered: the agent and its token, shown this once", body = AgentWithToken), (status = 400, body = ErrorBody),
        (status = 409, description = "A live agent has this name (`name_taken`)", body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn register(
    State(state): State<AppState>,
    _: Admin,
    ApiJson(body): ApiJson<NewAgent>,
) -> Result<(StatusCode, Json<AgentWithToken>), ApiError> {
    let spec = validate_agent(body)?;
    let created = state.queue.register_agent(&spec, None).await?;
    tracing::info!(agent = %created.agent.id, name = %created.agent.name, "agent registered");
    Ok((StatusCode::CREATED, Json(created)))
}

/// List agents with derived health.
#[utoipa::path(get, path = "/api/v1/agents", tag = "agents", operation_id = "list_agents", params(AgentListQuery),
    responses((status = 200, description = "A page of agents with their health", body = AgentPage)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    _: Admin,
    ApiQuery(q): ApiQuery<AgentListQuery>,
) -> Result<Json<Page<Agent>>, ApiError> {
    Ok(Json(
        state
            .queue
            .list_agents(page_limit(q.limit)?, q.cursor.as_deref())
            .await?,
    ))
}

/// One agent with derived health.
#[utoipa::path(get, path = "/api/v1/agents/{id}", tag = "agents", operation_id = "get_agent",
    params(("id" = Uuid, Path, description = "Agent id")),
    responses((status = 200, description = "The agent with its health", body = Agent), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get_one(
    State(state): State<AppState>,
    _: Admin,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<Agent>, ApiError> {
    Ok(Json(state.queue.get_agent(id).await?))
}

/// Rotate an agent's token: a new one is shown once, the old one is revoked.
#[utoipa::path(post, path = "/api/v1/agents/{id}/token", tag = "agents",
    params(("id" = Uuid, Path, description = "Agent id")),
    responses((status = 201, description = "The agent and its new token, shown this once", body = AgentWithToken), (status = 404, body = ErrorBody),
        (status = 409, description = "Agent retired", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn rotate_token(
    State(state): State<AppState>,
    _: Admin,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<(StatusCode, Json<AgentWithToken>), ApiError> {
    let rotated = state.queue.rotate_agent_token(id).await?;
    tracing::info!(agent = %id, "agent token rotated");
    Ok((StatusCode::CREATED, Json(rotated)))
}

/// Retire an agent: token revoked, its claims back to `PENDING`.
#[utoipa::path(delete, path = "/api/v1/agents/{id}", tag = "agents",
    params(("id" = Uuid, Path, description = "Agent id")),
    responses((status = 200, description = "The retired agent", body = Agent), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn retire(
    State(state): State<AppState>,
    _: Admin,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<Agent>, ApiError> {
    let agent = state.queue.retire_agent(id).await?;
    tracing::info!(agent = %id, "agent retired");
    Ok(Json(agent))
}

/// What this agent may claim now (side-effect free, without `yaml_content`).
#[utoipa::path(get, path = "/api/v1/agents/{id}/work-orders/pending", tag = "claims",
    params(("id" = Uuid, Path, description = "Agent id"), PendingQuery),
    responses((status = 200, description = "A page of the orders this agent may claim now, oldest first", body = WorkOrderPage), (status = 404, body = ErrorBody),
        (status = 403, description = "Token of another agent", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn pending(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<Uuid>,
    ApiQuery(q): ApiQuery<PendingQuery>,
) -> Result<Json<Page<WorkOrder>>, ApiError> {
    caller.require_agent(id)?;
    let types = match q.work_type {
        Some(t) => vec![parse_work_type("work_type", &t)?],
        None => vec![],
    };
    Ok(Json(
        state
            .queue
            .pending_for_agent(id, &types, page_limit(q.limit)?, q.cursor.as_deref())
            .await?,
    ))
}

/// Who the presented token belongs to. Not in docs/design.md §5: added so that workers given only a
/// token file learn their agent id, and so CLIs can check a token before using it.
#[utoipa::path(get, path = "/api/v1/whoami", tag = "agents",
    responses((status = 200, description = "The token's kind and agent", body = WhoAmI)),
    security(("bearer" = [])))]
pub async fn whoami(
    State(state): State<AppState>,
    Caller(caller): Caller,
) -> Result<Json<WhoAmI>, ApiError> {
    Ok(Json(match caller {
        Principal::Admin => WhoAmI {
            kind: "admin".into(),
            agent_id: None,
            agent_name: None,
        },
        Principal::Agent(id) => WhoAmI {
            kind: "agent".into(),
            agent_id: Some(id),
            agent_name: Some(state.queue.get_agent(id).await?.name),
        },
    }))
}
