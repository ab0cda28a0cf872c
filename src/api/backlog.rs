//! Queue depth for autoscalers (docs/design.md §10): an agent's backlog, and the backlog of an agent
//! profile not yet registered, as the small JSON object KEDA's `metrics-api` scaler reads
//! (`valueLocation: count`).

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use utoipa::IntoParams;
use uuid::Uuid;

use super::error::ApiPath;
use super::{Admin, ApiError, AppState, Caller, ErrorBody};
use crate::auth::Principal;
use crate::queue::backlog::Backlog;
use crate::queue::eligibility::AgentProfile;
use crate::queue::limits::{PROFILE_MAX_CHARS, PROFILE_MAX_VALUES};
use crate::queue::validate::validate_agent;
use crate::queue::{NewAgent, RequestedWorkType, WorkType};

/// What this agent could claim now: unclaimed orders it may take that are due, whether or not
/// it has room (a busy agent's backlog is what more agents like it would take), and the longest
/// wait among them. The agent's own token or the admin token. The agent is named by its id or,
/// as `pullman agents` takes it, by its name: a scaler is configured by people, who know names.
#[utoipa::path(get, path = "/api/v1/agents/{id}/backlog", tag = "agents",
    params(("id" = String, Path,
        description = "The agent's id, or its name: the live agent of that name, else the newest \
            retired one. A name that is itself a UUID is read as an id; `me` is the caller's own \
            agent (`GET /api/v1/agents/me/backlog`).")),
    responses((status = 200, description = "The agent's backlog", body = Backlog),
        (status = 404, description = "No agent has this id or name (`not_found`)", body = ErrorBody),
        (status = 403, description = "Token of another agent", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn agent(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(given): ApiPath<String>,
) -> Result<Json<Backlog>, ApiError> {
    let id = agent_named(&state, caller, &given).await?;
    Ok(Json(state.queue.agent_backlog(id).await?))
}

/// The agent `given` names, as `pullman agents` reads it: a UUID is an id; anything else is a
/// name, meaning the live agent of that name, else the newest retired one (names are unique
/// among live agents only, docs/design.md §5). An agent token may name only its own agent: it is
/// answered 403 for any other name without learning whether that name exists.
async fn agent_named(state: &AppState, caller: Principal, given: &str) -> Result<Uuid, ApiError> {
    if let Ok(id) = Uuid::parse_str(given) {
        caller.require_agent(id)?;
        return Ok(id);
    }
    if let Principal::Agent(own) = caller {
        if state.queue.get_agent(own).await?.name == given {
            return Ok(own);
        }
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("this token belongs to another agent, not to the agent named {given:?}"),
        ));
    }
    state.queue.agent_named(given).await?.ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no agent is named {given:?}, and it is not an agent id"),
        )
    })
}

/// The caller's own backlog, as `GET /api/v1/agents/{id}/backlog` with the id its token belongs
/// to (docs/design.md §10). For scalers that hold an agent's token but cannot know its id when they are
/// configured: a chart-declared Executor's agent id is its `metadata.uid`, assigned at creation.
/// Only an agent token names an agent: the admin token gets `403 forbidden` (it may read any
/// agent's backlog by id or name, or a profile's).
#[utoipa::path(get, path = "/api/v1/agents/me/backlog", tag = "agents",
    operation_id = "get_own_backlog",
    responses((status = 200, description = "The backlog of the agent the token belongs to", body = Backlog),
        (status = 403, description = "The admin token, which is no agent (`forbidden`)", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn own(
    State(state): State<AppState>,
    Caller(caller): Caller,
) -> Result<Json<Backlog>, ApiError> {
    let Principal::Agent(id) = caller else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "`me` is the agent an agent token belongs to; the admin token is no agent: ask \
             /api/v1/agents/{id}/backlog or /api/v1/backlog",
        ));
    };
    Ok(Json(state.queue.agent_backlog(id).await?))
}

/// Query of `GET /api/v1/backlog`: an agent profile. Repeat a parameter for more values
/// (`?label=gpu&label=eu`).
#[derive(Debug, Default, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ProfileQuery {
    /// Labels of the agent.
    #[param(required = false)]
    label: Vec<String>,
    /// Annotations of the agent, each `KEY=VALUE`.
    #[param(required = false)]
    annotation: Vec<String>,
    /// Work types it would take (`build`, `custom`); none means all.
    #[param(value_type = Vec<WorkType>, required = false)]
    work_type: Vec<String>,
    /// Tenant it would serve; absent means instance-wide.
    tenant: Option<String>,
}

