//! The served OpenAPI document as a generated client reads it (issue #26): the create body's
//! `targeting` is the `Targeting` schema, page items are references, answers declare their
//! headers and content types and have a description, and the fields the server always sends are
//! `required`, checked against what serde actually writes. e2e/openapi/client.sh generates a
//! Python client from the same document and runs it against a real server.

use crate::support;

use std::collections::BTreeSet;

use pullman::api::ApiDoc;
use pullman::wire::{
    Agent, AgentWithToken, Attempt, Backlog, ErrorBody, Explanation, Heartbeat, LogEntry,
    OutputAccepted, OutputEntry, OutputPage, Page, RetryScheduled, WhoAmI, WorkOrder,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use support::{ADMIN_TOKEN, TestServer};

fn doc() -> Value {
    ApiDoc::document()
}

/// The component a `$ref` names, or the schema itself.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"].as_str() {
        Some(r) => {
            let name = r.strip_prefix("#/components/schemas/").expect("local ref");
            &doc["components"]["schemas"][name]
        }
        None => schema,
    }
}

/// The smallest value the schema allows with only its required properties: what the server
/// sends when every optional field is at its "nothing" value. Nullable required fields are null.
fn minimal(doc: &Value, schema: &Value) -> Value {
    let schema = resolve(doc, schema);
    if let Some(all) = schema["allOf"].as_array() {
        return minimal(doc, &all[0]);
    }
    if let Some(one) = schema["oneOf"].as_array() {
        if one.iter().any(|s| s["type"] == "null") {
            return Value::Null;
        }
        return minimal(doc, &one[0]);
    }
    if let Some(first) = schema["enum"].as_array().and_then(|e| e.first()) {
        return first.clone();
    }
    let types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    if types.contains(&"null") {
        return Value::Null;
    }
    match types.first().copied() {
        Some("object") | None if schema.get("properties").is_some() => {
            let mut object = serde_json::Map::new();
            for name in schema["required"].as_array().into_iter().flatten() {
                let name = name.as_str().unwrap();
                object.insert(name.into(), minimal(doc, &schema["properties"][name]));
            }
            Value::Object(object)
        }
        Some("object") => json!({}),
        Some("array") => json!([]),
        Some("integer") => json!(1),
        Some("number") => json!(1.5),
        Some("boolean") => json!(true),
        Some("string") => match schema["format"].as_str() {
            Some("uuid") => json!("00000000-0000-0000-0000-000000000001"),
            Some("date-time") => json!("2026-12-01T08:00:00Z"),
            _ => json!("x"),
        },
        other => panic!("no minimal value for type {other:?} in {schema}"),
    }
}

/// Reads the minimal value of schema `name` as `T` and writes it back: the keys serde writes
/// must be exactly the schema's `required` (a field always sent but not required would be
/// `Unset`-typed in a client; one required but skipped would fail to parse), all of them
/// described as properties.
fn required_is_what_is_sent<T: DeserializeOwned + Serialize>(doc: &Value, name: &str) {
    let schema = &doc["components"]["schemas"][name];
    assert!(schema.is_object(), "no schema {name}");
    let value = minimal(doc, schema);
    let parsed: T = serde_json::from_value(value.clone())
        .unwrap_or_else(|e| panic!("{name}: the minimal {value} does not parse: {e}"));
    let sent = serde_json::to_value(&parsed).unwrap();
    let sent: BTreeSet<&str> = sent
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    let required: BTreeSet<&str> = schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert_eq!(sent, required, "{name}: keys always sent vs required");
    for key in &sent {
        assert!(
            schema["properties"].get(*key).is_some(),
            "{name}: {key} is sent but not a property"
        );
    }
}

#[test]
fn fields_always_sent_are_required() {
    let doc = doc();
    required_is_what_is_sent::<WorkOrder>(&doc, "WorkOrder");
    required_is_what_is_sent::<LogEntry>(&doc, "LogEntry");
    required_is_what_is_sent::<Agent>(&doc, "Agent");
    required_is_what_is_sent::<AgentWithToken>(&doc, "AgentWithToken");
    required_is_what_is_sent::<Attempt>(&doc, "Attempt");
    required_is_what_is_sent::<Explanation>(&doc, "Explanation");
    required_is_what_is_sent::<Backlog>(&doc, "Backlog");
    required_is_what_is_sent::<Heartbeat>(&doc, "Heartbeat");
    required_is_what_is_sent::<RetryScheduled>(&doc, "RetryScheduled");
    required_is_what_is_sent::<ErrorBody>(&doc, "ErrorBody");
    required_is_what_is_sent::<WhoAmI>(&doc, "WhoAmI");
    required_is_what_is_sent::<OutputAccepted>(&doc, "OutputAccepted");
    required_is_what_is_sent::<OutputEntry>(&doc, "OutputEntry");
    required_is_what_is_sent::<OutputPage>(&doc, "OutputPage");
    required_is_what_is_sent::<Page<WorkOrder>>(&doc, "WorkOrderPage");
    required_is_what_is_sent::<Page<Agent>>(&doc, "AgentPage");
    required_is_what_is_sent::<Page<LogEntry>>(&doc, "LogEntryPage");
}

