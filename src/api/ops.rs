//! Operational routes: `/healthz`, `/readyz`, `/metrics`, `/api/v1/openapi.json` (docs/design.md §5).

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};

use super::{ApiError, AppState, agents, backlog, claims, completes, output, work_orders};
use crate::telemetry::HealthLabel;

/// The OpenAPI 3.1 description of every route, generated from the handlers' annotations.
#[derive(OpenApi)]
#[openapi(
    info(title = "Pullman", description = "Pull-based work-order queue (docs/design.md §5)"),
    paths(
        work_orders::create, work_orders::list, work_orders::get_one, work_orders::explain,
        work_orders::cancel,
        work_orders::attempts, work_orders::rerun, work_orders::list_log, work_orders::get_log,
        agents::register, agents::list, agents::get_one, agents::rotate_token, agents::retire,
        agents::pending, agents::whoami, backlog::agent, backlog::own, backlog::profile,
        claims::claim, claims::claim_next, claims::heartbeat, claims::complete,
        completes::complete_many,
        output::append, output::read,
        healthz, readyz, metrics, openapi,
    ),
    modifiers(&BearerAuth, &CommonAnswers)
)]
pub struct ApiDoc;

/// Answers every route of a kind can give, added where a route's own annotation leaves them out,
/// so the document describes the server (generated clients and schemathesis rely on it):
/// `400 invalid_path` and `404` on routes with an id, `400 malformed_json`, `415` and `422` on
/// routes with a JSON body, `401`/`403` on authenticated routes, `503 database_unavailable` on
/// every route that needs the database. An annotation's answer without a description gets the
/// same text, and every `429`/`503` under `/api/v1` declares the `Retry-After` header that
/// [`ApiError`] sends with them.
struct CommonAnswers;

/// Description of an error answer that a route's annotation gives without one.
fn common_description(status: &str) -> Option<&'static str> {
    Some(match status {
        "400" => {
            "`invalid_path` (an id is not a UUID), `invalid_query` (unknown or malformed query parameter), `invalid_cursor`, `malformed_json`, or a field out of bounds"
        }
        "401" => "`unauthorized`: missing or bad bearer token",
        "403" => "`forbidden`: the token may not do this",
        "404" => "`not_found`: no such id",
        "415" => "`unsupported_media_type`: no `Content-Type: application/json`",
        "422" => "`invalid_body`: wrong JSON types, missing or unknown fields",
        "503" => "`database_unavailable`: retry after `Retry-After` seconds",
        _ => return None,
    })
}

/// The `Retry-After` header of a `429` or `503` answer (docs/design.md §5, §9).
fn retry_after() -> utoipa::openapi::header::Header {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    utoipa::openapi::header::HeaderBuilder::new()
        .schema(
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(0)),
        )
        .description(Some("Seconds to wait before sending the request again"))
        .build()
}

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
                let has_query = op.parameters.as_ref().is_some_and(|ps| {
                    ps.iter().any(|p| {
                        matches!(p.parameter_in, utoipa::openapi::path::ParameterIn::Query)
                    })
                });
                let authenticated = op.security.as_ref().is_some_and(|s| !s.is_empty());
                let answers = &mut op.responses.responses;
                let mut add = |status: &str| {
                    answers.entry(status.to_string()).or_insert_with(|| {
                        error(common_description(status).unwrap_or_default()).into()
                    });
                };
                if has_id || has_body || has_query {
                    add("400");
                }
                if has_id {
                    add("404");
                }
                if has_body {
                    add("415");
                    add("422");
                }
                if authenticated {
                    add("401");
                    add("403");
                }
                if needs_database {
                    add("503");
                }
                for (status, answer) in answers.iter_mut() {
                    let utoipa::openapi::RefOr::T(answer) = answer else {
                        continue;
                    };
                    if answer.description.is_empty()
                        && let Some(text) = common_description(status)
                    {
                        answer.description = text.to_string();
                    }
                    if path.starts_with("/api/v1/") && (status == "429" || status == "503") {
                        answer.headers.insert("Retry-After".into(), retry_after());
                    }
                }
            }
        }
    }
}

