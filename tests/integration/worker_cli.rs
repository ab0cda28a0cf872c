//! `pullman worker` as its users see it (issue #15), the binary against a real server and
//! PostgreSQL: the command's output streamed into the worker's log, `--once` exit codes, the exit
//! on a revoked token, and riding out a server that is down at start and restarts.

use crate::support;

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use support::serve::Restartable;
use support::worker::WorkerProcess;
use support::{TestServer, configmap_order, eventually};

/// A worker with a 6 s lease, so that it notices a retirement or a revoked token quickly.
fn worker(base: &str, token: &str, args: &[&str]) -> WorkerProcess {
    WorkerProcess::start(base, token, &[&["--lease-seconds", "6"], args].concat())
}

fn order(label: &str, name: &str) -> Value {
    json!({
        "work_type": "custom",
        "yaml_content": format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n"),
        "max_retries": 0,
        "targeting": {"labels": [label]},
    })
}

/// Runs `pullman worker --once --exec EXEC` to its end (60 s at most), checks that it exits
/// with `code` (`what`: the case, shown with the log when it does not); returns its log.
async fn once(base: &str, token: &str, exec: &str, code: i32, what: &str) -> String {
    let mut w = worker(base, token, &["--once", "--exec", exec]);
    assert_eq!(w.exit_code(60.0).await, code, "{what}; log:\n{}", w.log());
    w.log()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_streams_the_output_and_exits_with_the_order_status() {
    let s = TestServer::start_maintained().await;
    let (_, token) = s.agent(json!({"name": "once", "labels": ["once"]})).await;
    // Decides by the ConfigMap's name; writes to both streams, with a pause in between so the
    // first line is logged while the command still runs.
    let exec = r#"order=$(cat); echo "first line on stdout"; echo "a warning on stderr" >&2;
        case "$order" in *name:\ good*) sleep 1; echo "all done";; *) echo "it broke" >&2; exit 7;; esac"#;

    let good = s.order(order("once", "good")).await;
    let log = once(&s.base, &token, exec, 0, "succeeded order").await;
    for needle in [
        "first line on stdout",
        "a warning on stderr",
        "all done",
        "exit_status=0",
    ] {
        let line = log
            .lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("{needle:?} not in the log:\n{log}"));
        assert!(
            line.contains(&good),
            "line not prefixed with the order id: {line}"
        );
    }
    let first = log.find("first line on stdout").unwrap();
    let exited = log.find("exit_status=0").unwrap();
    assert!(first < exited, "output is logged before the exit status");
    assert!(log.contains(r#"stream="stderr""#), "{log}");
    let v = s.log_entry(&good, 10).await;
    assert_eq!(v["outcome"], "succeeded");
    assert_eq!(v["message"], "first line on stdout\nall done");

    let bad = s.order(order("once", "bad")).await;
    let log = once(&s.base, &token, exec, 3, "failed order").await;
    assert!(
        log.contains("it broke") && log.contains("exit_status=7"),
        "{log}"
    );
    let v = s.log_entry(&bad, 10).await;
    assert_eq!(v["outcome"], "failed");
    assert_eq!(v["message"], "exit status 7: a warning on stderr\nit broke");

    // Nothing queued: --wait bounds the wait.
    let started = Instant::now();
    let mut w = worker(&s.base, &token, &["--once", "--wait", "2", "--exec", exec]);
    assert_eq!(w.exit_code(30.0).await, 5, "no order; log:\n{}", w.log());
    assert!(started.elapsed() >= Duration::from_secs(2));

    // --wait without --once is a usage error.
    let mut w = worker(&s.base, &token, &["--wait", "2", "--exec", exec]);
    assert_eq!(w.exit_code(30.0).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_agent_or_revoked_token_stops_the_worker_with_a_clear_message() {
    let s = TestServer::start_maintained().await;
    let (id, token) = s.agent(json!({"name": "doomed", "labels": ["r"]})).await;

    // Revoked while idle in a long-poll: the next claim is refused.
    let mut w = worker(&s.base, &token, &["--exec", "sleep 30"]);
    w.log_contains(30, "connected").await;
    let (status, v) = s
        .admin(Method::POST, &format!("/api/v1/agents/{id}/token"), None)
        .await;
    assert_eq!(status, 201, "{v}");
    let new_token = v["token"].as_str().unwrap().to_string();
    assert_eq!(w.exit_code(60.0).await, 6, "log:\n{}", w.log());
    assert!(
        w.log().contains("refused this agent's token"),
        "{}",
        w.log()
    );

    // Retired while running an order: heartbeats are refused, the command is stopped.
    let o = s.order(configmap_order("r")).await;
    let mut w = worker(&s.base, &new_token, &["--exec", "sleep 60"]);
    eventually(30, "the claim", || async {
        let (_, v) = s.admin_get(&format!("/api/v1/work-orders/{o}")).await;
        (v["status"] == "CLAIMED").then_some(())
    })
    .await;
    let (status, v) = s.retire(&id).await;
    assert!((200..300).contains(&status), "{status} {v}");
    assert_eq!(w.exit_code(60.0).await, 6, "log:\n{}", w.log());
    assert!(
        w.log().contains("refused this agent's token"),
        "{}",
        w.log()
    );

    // A retired agent's token at start: refused at once, not retried.
    let mut w = worker(&s.base, &new_token, &["--exec", "true"]);
    assert_eq!(w.exit_code(15.0).await, 6, "log:\n{}", w.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_waits_for_a_server_down_at_start_and_rides_out_a_restart() {
    // Register the agent on a first server run, then stop it: the worker starts with no server.
    let mut serve = Restartable::start(&["--maintenance-interval-seconds", "1"]).await;
    let (api, base) = (serve.api.clone(), serve.base.clone());
    let (_, token) = api.agent(json!({"name": "patient", "labels": ["p"]})).await;
    serve.stop();

    let w = worker(
        &base,
        &token,
        &["--exec", "echo ran $PULLMAN_WORK_ORDER_ID"],
    );
    w.log_contains(30, "server not reachable; retrying").await;
    serve.start_again().await;
    w.log_contains(60, "connected").await;
    let first = api.order(configmap_order("p")).await;
    assert_eq!(api.log_entry(&first, 60).await["outcome"], "succeeded");

    // The server goes away while the worker long-polls, and comes back on the same port and
    // database: the worker says so and carries on.
    serve.stop();
    w.log_contains(60, "claim failed; retrying").await;
    serve.start_again().await;
    w.log_contains(60, "connected to the server again").await;
    let second = api.order(configmap_order("p")).await;
    assert_eq!(api.log_entry(&second, 60).await["outcome"], "succeeded");
    assert_eq!(
        w.log().matches("connected to the server again").count(),
        1,
        "said once per outage:\n{}",
        w.log()
    );
    serve.stop();
}