#[test]
fn list_answers_are_pages_of_referenced_items() {
    let doc = doc();
    for (path, page, item) in [
        ("/api/v1/work-orders", "WorkOrderPage", "WorkOrder"),
        (
            "/api/v1/agents/{id}/work-orders/pending",
            "WorkOrderPage",
            "WorkOrder",
        ),
        ("/api/v1/agents", "AgentPage", "Agent"),
        ("/api/v1/work-order-log", "LogEntryPage", "LogEntry"),
    ] {
        let schema =
            &doc["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]["schema"];
        assert_eq!(
            schema["$ref"],
            format!("#/components/schemas/{page}"),
            "{path}"
        );
        let items = &doc["components"]["schemas"][page]["properties"]["items"];
        assert_eq!(items["type"], "array", "{page}");
        assert_eq!(
            items["items"],
            json!({"$ref": format!("#/components/schemas/{item}")}),
            "{page}: items must reference {item}, not copy it"
        );
    }
}

#[test]
fn the_create_body_targets_with_the_targeting_schema_and_keeps_the_rule() {
    let doc = doc();
    let targeting = &doc["components"]["schemas"]["NewWorkOrder"]["properties"]["targeting"];
    assert_eq!(
        targeting["allOf"],
        json!([{"$ref": "#/components/schemas/Targeting"}])
    );
    for union in ["anyOf", "oneOf"] {
        assert!(
            targeting.get(union).is_none(),
            "a generated client makes a class per {union} branch"
        );
    }
    // `not` all criteria empty: these are the four criteria of Targeting, each one empty.
    let empty = targeting["not"]["properties"].as_object().unwrap();
    let criteria = doc["components"]["schemas"]["Targeting"]["properties"]
        .as_object()
        .unwrap();
    assert_eq!(
        empty.keys().collect::<Vec<_>>(),
        criteria.keys().collect::<Vec<_>>()
    );
    for (name, bound) in empty {
        let kind = criteria[name]["type"].as_str().unwrap();
        let expected = if kind == "object" {
            json!({"maxProperties": 0})
        } else {
            json!({"maxItems": 0})
        };
        assert_eq!(*bound, expected, "{name}");
    }
    assert!(
        targeting["description"]
            .as_str()
            .unwrap()
            .contains("at least one criterion")
    );
}

#[test]
fn disruptions_are_described_where_they_are_sent_and_taken() {
    let doc = doc();
    let schemas = &doc["components"]["schemas"];
    // Directly, or as a branch of `allOf` / `oneOf` (with null, or with a description).
    let refers = |schema: &Value| {
        schema
            .to_string()
            .contains(r##""$ref":"#/components/schemas/RetryOnDisruption""##)
    };
    for owner in ["NewWorkOrder", "WorkOrder", "LogEntry"] {
        let field = &schemas[owner]["properties"]["retry_on_disruption"];
        assert!(refers(field), "{owner}: {field}");
    }
    assert_eq!(
        schemas["RetryOnDisruption"]["enum"],
        json!(["never", "safe"])
    );
    assert!(
        schemas["AttemptResult"]["enum"]
            .as_array()
            .unwrap()
            .contains(&json!("disrupted"))
    );
    let complete = &schemas["CompleteBody"]["properties"]["disrupted"];
    assert!(
        complete["type"]
            .as_array()
            .is_some_and(|t| t.contains(&json!("boolean"))),
        "{complete}"
    );
    // The one pairing complete refuses is said where a client reads the field (a schema for it,
    // an `anyOf`, stops generated clients: openapi-python-client drops the operation).
    assert!(
        complete["description"]
            .as_str()
            .is_some_and(|d| d.contains("Only with `success: false` (else `400`")),
        "{complete}"
    );
    let answers = &doc["paths"]["/api/v1/work-orders/{id}/complete"]["post"]["responses"];
    assert!(
        answers["400"]["description"]
            .as_str()
            .unwrap()
            .contains("disrupted")
    );
}

/// Every operation's answers, as (method path, status, answer).
fn answers(doc: &Value) -> Vec<(String, String, Value)> {
    let mut all = vec![];
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            for (status, answer) in op["responses"].as_object().unwrap() {
                all.push((format!("{method} {path}"), status.clone(), answer.clone()));
            }
        }
    }
    all
}