/// Bounds the server enforces on input text and lists that the derived schemas cannot state
/// (crate::queue::validate): labels, agent names and annotation keys are non-empty (after
/// U+0000 is removed) and at most 4096 characters, annotation keys have no `=`, lists have at most
/// 256 entries, a create needs at least one targeting criterion, and a `build` at least 120 s
/// of claim timeout (its Build is watched, docs/design.md §4). Clients and schemathesis generate
/// from these. Applied to the JSON document: utoipa's typed model lacks some of the keywords
/// (`if`/`then`, `not` beside `allOf`).
fn input_bounds(doc: &mut serde_json::Value) {
    use crate::queue::limits::{
        MAX_LIST_ENTRIES, MAX_STRING_CHARS, WATCHED_MIN_CLAIM_TIMEOUT_SECONDS,
    };
    use serde_json::{Value, json};
    // Non-empty once U+0000 is removed, at most MAX_STRING_CHARS.
    let text = json!({"type": "string", "minLength": 1, "maxLength": MAX_STRING_CHARS, "pattern": "[^\\u0000]"});
    let key = json!({"type": "string", "minLength": 1, "maxLength": MAX_STRING_CHARS, "pattern": "^[^=]*[^=\\u0000][^=]*$"});
    let value = json!({"type": "string", "maxLength": MAX_STRING_CHARS});
    let list = |items: Value| json!({"maxItems": MAX_LIST_ENTRIES, "items": items});
    let annotations = json!({"maxProperties": MAX_LIST_ENTRIES, "propertyNames": key, "additionalProperties": value});
    // docs/design.md §5: claim-next's body is all optional fields, and no body at all is `{}`.
    if let Some(body) = doc.pointer_mut("/paths/~1api~1v1~1agents~1{id}~1claim/post/requestBody") {
        body["required"] = json!(false);
    }
    // GET /backlog names an agent profile in its query: the bounds of a registration, and each
    // annotation `KEY=VALUE` (`400 invalid_query` otherwise).
    if let Some(params) = doc
        .pointer_mut("/paths/~1api~1v1~1backlog/get/parameters")
        .and_then(Value::as_array_mut)
    {
        use crate::queue::limits::{PROFILE_MAX_CHARS, PROFILE_MAX_VALUES};
        let label = json!({"type": "string", "minLength": 1, "maxLength": PROFILE_MAX_CHARS, "pattern": "[^\\u0000]"});
        let pair = json!({"type": "string", "maxLength": PROFILE_MAX_CHARS,
            "pattern": "^[^=\\u0000]+=[^\\u0000]*$"});
        for p in params.iter_mut() {
            let bounded = |items: &Value| json!({"type": "array", "maxItems": PROFILE_MAX_VALUES, "items": items});
            p["schema"] = match p["name"].as_str() {
                Some("label") => bounded(&label),
                Some("annotation") => bounded(&pair),
                Some("work_type") => bounded(&p["schema"]["items"].clone()),
                Some("tenant") => label.clone(),
                _ => continue,
            };
        }
    }
    // The server takes 1–255 visible ASCII characters (`400 invalid_header` otherwise).
    for route in ["work-orders", "work-orders~1{id}~1rerun"] {
        if let Some(params) = doc
            .pointer_mut(&format!("/paths/~1api~1v1~1{route}/post/parameters"))
            .and_then(Value::as_array_mut)
        {
            for p in params.iter_mut().filter(|p| p["name"] == "Idempotency-Key") {
                p["schema"] = json!({"type": "string", "minLength": 1, "maxLength": 255,
                    "pattern": "^[!-~]+$"});
            }
        }
    }
    let mut patch = |name: &str, f: &dyn Fn(&mut Value)| {
        if let Some(schema) = doc.pointer_mut(&format!("/components/schemas/{name}")) {
            f(schema);
        }
    };
    let merge = |v: &mut Value, field: &str, extra: &Value| {
        if let (Some(target), Some(extra)) = (
            v.pointer_mut(&format!("/properties/{field}"))
                .and_then(Value::as_object_mut),
            extra.as_object(),
        ) {
            for (k, x) in extra {
                target.insert(k.clone(), x.clone());
            }
        }
    };
    patch("Targeting", &|v| {
        merge(v, "agent_ids", &json!({"maxItems": MAX_LIST_ENTRIES}));
        merge(v, "agent_names", &list(text.clone()));
        merge(v, "labels", &list(text.clone()));
        merge(v, "annotations", &annotations);
    });
    patch("NewAgent", &|v| {
        merge(v, "labels", &list(text.clone()));
        merge(v, "annotations", &annotations);
        merge(v, "work_types", &json!({"maxItems": MAX_LIST_ENTRIES}));
        merge(v, "name", &json!({"pattern": "[^\\u0000]"}));
        merge(v, "tenant", &json!({"pattern": "[^\\u0000]"}));
    });
    patch("NewWorkOrder", &|v| {
        merge(v, "tenant", &json!({"pattern": "[^\\u0000]"}));
        // At least one criterion, and a criterion counts when it is non-empty: `not` every
        // criterion empty or absent. A `Targeting` reference beside a `not` rather than an
        // `anyOf` of four partial schemas, which generated clients typed as four anonymous
        // classes instead of `Targeting` (issue #26).
        let targeting = json!({
            "allOf": [{"$ref": "#/components/schemas/Targeting"}],
            "not": {"properties": {
                "agent_ids": {"maxItems": 0},
                "agent_names": {"maxItems": 0},
                "labels": {"maxItems": 0},
                "annotations": {"maxProperties": 0},
            }},
            "description": "Which agents may claim: at least one criterion must be non-empty \
                (`400 invalid_field` otherwise, docs/design.md §3)."
        });
        if let Some(props) = v.get_mut("properties").and_then(Value::as_object_mut) {
            props.insert("targeting".into(), targeting);
        }
        if let Some(obj) = v.as_object_mut() {
            obj.insert(
                "if".into(),
                json!({"required": ["work_type"], "properties": {"work_type": {"const": "build"}}}),
            );
            obj.insert(
                "then".into(),
                json!({"properties": {"claim_timeout_seconds": {"minimum": WATCHED_MIN_CLAIM_TIMEOUT_SECONDS}}}),
            );
        }
    });
}

