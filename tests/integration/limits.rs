//! One home for each limit (issue #26): every bound and default in `pullman::queue::limits` is the
//! number that the CRDs in `crds/` and the chart, the served OpenAPI document, the server's
//! answers and `--help` of the commands state. A number changed in one place and not the others
//! fails here.

use crate::support;

use pullman::queue::limits::{
    AGENT_LEASE_SECONDS, BACKOFF_SECONDS, CLAIM_TIMEOUT_SECONDS, LEASE_SECONDS, MAX_CONCURRENCY,
    MAX_ORDERS, MAX_RECLAIMS, MAX_RETRIES, MAX_YAML_BYTES, PRIORITY, Range,
};
use reqwest::Method;
use serde_json::{Value, json};
use support::{TestServer, configmap_order};

/// The order's fields that have a default, as the create body names them.
const ORDER_FIELDS: [Range; 5] = [
    MAX_RETRIES,
    BACKOFF_SECONDS,
    CLAIM_TIMEOUT_SECONDS,
    MAX_RECLAIMS,
    PRIORITY,
];

fn camel(field: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in field.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// A bound as a number, whether the document wrote `100` or `100.0`.
fn number(v: &Value, what: &str) -> f64 {
    v.as_f64()
        .unwrap_or_else(|| panic!("{what}: no number in {v}"))
}

fn assert_range(schema: &Value, range: &Range, what: &str) {
    assert_eq!(
        number(&schema["minimum"], what),
        range.min as f64,
        "{what} minimum"
    );
    assert_eq!(
        number(&schema["maximum"], what),
        range.max as f64,
        "{what} maximum"
    );
    match range.default {
        Some(d) => assert_eq!(number(&schema["default"], what), d as f64, "{what} default"),
        None => assert!(schema.get("default").is_none(), "{what}: a default"),
    }
}

/// The `spec` properties of one kind in a multi-document CRD file.
fn crd_spec(file: &str, kind: &str) -> Value {
    let text = std::fs::read_to_string(format!("{}/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let crd: Value = serde::Deserialize::deserialize(doc).unwrap();
        if crd["spec"]["names"]["kind"] == kind {
            return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
                ["properties"]
                .clone();
        }
    }
    panic!("{file} has no {kind}");
}

#[test]
fn the_crds_state_the_queue_limits() {
    for file in [
        "crds/pullman.dev.yaml",
        "charts/pullman/crds/pullman.dev.yaml",
    ] {
        let order = crd_spec(file, "WorkOrder");
        for range in ORDER_FIELDS {
            let what = format!("{file} WorkOrder {}", camel(range.field));
            assert_range(&order[camel(range.field)], &range, &what);
        }
        assert_eq!(
            number(&order["yamlContent"]["maxLength"], "yamlContent"),
            MAX_YAML_BYTES as f64
        );
        let executor = crd_spec(file, "Executor");
        for range in [LEASE_SECONDS, MAX_CONCURRENCY] {
            let what = format!("{file} Executor {}", camel(range.field));
            assert_range(&executor[camel(range.field)], &range, &what);
        }
    }
}

#[tokio::test]
async fn the_served_openapi_and_the_server_state_the_queue_limits() {
    let s = TestServer::start().await;
    let (status, doc) = s.get("/api/v1/openapi.json").await;
    assert_eq!(status, 200);
    let schemas = &doc["components"]["schemas"];
    let mut bounded = vec![];
    for range in ORDER_FIELDS {
        bounded.push(("NewWorkOrder", range));
    }
    for name in ["NewAgent", "ClaimBody", "ClaimNextBody"] {
        bounded.push((name, LEASE_SECONDS));
    }
    bounded.push(("NewAgent", MAX_CONCURRENCY));
    bounded.push(("ClaimNextBody", MAX_ORDERS));
    for (name, range) in &bounded {
        let field = &schemas[name]["properties"][range.field];
        let what = format!("{name}.{}", range.field);
        assert_range(field, range, &what);
        // The prose says the same numbers as the keywords.
        let description = field["description"].as_str().unwrap_or_default();
        assert!(
            description.contains(&format!("{}–{}", range.min, range.max)),
            "{what}: {description:?}"
        );
        if let Some(d) = range.default {
            assert!(
                description.contains(&format!("default {d}")),
                "{what}: {description:?}"
            );
        }
    }
    assert_eq!(
        number(
            &schemas["NewWorkOrder"]["properties"]["yaml_content"]["maxLength"],
            "yaml_content"
        ),
        MAX_YAML_BYTES as f64
    );

    // The server refuses one past either end, naming the field, and takes both ends.
    for range in ORDER_FIELDS {
        for (value, accepted) in [
            (range.min - 1, false),
            (range.max + 1, false),
            (range.min, true),
            (range.max, true),
        ] {
            let mut body = configmap_order("limits");
            body[range.field] = json!(value);
            let (status, answer) = s.admin_post("/api/v1/work-orders", body).await;
            if accepted {
                assert_eq!(status, 201, "{} = {value}: {answer}", range.field);
                assert_eq!(answer[range.field], json!(value));
            } else {
                assert_eq!(status, 400, "{} = {value}: {answer}", range.field);
                let message = answer["error"]["message"].as_str().unwrap();
                assert!(
                    message.contains(&format!(
                        "{} must be between {} and {}",
                        range.field, range.min, range.max
                    )),
                    "{message}"
                );
            }
        }
    }
    let (status, created) = s
        .admin_post("/api/v1/work-orders", configmap_order("limits"))
        .await;
    assert_eq!(status, 201);
    for range in ORDER_FIELDS {
        assert_eq!(created[range.field], json!(range.default.unwrap()));
    }
    for range in [LEASE_SECONDS, MAX_CONCURRENCY] {
        for (i, value) in [range.min - 1, range.max + 1].into_iter().enumerate() {
            let body = json!({"name": format!("limits-{}-{i}", range.field), range.field: value});
            let (status, answer) = s.admin_post("/api/v1/agents", body).await;
            assert_eq!(status, 400, "{} = {value}: {answer}", range.field);
        }
    }
}

/// The help of one flag: its line and the lines after it up to the next flag, joined.
fn flag_help(args: &[&str], flag: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pullman"))
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?} --help");
    let help = String::from_utf8(out.stdout).unwrap();
    let mut lines = help.lines().skip_while(|l| !l.contains(flag));
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("{args:?} has no {flag}"));
    // Long help puts `[env: …]` and `[default: …]` after a blank line.
    let rest = lines.take_while(|l| !l.trim_start().starts_with('-'));
    std::iter::once(first)
        .chain(rest)
        .flat_map(str::split_whitespace)
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn help_states_the_queue_limits() {
    for command in [&["worker"][..], &["executor"]] {
        let help = flag_help(command, "--lease-seconds");
        let range = format!("{}-{}", LEASE_SECONDS.min, LEASE_SECONDS.max);
        assert!(help.contains(&range), "{command:?}: {help}");
        assert!(
            help.contains(&format!("[default: {AGENT_LEASE_SECONDS}]")),
            "{command:?}: {help}"
        );
    }
    for range in ORDER_FIELDS {
        let flag = format!("--{}", range.field.replace('_', "-"));
        let help = flag_help(&["work-orders", "create"], &flag);
        assert!(
            help.contains(&format!("{}-{}", range.min, range.max)),
            "{flag}: {help}"
        );
        assert!(
            help.contains(&format!("Default: {}", range.default.unwrap())),
            "{flag}: {help}"
        );
    }
    let help = flag_help(&["agents", "create"], "--max-concurrency");
    assert!(
        help.contains(&format!("{}-{}", MAX_CONCURRENCY.min, MAX_CONCURRENCY.max)),
        "{help}"
    );
}

/// The chart refuses a grace period that serve's shutdown does not fit in: the shutdown delay plus
/// the longest drain, `serve::DRAIN_TIMEOUT`. A template cannot read the constant, so its number is
/// checked here, in the rule, its message and the value's documentation.
#[test]
fn the_chart_states_serves_drain_timeout() {
    let read = |file: &str| {
        std::fs::read_to_string(format!(
            "{}/charts/pullman/{file}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    };
    let drain = pullman::serve::DRAIN_TIMEOUT.as_secs();
    let helpers = read("templates/_helpers.tpl");
    for said in [
        format!("(add (int .Values.server.shutdownDelaySeconds) {drain})"),
        format!("server.shutdownDelaySeconds (%d) + {drain}, the longest drain"),
    ] {
        assert!(helpers.contains(&said), "_helpers.tpl lacks {said:?}");
    }
    let values = read("values.yaml");
    for said in [
        format!("(at most {drain} s)"),
        format!("`shutdownDelaySeconds` + {drain}."),
    ] {
        assert!(values.contains(&said), "values.yaml lacks {said:?}");
    }
}

/// The output limits (docs/design.md §9) as the served document, the server's answers and
/// `--help` state them.
#[tokio::test]
async fn the_output_limits_are_stated_where_they_are_used() {
    use pullman::queue::limits::{
        MAX_FOLLOWERS_DEFAULT, MAX_OUTPUT_CHUNK_BYTES, MAX_OUTPUT_PAGE_LINES, MAX_OUTPUT_TAIL,
        MAX_OUTPUT_WRITES_DEFAULT, OUTPUT_CAP_BYTES_DEFAULT, OUTPUT_PAGE_LINES_DEFAULT,
    };
    let s = TestServer::start().await;
    let (_, doc) = s.get("/api/v1/openapi.json").await;
    let params = doc["paths"]["/api/v1/work-orders/{id}/output"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .clone();
    let param = |name: &str| {
        params
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no parameter {name}"))
            .clone()
    };
    assert_eq!(
        number(&param("tail")["schema"]["maximum"], "tail"),
        MAX_OUTPUT_TAIL as f64
    );
    let limit = param("limit");
    assert_eq!(
        number(&limit["schema"]["maximum"], "limit"),
        MAX_OUTPUT_PAGE_LINES as f64
    );
    let said = limit["description"].as_str().unwrap_or_default();
    assert!(
        said.contains(&format!("(default {OUTPUT_PAGE_LINES_DEFAULT})")),
        "{said}"
    );
    // The server answers by the same numbers.
    let o = s.order(configmap_order("limits-out")).await;
    let path = |q: String| format!("/api/v1/work-orders/{o}/output?{q}");
    for (q, ok) in [
        (format!("tail={MAX_OUTPUT_TAIL}"), 200),
        (format!("tail={}", MAX_OUTPUT_TAIL + 1), 400),
        (format!("limit={MAX_OUTPUT_PAGE_LINES}"), 200),
        (format!("limit={}", MAX_OUTPUT_PAGE_LINES + 1), 400),
    ] {
        let (status, v) = s.admin_get(&path(q.clone())).await;
        assert_eq!(status, ok, "{q}: {v}");
    }
    let help = flag_help(&["work-orders", "logs"], "--tail");
    // Past the server's bound the CLI reads every page and keeps the last N.
    assert!(
        help.contains(&format!("Up to {MAX_OUTPUT_TAIL} are asked of the server")),
        "{help}"
    );
    // Each serve flag's help shows the default the code uses.
    for (flag, default) in [
        ("--output-cap-bytes", OUTPUT_CAP_BYTES_DEFAULT.to_string()),
        ("--max-output-writes", MAX_OUTPUT_WRITES_DEFAULT.to_string()),
        ("--max-output-followers", MAX_FOLLOWERS_DEFAULT.to_string()),
    ] {
        let help = flag_help(&["serve"], flag);
        assert!(help.contains(&format!("[default: {default}]")), "{help}");
    }
    // docs/design.md states the chunk limit.
    let design =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/design.md")).unwrap();
    let mib = MAX_OUTPUT_CHUNK_BYTES >> 20;
    assert_eq!(mib << 20, MAX_OUTPUT_CHUNK_BYTES, "a whole number of MiB");
    assert!(
        design.contains(&format!("A chunk is at most\n{mib} MiB (`413`)")),
        "docs/design.md §9 states another chunk limit"
    );
}

/// A concurrency key's bounds (docs/design.md §3) as the CRDs, the served document, the server's
/// answers and `work-orders create --help` state them.
#[tokio::test]
async fn the_concurrency_key_limits_are_stated_where_they_are_used() {
    use pullman::queue::limits::{CONCURRENCY_MAX, MAX_CONCURRENCY_KEY_CHARS};
    for file in [
        "crds/pullman.dev.yaml",
        "charts/pullman/crds/pullman.dev.yaml",
    ] {
        let c = &crd_spec(file, "WorkOrder")["concurrency"]["properties"];
        assert_range(
            &c["max"],
            &CONCURRENCY_MAX,
            &format!("{file} concurrency.max"),
        );
        assert_eq!(
            number(&c["key"]["maxLength"], "key"),
            MAX_CONCURRENCY_KEY_CHARS as f64
        );
    }
    let s = TestServer::start().await;
    let (_, doc) = s.get("/api/v1/openapi.json").await;
    let props = &doc["components"]["schemas"]["NewConcurrency"]["properties"];
    assert_range(&props["max"], &CONCURRENCY_MAX, "NewConcurrency.max");
    let description = props["max"]["description"].as_str().unwrap_or_default();
    assert!(
        description.contains(&format!(
            "{}–{} (default {})",
            CONCURRENCY_MAX.min,
            CONCURRENCY_MAX.max,
            CONCURRENCY_MAX.default.unwrap()
        )),
        "{description}"
    );
    assert_eq!(
        number(&props["key"]["maxLength"], "key"),
        MAX_CONCURRENCY_KEY_CHARS as f64
    );
    for (concurrency, accepted) in [
        (json!({"key": "k", "max": CONCURRENCY_MAX.min - 1}), false),
        (json!({"key": "k", "max": CONCURRENCY_MAX.max + 1}), false),
        (
            json!({"key": "k".repeat(MAX_CONCURRENCY_KEY_CHARS + 1)}),
            false,
        ),
        (json!({"key": "k", "max": CONCURRENCY_MAX.max}), true),
        (json!({"key": "k".repeat(MAX_CONCURRENCY_KEY_CHARS)}), true),
    ] {
        let mut body = configmap_order("limits");
        body["concurrency"] = concurrency.clone();
        let (status, answer) = s.admin_post("/api/v1/work-orders", body).await;
        if accepted {
            assert_eq!(status, 201, "{concurrency}: {answer}");
        } else {
            assert_eq!(status, 400, "{concurrency}: {answer}");
            assert!(
                support::error_message(&answer).contains("concurrency."),
                "{answer}"
            );
        }
    }
    let help = flag_help(&["work-orders", "create"], "--max-concurrent");
    assert!(
        help.contains(&format!("{}-{}", CONCURRENCY_MAX.min, CONCURRENCY_MAX.max)),
        "{help}"
    );
    assert!(help.contains("Default: 1"), "{help}");
    let help = flag_help(&["work-orders", "create"], "--concurrency-key");
    assert!(
        help.contains(&format!("1-{MAX_CONCURRENCY_KEY_CHARS} characters")),
        "{help}"
    );
}

/// The list routes' page limit (docs/design.md §5 "Lists") and claim-next's long-poll cap as the
/// served document, the server's answers and `--help` state them.
#[tokio::test]
async fn the_page_limit_and_the_long_poll_cap_are_stated_where_they_are_used() {
    use pullman::queue::limits::{MAX_WAIT_SECONDS, PAGE_LIMIT};
    let s = TestServer::start().await;
    let (agent, token) = s
        .agent(json!({"name": "limits-paging", "labels": ["limits-paging"]}))
        .await;
    let routes = [
        "/api/v1/work-orders".to_string(),
        "/api/v1/work-order-log".to_string(),
        "/api/v1/agents".to_string(),
        "/api/v1/agents/{id}/work-orders/pending".to_string(),
    ];
    let (_, doc) = s.get("/api/v1/openapi.json").await;
    let (min, max, default) = (PAGE_LIMIT.min, PAGE_LIMIT.max, PAGE_LIMIT.default.unwrap());
    // Every `limit` of the document is the page limit, but the output route's (lines, its own
    // bound), so a new list route cannot forget it.
    let mut stated = vec![];
    for (path, item) in doc["paths"].as_object().unwrap() {
        let params = item["get"]["parameters"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for p in params.iter().filter(|p| p["name"] == PAGE_LIMIT.field) {
            if path.ends_with("/output") {
                continue;
            }
            let what = format!("{path} limit");
            assert_eq!(number(&p["schema"]["minimum"], &what), min as f64, "{what}");
            assert_eq!(number(&p["schema"]["maximum"], &what), max as f64, "{what}");
            let said = p["description"].as_str().unwrap_or_default();
            assert!(
                said.contains(&format!("{min}–{max} (default {default})")),
                "{what}: {said:?}"
            );
            stated.push(path.clone());
        }
    }
    stated.sort();
    let mut listed = routes.to_vec();
    listed.sort();
    assert_eq!(stated, listed, "the list routes");
    // The server takes both ends and refuses one past either, naming `limit` and both ends.
    for route in &routes {
        let route = route.replace("{id}", &agent);
        for (limit, ok) in [(min, 200), (max, 200), (min - 1, 400), (max + 1, 400)] {
            let (status, answer) = s.admin_get(&format!("{route}?limit={limit}")).await;
            assert_eq!(status, ok, "{route}?limit={limit}: {answer}");
            if ok == 400 {
                let message = answer["error"]["message"].as_str().unwrap();
                assert!(
                    message.contains(&format!("limit must be between {min} and {max}")),
                    "{route}: {message}"
                );
            }
        }
    }
    // The CLI's page is the server's, and its help says so.
    for command in [&["work-orders", "list"][..], &["log", "list"]] {
        let help = flag_help(command, "--chunk-size");
        assert!(
            help.contains(&format!("{min}-{max}")),
            "{command:?}: {help}"
        );
        assert!(
            help.contains(&format!("[default: {max}]")),
            "{command:?}: {help}"
        );
        let help = flag_help(command, "--limit");
        assert!(help.contains(&format!("past {max}")), "{command:?}: {help}");
    }
    let help = flag_help(&["agents", "list"], "--limit");
    assert!(help.contains(&format!("past {max}")), "{help}");
    assert!(help.contains(&format!("[default: {max}]")), "{help}");

    // Claim-next's wait: the document states the cap in prose (a longer wait is capped, not
    // refused, so there is no `maximum`), a negative one is refused naming the field and the cap,
    // and a longer one is taken.
    let field = &doc["components"]["schemas"]["ClaimNextBody"]["properties"]["max_wait_seconds"];
    assert_eq!(number(&field["minimum"], "max_wait_seconds"), 0.0);
    assert!(field.get("maximum").is_none(), "{field}");
    // Doc comments break lines where rustfmt wraps them.
    let said = field["description"].as_str().unwrap_or_default();
    let said = said.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        said.contains(&format!("capped at {MAX_WAIT_SECONDS}")),
        "{said:?}"
    );
    let claim = format!("/api/v1/agents/{agent}/claim");
    let (status, answer) = s
        .call(
            Method::POST,
            &claim,
            Some(&token),
            Some(json!({"max_wait_seconds": -1})),
        )
        .await;
    assert_eq!(status, 400, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "max_wait_seconds must be between 0 and {MAX_WAIT_SECONDS}"
        )),
        "{message}"
    );
    let order = s.order(configmap_order("limits-paging")).await;
    let (status, answer) = s
        .call(
            Method::POST,
            &claim,
            Some(&token),
            Some(json!({"max_wait_seconds": MAX_WAIT_SECONDS + 1})),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["id"], json!(order));
}