#[test]
fn every_answer_has_a_description_and_retry_after_where_the_server_sends_it() {
    let doc = doc();
    let all = answers(&doc);
    assert!(all.len() > 150, "{} answers", all.len());
    for (op, status, answer) in &all {
        let description = answer["description"].as_str().unwrap_or_default();
        assert!(!description.is_empty(), "{op} {status}: no description");
        // ApiError sends Retry-After with every 429 and 503 (database_unavailable,
        // too_many_long_polls, too_many_output_writes); /readyz's 503 is plain text without.
        let sends_retry_after = op.contains(" /api/v1/") && (status == "429" || status == "503");
        assert_eq!(
            answer["headers"].get("Retry-After").is_some(),
            sends_retry_after,
            "{op} {status}: Retry-After"
        );
        if sends_retry_after {
            assert_eq!(
                answer["headers"]["Retry-After"]["schema"]["type"],
                "integer"
            );
        }
    }
    assert!(
        all.iter()
            .any(|(op, status, _)| op == "post /api/v1/work-orders/{id}/output" && status == "429")
    );
}

#[test]
fn replayed_creates_declare_idempotent_replayed() {
    let doc = doc();
    for path in ["/api/v1/work-orders", "/api/v1/work-orders/{id}/rerun"] {
        let created = &doc["paths"][path]["post"]["responses"]["201"];
        assert_eq!(
            created["headers"]["Idempotent-Replayed"]["schema"]["type"], "string",
            "{path}: {created}"
        );
    }
}

#[test]
fn every_answer_with_a_body_declares_its_content_type() {
    let doc = doc();
    for (path, status, media) in [
        ("/healthz", "200", "text/plain"),
        ("/readyz", "200", "text/plain"),
        ("/readyz", "503", "text/plain"),
        (
            "/metrics",
            "200",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
        ("/api/v1/openapi.json", "200", "application/json"),
        (
            "/api/v1/work-orders/{id}/output",
            "200",
            "application/x-ndjson",
        ),
    ] {
        let content = &doc["paths"][path]["get"]["responses"][status]["content"];
        assert!(content.get(media).is_some(), "{path} {status}: {content}");
    }
    // Only 204 (claim-next found nothing) has no body.
    for (op, status, answer) in answers(&doc) {
        assert_eq!(
            answer.get("content").is_none(),
            status == "204",
            "{op} {status}"
        );
    }
}

/// The backlog routes as the running server documents them (issue #36): `GET /backlog` is called
/// with any one of its parameters alone (the README does), so a generated client must not demand
/// the others; `/agents/{id}/backlog` takes an agent's name too, so `{id}` is no UUID there.
#[tokio::test]
async fn served_backlog_parameters_are_optional_and_agents_are_named_by_id_or_name() {
    let s = TestServer::start().await;
    let (st, doc) = s.get("/api/v1/openapi.json").await;
    assert_eq!(st, 200, "{doc}");
    let params = doc["paths"]["/api/v1/backlog"]["get"]["parameters"]
        .as_array()
        .expect("GET /api/v1/backlog has parameters");
    for (name, alone) in [
        ("label", "label=gpu"),
        ("annotation", "annotation=zone%3Da"),
        ("work_type", "work_type=build"),
        ("tenant", "tenant=team-a"),
    ] {
        let p = params
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no parameter {name} in {params:?}"));
        assert_eq!(p["in"], "query", "{p}");
        assert!(
            matches!(p.get("required"), None | Some(Value::Bool(false))),
            "{name} must be optional: {p}"
        );
        let (st, v) = s
            .get_as(&format!("/api/v1/backlog?{alone}"), ADMIN_TOKEN)
            .await;
        assert_eq!(st, 200, "{name} alone: {v}");
    }
    let id = doc["paths"]["/api/v1/agents/{id}/backlog"]["get"]["parameters"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "id"))
        .expect("the id parameter of /agents/{id}/backlog");
    assert_eq!(id["schema"]["type"], "string", "{id}");
    assert!(
        id["schema"].get("format").is_none(),
        "a name is no UUID: {id}"
    );
    assert!(
        id["description"].as_str().unwrap_or("").contains("name"),
        "{id}"
    );
}