/// The routes answering a page of a list, whose `limit` is `queue::limits::PAGE_LIMIT`
/// (docs/design.md §5 "Lists").
const LIST_ROUTES: [&str; 4] = [
    "/api/v1/work-orders",
    "/api/v1/work-order-log",
    "/api/v1/agents",
    "/api/v1/agents/{id}/work-orders/pending",
];

/// The request fields bounded by crate::queue::limits get their `minimum`, `maximum`, `default`
/// and length bounds from there, so the document states the numbers validation enforces.
fn limits(doc: &mut serde_json::Value) {
    use crate::queue::limits::{
        CONCURRENCY_MAX, MAX_AGENT_NAME_CHARS, MAX_CONCURRENCY_KEY_CHARS, MAX_STRING_CHARS,
        MAX_YAML_BYTES, PAGE_LIMIT, RANGES,
    };
    use serde_json::json;
    let requests = ["NewWorkOrder", "NewAgent", "ClaimBody", "ClaimNextBody"];
    for name in requests {
        let Some(props) = doc
            .pointer_mut(&format!("/components/schemas/{name}/properties"))
            .and_then(serde_json::Value::as_object_mut)
        else {
            continue;
        };
        for range in RANGES {
            if let Some(field) = props.get_mut(range.field).and_then(|f| f.as_object_mut()) {
                field.insert("minimum".into(), json!(range.min));
                field.insert("maximum".into(), json!(range.max));
                if let Some(default) = range.default {
                    field.insert("default".into(), json!(default));
                }
            }
        }
        let mut length = |field: &str, max: usize| {
            if let Some(f) = props.get_mut(field).and_then(|f| f.as_object_mut()) {
                f.insert("minLength".into(), json!(1));
                f.insert("maxLength".into(), json!(max));
            }
        };
        length("tenant", MAX_STRING_CHARS);
        if name == "NewAgent" {
            length("name", MAX_AGENT_NAME_CHARS);
        }
        if name == "NewWorkOrder" {
            length("yaml_content", MAX_YAML_BYTES);
        }
    }
    // `limit` of every list route (`PAGE_LIMIT`; the output route's `limit` counts lines and has
    // its own bound).
    for route in LIST_ROUTES {
        let params = doc
            .pointer_mut(&format!(
                "/paths/{}/get/parameters",
                route.replace('/', "~1")
            ))
            .and_then(serde_json::Value::as_array_mut);
        for p in params.into_iter().flatten() {
            if p["name"] == PAGE_LIMIT.field {
                p["schema"]["minimum"] = json!(PAGE_LIMIT.min);
                p["schema"]["maximum"] = json!(PAGE_LIMIT.max);
            }
        }
    }
    if let Some(props) = doc
        .pointer_mut("/components/schemas/NewConcurrency/properties")
        .and_then(serde_json::Value::as_object_mut)
    {
        if let Some(f) = props.get_mut("max").and_then(|f| f.as_object_mut()) {
            f.insert("minimum".into(), json!(CONCURRENCY_MAX.min));
            f.insert("maximum".into(), json!(CONCURRENCY_MAX.max));
            f.insert("default".into(), json!(CONCURRENCY_MAX.default));
        }
        if let Some(f) = props.get_mut("key").and_then(|f| f.as_object_mut()) {
            f.insert("minLength".into(), json!(1));
            f.insert("maxLength".into(), json!(MAX_CONCURRENCY_KEY_CHARS));
        }
    }
    // What a heartbeat may say holds its order up (docs/design.md §12): only `node_unreachable`,
    // and the bounds `validate_claim_waiting` holds.
    if let Some(props) = doc
        .pointer_mut("/components/schemas/ClaimWaiting/properties")
        .and_then(serde_json::Value::as_object_mut)
    {
        props.insert(
            "reason".into(),
            json!({"type": "string", "enum": ["node_unreachable"]}),
        );
        if let Some(f) = props.get_mut("message").and_then(|f| f.as_object_mut()) {
            f.insert("maxLength".into(), json!(MAX_STRING_CHARS));
        }
    }
    if let Some(f) = doc
        .pointer_mut("/components/schemas/NodeWait/properties/name")
        .and_then(serde_json::Value::as_object_mut)
    {
        f.insert("maxLength".into(), json!(MAX_AGENT_NAME_CHARS));
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
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "Alive: `ok`", body = String, content_type = "text/plain")))]
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// Readiness: not stopping, database reachable and migrations applied.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses((status = 200, description = "Ready: `ok`", body = String, content_type = "text/plain"),
        (status = 503, description = "Not ready: the reason, as a line of text", body = String, content_type = "text/plain")))]
