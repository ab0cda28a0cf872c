//! The admin CLI as a user drives it (issue #15), against a real API server and PostgreSQL:
//! `wait` exits with the order's outcome, agents by name, orders by id prefix (an ambiguous one
//! is a clear error), and `-o yaml` prints the same document as `-o json`.

use crate::support;

use std::process::{Output, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use support::agent::Agent;
use support::cli::{
    assert_printed, cli, cli_command, cli_json, create_args, json_of, json_of_any, text,
};
use support::{TestServer, configmap_order};

/// Claims the next order as the agent and completes it with `success` and `message`.
async fn claim_and_complete(agent: &Agent<'_>, success: bool, message: &str) -> String {
    let (st, claimed) = agent.claim_next(10).await;
    assert_eq!(st, 200, "{claimed}");
    let id = claimed["id"].as_str().unwrap().to_string();
    let body = json!({"claim_id": claimed["claim_id"], "success": success,
                      "message": message, "retryable": false});
    let (st, v) = agent.complete(&id, body).await;
    assert_eq!(st, 200, "{v}");
    id
}

/// Starts `work-orders wait` on `id` in the background.
fn spawn_wait(server: &TestServer, id: &str, extra: &[&str]) -> std::process::Child {
    let mut args = vec!["work-orders", "wait", id];
    args.extend_from_slice(extra);
    cli_command(&server.base, &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

async fn finish(child: std::process::Child) -> Output {
    tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_exits_with_the_outcome_and_prints_the_message() {
    let server = TestServer::start().await;
    let agent = Agent::register(&server, json!({"name": "waiter", "labels": ["w"]})).await;

    // Succeeded: 0, the message on stdout; a message the server cut is marked as cut.
    let id = server.order(configmap_order("w")).await;
    let waiting = spawn_wait(&server, &id[..8], &[]);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let long = "x".repeat(70 * 1024);
    assert_eq!(claim_and_complete(&agent, true, &long).await, id);
    let out = finish(waiting).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("xxxx"),
        "{}",
        text(&out.stdout)
    );
    assert_printed(&out.stdout, "[message cut");
    assert_printed(&out.stderr, "succeeded");

    // Failed: 3.
    let id = server.order(configmap_order("w")).await;
    let waiting = spawn_wait(&server, &id, &[]);
    claim_and_complete(&agent, false, "it broke").await;
    let out = finish(waiting).await;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "it broke");
    assert!(!text(&out.stdout).contains("[message cut"));

    // Cancelled: 4.
    let id = server.order(configmap_order("w")).await;
    let waiting = spawn_wait(&server, &id, &["-o", "json"]);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (st, _) = server.cancel(&id).await;
    assert_eq!(st, 200);
    let out = finish(waiting).await;
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert_eq!(json_of_any(&out)["outcome"], "cancelled");

    // Timeout: 5, and the order is untouched.
    let started = std::time::Instant::now();
    let out = cli(
        &server.base,
        &[
            "work-orders",
            "wait",
            &id_pending(&server).await,
            "--timeout",
            "2s",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("timed out") && text(&out.stderr).contains("PENDING"));
    assert!(started.elapsed() < Duration::from_secs(10));

    // create --wait: the same codes.
    let (_dir, file) =
        support::cli::yaml_file("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: w\n");
    let creating = cli_command(
        &server.base,
        &create_args(file.to_str().unwrap(), "w", &["--wait"]),
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    claim_and_complete(&agent, true, "built").await;
    let out = finish(creating).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "built");

    // An unknown id is the command's own failure (1), not an outcome.
    let out = cli(
        &server.base,
        &["work-orders", "wait", &uuid::Uuid::new_v4().to_string()],
    )
    .await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
}

/// A fresh pending order nobody can claim.
async fn id_pending(server: &TestServer) -> String {
    server.order(configmap_order("nobody-has-this")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_by_name_and_orders_by_unique_prefix() {
    let server = TestServer::start().await;
    let (laptop, _) = server
        .agent(json!({"name": "laptop", "labels": ["l"]}))
        .await;
    server.agent(json!({"name": "desk"})).await;

    let got = cli_json(&server.base, &["agents", "get", "laptop"]).await;
    assert_eq!(got["id"], laptop.as_str());
    let got = cli_json(&server.base, &["agents", "get", &laptop[..8]]).await;
    assert_eq!(got["name"], "laptop");
    let rotated = cli_json(&server.base, &["agents", "rotate-token", "laptop"]).await;
    assert_eq!(rotated["agent"]["id"], laptop.as_str());
    assert!(rotated["token"].as_str().unwrap().starts_with("pullman_"));
    let out = cli(&server.base, &["agents", "retire", "laptop"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("laptop") && text(&out.stdout).contains("retired"));
    let out = cli(&server.base, &["agents", "get", "nobody"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert_printed(&out.stderr, "no agent is named \"nobody\"");

    // 17 orders: two share a first hex digit (pigeonhole), so that digit is ambiguous.
    let mut ids = Vec::new();
    for _ in 0..17 {
        ids.push(server.order(configmap_order("l")).await);
    }
    let first = |id: &String| id[..1].to_string();
    let shared = ids
        .iter()
        .map(first)
        .find(|p| ids.iter().filter(|id| first(id) == *p).count() > 1)
        .unwrap();
    let sharing: Vec<&String> = ids.iter().filter(|id| first(id) == shared).collect();
    let out = cli(&server.base, &["work-orders", "get", &shared]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("ambiguous"), "{err}");
    for id in &sharing {
        assert!(err.contains(id.as_str()), "{id} not listed: {err}");
    }

    // A unique prefix, with or without dashes, finds the order; active or in the log.
    let id = &ids[0];
    let got = cli_json(&server.base, &["work-orders", "get", &id[..13]]).await;
    assert_eq!(got["id"], id.as_str());
    let undashed: String = id.replace('-', "")[..12].to_string();
    let cancelled = cli_json(&server.base, &["work-orders", "cancel", &undashed]).await;
    assert_eq!(cancelled["id"], id.as_str());
    let logged = cli_json(&server.base, &["log", "get", &id[..10]]).await;
    assert_eq!(logged["outcome"], "cancelled");

    // No match, and not a prefix at all.
    let unused = (0..=u32::MAX)
        .map(|n| format!("{n:08x}"))
        .find(|p| !ids.iter().any(|id| id.starts_with(p.as_str())))
        .unwrap();
    let out = cli(&server.base, &["work-orders", "get", &unused]).await;
    assert_eq!(out.status.code(), Some(1));
    assert_printed(&out.stderr, "no work order has an id starting with");
    let out = cli(&server.base, &["work-orders", "get", "not-hex"]).await;
    assert_printed(&out.stderr, "not a work order id");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yaml_output_is_the_json_document() {
    let server = TestServer::start().await;
    let agent = Agent::register(&server, json!({"name": "y", "labels": ["y"]})).await;
    let id = server.order(configmap_order("y")).await;
    claim_and_complete(&agent, true, "line one\nline: two\n").await;
    server.order(configmap_order("y")).await;

    for args in [
        vec!["work-orders", "list"],
        vec!["log", "list"],
        vec!["log", "get", &id],
        vec!["agents", "list"],
        vec!["agents", "get", "y"],
    ] {
        let as_json = cli_json(&server.base, &args).await;
        let out = cli(&server.base, &[&args[..], &["-o", "yaml"]].concat()).await;
        assert!(out.status.success(), "{}", text(&out.stderr));
        let as_yaml: Value = serde_norway::from_slice(&out.stdout).unwrap();
        assert_eq!(as_yaml, as_json, "{args:?}");
        assert!(as_json != Value::Null && as_json != json!([]), "{args:?}");
    }

    // -o name: ids, one a line.
    let out = cli(&server.base, &["log", "list", "-o", "name"]).await;
    assert_eq!(text(&out.stdout).trim(), id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_pages_with_limit_and_all() {
    let server = TestServer::start().await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        let id = server.order(configmap_order("p")).await;
        let (st, _) = server.cancel(&id).await;
        assert_eq!(st, 200);
        ids.push(id);
    }
    let out = cli(&server.base, &["log", "list", "--limit", "2", "-o", "name"]).await;
    assert_eq!(text(&out.stdout).lines().count(), 2);
    let out = cli(&server.base, &["log", "list", "--limit", "2"]).await;
    assert_printed(&out.stderr, "--all");
    // Pages of two: --all follows next_cursor to the end, --limit stops across pages.
    let out = cli(
        &server.base,
        &[
            "log",
            "list",
            "--limit",
            "3",
            "--chunk-size",
            "2",
            "-o",
            "name",
        ],
    )
    .await;
    assert_eq!(
        text(&out.stdout).lines().count(),
        3,
        "{}",
        text(&out.stderr)
    );
    let out = cli(
        &server.base,
        &["log", "list", "--all", "--chunk-size", "2", "-o", "name"],
    )
    .await;
    let mut listed: Vec<String> = text(&out.stdout).lines().map(String::from).collect();
    listed.sort();
    ids.sort();
    assert_eq!(listed, ids);
}

/// Attempts shown by `work-orders get` and `log get`, `rerun` by prefix, and the list filters
/// (label, agent, outcome, since) reaching the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_rerun_and_list_filters() {
    let server = TestServer::start_maintained().await;
    let agent = Agent::register(&server, json!({"name": "hist", "labels": ["h"]})).await;
    let mut body = configmap_order("h");
    body["backoff_seconds"] = json!(1);
    let id = server.order(body).await;
    server.order(configmap_order("other-label")).await;

    // First attempt fails (retry scheduled); the second is held while we look.
    let (_, c) = agent.claim_next(5).await;
    let (st, _) = agent
        .complete(
            &id,
            json!({"claim_id": c["claim_id"], "success": false, "message": "first try broke"}),
        )
        .await;
    assert_eq!(st, 202);
    let out = cli(&server.base, &["work-orders", "get", &id[..8]]).await;
    let printed = text(&out.stdout);
    assert!(
        printed.contains("RETRY_PENDING") && printed.contains("Next retry:"),
        "{printed}"
    );
    assert!(
        printed.contains("retry_scheduled") && printed.contains("first try broke"),
        "{printed}"
    );
    let (st, c2) = agent.claim_next(10).await;
    assert_eq!(st, 200);
    assert_eq!(c2["id"], id.as_str());

    // Filters: by agent (name), by label, since.
    let by_agent = cli_json(&server.base, &["work-orders", "list", "--agent", "hist"]).await;
    assert_eq!(by_agent.as_array().unwrap().len(), 1);
    assert_eq!(by_agent[0]["id"], id.as_str());
    let by_label = cli_json(
        &server.base,
        &["work-orders", "list", "--label", "other-label"],
    )
    .await;
    assert_eq!(by_label.as_array().unwrap().len(), 1);
    assert_ne!(by_label[0]["id"], id.as_str());
    let future = cli_json(
        &server.base,
        &["work-orders", "list", "--since", "2999-01-01T00:00:00Z"],
    )
    .await;
    assert_eq!(future, json!([]));
    let recent = cli_json(&server.base, &["work-orders", "list", "--since", "1h"]).await;
    assert_eq!(recent.as_array().unwrap().len(), 2);
    let out = cli(&server.base, &["work-orders", "get", &id]).await;
    let printed = text(&out.stdout);
    assert!(
        printed.contains("running") && printed.contains("Lease expires:")
            || printed.contains("Claim times out:"),
        "{printed}"
    );

    let (st, _) = agent
        .complete(
            &id,
            json!({"claim_id": c2["claim_id"], "success": true, "message": "second try ok"}),
        )
        .await;
    assert_eq!(st, 200);
    let out = cli(&server.base, &["log", "get", &id[..8]]).await;
    let printed = text(&out.stdout);
    let attempt_lines: Vec<&str> = printed.lines().filter(|l| l.contains("hist  ")).collect();
    assert_eq!(attempt_lines.len(), 2, "{printed}");
    assert!(
        attempt_lines[0].contains("retry_scheduled") && attempt_lines[1].contains("succeeded"),
        "{printed}"
    );
    let logged = cli_json(&server.base, &["log", "get", &id]).await;
    assert_eq!(logged["attempts"].as_array().unwrap().len(), 2);

    let ok = cli_json(
        &server.base,
        &["log", "list", "--outcome", "succeeded", "--label", "h"],
    )
    .await;
    assert_eq!(ok.as_array().unwrap().len(), 1);
    let failed = cli_json(&server.base, &["log", "list", "--outcome", "failed"]).await;
    assert_eq!(failed, json!([]));

    // Rerun by prefix: a new pending order linked to the original.
    let rerun = cli_json(&server.base, &["work-orders", "rerun", &id[..8]]).await;
    assert_eq!(rerun["rerun_of"], id.as_str());
    assert_eq!(rerun["status"], "PENDING");
    let out = cli(
        &server.base,
        &["work-orders", "get", rerun["id"].as_str().unwrap()],
    )
    .await;
    assert!(text(&out.stdout).contains("Rerun of:") && text(&out.stdout).contains(&id));
    // Rerun of an active order is refused by the server: the CLI says so and exits 1.
    let out = cli(
        &server.base,
        &["work-orders", "rerun", rerun["id"].as_str().unwrap()],
    )
    .await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
}

/// `get -w` prints a line per change (PENDING, CLAIMED, then the outcome) and stops when the order
/// finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_watch_prints_each_change_until_the_order_finishes() {
    let server = TestServer::start().await;
    let agent = Agent::register(&server, json!({"name": "watched", "labels": ["wt"]})).await;
    let id = server.order(configmap_order("wt")).await;
    let watching = cli_command(&server.base, &["work-orders", "get", &id, "-w"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (st, c) = agent.claim_next(5).await;
    assert_eq!(st, 200);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (st, _) = agent
        .complete(&id, json!({"claim_id": c["claim_id"], "success": true}))
        .await;
    assert_eq!(st, 200);
    let out = tokio::time::timeout(Duration::from_secs(20), finish(watching))
        .await
        .expect("get -w did not stop after the order finished");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed = text(&out.stdout);
    let lines: Vec<&str> = printed.lines().collect();
    assert!(lines[0].starts_with("ID"), "{printed}");
    let states: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l.split_whitespace().nth(2).unwrap())
        .collect();
    assert_eq!(states, ["PENDING", "CLAIMED", "SUCCEEDED"], "{printed}");
    assert!(lines[2].contains("watched"), "{printed}");
}

/// `logs <full id> -f` against a server that was never reached fails at once, as `wait` does,
/// instead of retrying forever (a wrong `--server` is not a restart).
#[tokio::test]
async fn logs_follow_fails_at_once_when_the_server_was_never_reached() {
    let server = TestServer::start().await;
    let id = uuid::Uuid::new_v4().to_string();
    let mut cmd = cli_command(&server.base, &["work-orders", "logs", &id, "-f"]);
    cmd.env("PULLMAN_SERVER", "http://127.0.0.1:9");
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        tokio::task::spawn_blocking(move || cmd.output().unwrap()),
    )
    .await
    .expect("logs -f gave up at once")
    .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_printed(&out.stderr, "cannot reach");
}

/// `create --timeout` without `--wait` would be ignored: it is refused, and nothing is created.
#[tokio::test]
async fn create_timeout_without_wait_is_refused_before_creating() {
    let server = TestServer::start().await;
    let (_dir, file) =
        support::cli::yaml_file("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: t}\n");
    let out = cli(
        &server.base,
        &create_args(file.to_str().unwrap(), "x", &["--timeout", "30s"]),
    )
    .await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_printed(&out.stderr, "--timeout applies to --wait");
    let list = cli(&server.base, &["work-orders", "list", "-o", "json"]).await;
    assert_eq!(
        json_of(&list),
        serde_json::json!([]),
        "{}",
        text(&list.stdout)
    );
}