/// What an agent with this profile would have as its backlog if it were registered now, so an
/// autoscaler can start the first one from zero. Orders that target agents by id or name are not
/// counted: they target registered agents. `422 unknown_work_type` names the `work_type`
/// parameter.
#[utoipa::path(get, path = "/api/v1/backlog", tag = "agents",
    params(ProfileQuery),
    responses((status = 200, description = "The profile's backlog", body = Backlog),
        (status = 400, description = "Unknown or malformed parameter, or a value out of bounds", body = ErrorBody),
        (status = 422, description = "Unknown work type (`unknown_work_type`, naming `work_type`)", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn profile(
    State(state): State<AppState>,
    _: Admin,
    RawQuery(query): RawQuery,
) -> Result<Json<Backlog>, ApiError> {
    let profile = parse_profile(query.as_deref().unwrap_or(""))?;
    Ok(Json(state.queue.profile_backlog(&profile).await?))
}

/// The profile a query names, checked as a registration would be (bounds on texts and lists),
/// within the tighter bounds of a profile: [`PROFILE_MAX_VALUES`] values of each parameter and
/// [`PROFILE_MAX_CHARS`] characters of each value.
fn parse_profile(query: &str) -> Result<AgentProfile, ApiError> {
    let mut q = ProfileQuery::default();
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        match &*key {
            "label" => q.label.push(value.into_owned()),
            "annotation" => q.annotation.push(value.into_owned()),
            "work_type" => q.work_type.push(value.into_owned()),
            "tenant" if q.tenant.is_none() => q.tenant = Some(value.into_owned()),
            "tenant" => {
                return Err(ApiError::bad_request(
                    "invalid_query",
                    "tenant: give at most one tenant",
                ));
            }
            other => {
                return Err(ApiError::bad_request(
                    "invalid_query",
                    format!(
                        "unknown query parameter `{other}`; expected label, annotation, work_type or tenant"
                    ),
                ));
            }
        }
    }
    for (name, values) in [
        ("label", &q.label),
        ("annotation", &q.annotation),
        ("work_type", &q.work_type),
    ] {
        if values.len() > PROFILE_MAX_VALUES {
            return Err(ApiError::bad_request(
                "invalid_query",
                format!("{name}: at most {PROFILE_MAX_VALUES} values in a profile"),
            ));
        }
    }
    let long = q
        .label
        .iter()
        .map(|v| ("label", v))
        .chain(q.annotation.iter().map(|v| ("annotation", v)))
        .chain(q.tenant.iter().map(|v| ("tenant", v)))
        .find(|(_, v)| v.chars().count() > PROFILE_MAX_CHARS);
    if let Some((name, _)) = long {
        return Err(ApiError::bad_request(
            "invalid_query",
            format!("{name}: at most {PROFILE_MAX_CHARS} characters in a profile"),
        ));
    }
    let mut work_types = vec![];
    for t in &q.work_type {
        let known = WorkType::parse(t).ok_or_else(|| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "unknown_work_type",
                format!("work_type: Unknown work type: {t} (expected build or custom)"),
            )
        })?;
        work_types.push(RequestedWorkType::Known(known));
    }
    let mut annotations = std::collections::BTreeMap::new();
    for a in &q.annotation {
        let (k, v) = a.split_once('=').ok_or_else(|| {
            ApiError::bad_request(
                "invalid_query",
                format!("annotation: `{a}` is not KEY=VALUE"),
            )
        })?;
        annotations.insert(k.to_string(), v.to_string());
    }
    // The checks of a registration; the name is not part of a profile.
    let spec = validate_agent(NewAgent {
        name: "profile".into(),
        labels: q.label,
        annotations,
        work_types,
        tenant: q.tenant,
        ..Default::default()
    })?;
    Ok(AgentProfile {
        id: Uuid::nil(),
        name: String::new(),
        labels: spec.labels,
        annotations: spec.annotations,
        work_types: spec.work_types,
        tenant: spec.tenant,
        retired: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_reads_repeated_parameters() {
        let p = parse_profile("label=gpu&label=eu&annotation=zone%3Da&work_type=build&tenant=t")
            .unwrap();
        assert_eq!(p.labels, ["gpu", "eu"]);
        assert_eq!(p.annotations["zone"], "a");
        assert_eq!(p.work_types, [WorkType::Build]);
        assert_eq!(p.tenant.as_deref(), Some("t"));
        assert!(parse_profile("").unwrap().labels.is_empty());
    }

    #[test]
    fn bad_profiles_name_the_parameter() {
        let e = parse_profile("work_type=gpu").unwrap_err();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(e.message.starts_with("work_type:"), "{}", e.message);
        let e = parse_profile("labels=gpu").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let e = parse_profile("annotation=zone").unwrap_err();
        assert!(e.message.starts_with("annotation:"), "{}", e.message);
        let e = parse_profile("tenant=a&tenant=b").unwrap_err();
        assert_eq!(e.code, "invalid_query");
    }
}