pub async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    if state.stopping.is_cancelled() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting down: still answering until the shutdown delay ends\n".to_string(),
        );
    }
    match state.queue.readiness().await {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
    }
}

/// Prometheus metrics (text exposition format).
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "The metrics in the OpenMetrics text format, which Prometheus reads",
        body = String, content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8")))]
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    // While the database is known down, serve the counters as they are instead of waiting out
    // the pool's timeout on each gauge (a scrape would time out).
    if !state.queue.database_known_down() {
        refresh_database_gauges(&state).await;
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}

/// Reads the gauges that come from the database: queue lag and agents by health (each a small
/// indexed read), and the figures one replica computed off the scrape path for orders by status,
/// waiting orders by reason and orders per tenant (`queue::gauges`, docs/design.md §5), so a
/// scrape costs the same at a million pending orders as at none.
async fn refresh_database_gauges(state: &AppState) {
    match state.queue.stored_gauges().await {
        Ok(Some(stored)) => state.metrics.set_database_figures(&stored),
        Ok(None) => {}
        Err(error) => tracing::warn!(%error, "could not read the database gauges for /metrics"),
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
}

/// This document.
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "operations",
    responses((status = 200, description = "This OpenAPI 3.1 document", body = Object, content_type = "application/json")))]
pub async fn openapi() -> Json<serde_json::Value> {
    Json(ApiDoc::document())
}

impl ApiDoc {
    /// The document served at `/api/v1/openapi.json`: [`ApiDoc::openapi`] with the input bounds
    /// of [`input_bounds`].
    pub fn document() -> serde_json::Value {
        let mut doc =
            serde_json::to_value(ApiDoc::openapi()).expect("the OpenAPI document serializes");
        input_bounds(&mut doc);
        limits(&mut doc);
        doc
    }
}

/// Unknown routes answer in the API's error body.
pub async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}
