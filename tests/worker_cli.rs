//! `pullman worker` as its users see it (issue #15), the binary against a real server and
//! PostgreSQL: the command's output streamed into the worker's log, `--once` exit codes, the exit
//! on a revoked token, and riding out a server that is down at start and restarts.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use support::{ADMIN_TOKEN, TestServer, configmap_order, eventually, free_port, pullman_bin};

/// A worker process whose log (stderr) goes to a file the test reads while it runs.
struct Worker {
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Worker {
    fn start(base: &str, token: &str, args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, token).unwrap();
        let log = dir.path().join("worker.log");
        let child = Command::new(pullman_bin())
            .args(["worker", "--server", base, "--token-file"])
            .arg(&token_file)
            .args(["--lease-seconds", "6"])
            .args(args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Worker {
            child,
            log,
            _dir: dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the process to exit; its exit code.
    async fn exit_code(&mut self, secs: u64) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().expect("exited, not killed");
            }
            assert!(
                Instant::now() < deadline,
                "worker still running after {secs} s; log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn log_contains(&self, secs: u64, needle: &str) {
        let log = &self.log;
        eventually(
            secs,
            &format!("{needle:?} in the worker's log"),
            || async move {
                std::fs::read_to_string(log)
                    .unwrap_or_default()
                    .contains(needle)
                    .then_some(())
            },
        )
        .await;
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn order(label: &str, name: &str) -> Value {
    json!({
        "work_type": "custom",
        "yaml_content": format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n"),
        "max_retries": 0,
        "targeting": {"labels": [label]},
    })
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
    let mut w = Worker::start(&s.base, &token, &["--once", "--exec", exec]);
    assert_eq!(
        w.exit_code(60).await,
        0,
        "succeeded order; log:\n{}",
        w.log()
    );
    let log = w.log();
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
    let mut w = Worker::start(&s.base, &token, &["--once", "--exec", exec]);
    assert_eq!(w.exit_code(60).await, 3, "failed order; log:\n{}", w.log());
    let log = w.log();
    assert!(
        log.contains("it broke") && log.contains("exit_status=7"),
        "{log}"
    );
    let v = s.log_entry(&bad, 10).await;
    assert_eq!(v["outcome"], "failed");
    assert_eq!(v["message"], "exit status 7: a warning on stderr\nit broke");

    // Nothing queued: --wait bounds the wait.
    let started = Instant::now();
    let mut w = Worker::start(&s.base, &token, &["--once", "--wait", "2", "--exec", exec]);
    assert_eq!(w.exit_code(30).await, 5, "no order; log:\n{}", w.log());
    assert!(started.elapsed() >= Duration::from_secs(2));

    // --wait without --once is a usage error.
    let mut w = Worker::start(&s.base, &token, &["--wait", "2", "--exec", exec]);
    assert_eq!(w.exit_code(30).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_agent_or_revoked_token_stops_the_worker_with_a_clear_message() {
    let s = TestServer::start_maintained().await;
    let (id, token) = s.agent(json!({"name": "doomed", "labels": ["r"]})).await;

    // Revoked while idle in a long-poll: the next claim is refused.
    let mut w = Worker::start(&s.base, &token, &["--exec", "sleep 30"]);
    w.log_contains(30, "connected").await;
    let (status, v) = s
        .admin(Method::POST, &format!("/api/v1/agents/{id}/token"), None)
        .await;
    assert_eq!(status, 201, "{v}");
    let new_token = v["token"].as_str().unwrap().to_string();
    assert_eq!(w.exit_code(60).await, 6, "log:\n{}", w.log());
    assert!(
        w.log().contains("refused this agent's token"),
        "{}",
        w.log()
    );

    // Retired while running an order: heartbeats are refused, the command is stopped.
    let o = s.order(configmap_order("r")).await;
    let mut w = Worker::start(&s.base, &new_token, &["--exec", "sleep 60"]);
    eventually(30, "the claim", || async {
        let (_, v) = s.admin_get(&format!("/api/v1/work-orders/{o}")).await;
        (v["status"] == "CLAIMED").then_some(())
    })
    .await;
    let (status, v) = s.retire(&id).await;
    assert!((200..300).contains(&status), "{status} {v}");
    assert_eq!(w.exit_code(60).await, 6, "log:\n{}", w.log());
    assert!(
        w.log().contains("refused this agent's token"),
        "{}",
        w.log()
    );

    // A retired agent's token at start: refused at once, not retried.
    let mut w = Worker::start(&s.base, &new_token, &["--exec", "true"]);
    assert_eq!(w.exit_code(15).await, 6, "log:\n{}", w.log());
}

/// `pullman serve` on a fixed port over a database that outlives it.
fn start_serve(port: u16, database_url: &str, log: &Path) -> Child {
    Command::new(pullman_bin())
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--controller", "off", "--maintenance-interval-seconds", "1"])
        .env("DATABASE_URL", database_url)
        .env("PULLMAN_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .unwrap(),
        )
        .spawn()
        .unwrap()
}

async fn admin_call(base: &str, method: Method, path: &str, body: Option<Value>) -> Value {
    let mut req = reqwest::Client::new()
        .request(method, format!("{base}{path}"))
        .bearer_auth(ADMIN_TOKEN);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.unwrap();
    assert!(r.status().is_success(), "{path}: {}", r.status());
    r.json().await.unwrap()
}

async fn wait_ready(base: &str) {
    let http = reqwest::Client::new();
    eventually(90, "pullman serve to be ready", || {
        let http = http.clone();
        async move {
            let r = http.get(format!("{base}/readyz")).send().await.ok()?;
            r.status().is_success().then_some(())
        }
    })
    .await;
}

async fn outcome(base: &str, id: &str) -> String {
    let mut last = Value::Null;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let r = reqwest::Client::new()
            .get(format!("{base}/api/v1/work-order-log/{id}"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await;
        if let Ok(r) = r
            && r.status() == 200
        {
            last = r.json().await.unwrap();
            return last["outcome"].as_str().unwrap_or("").to_string();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("order {id} did not finish: {last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_waits_for_a_server_down_at_start_and_rides_out_a_restart() {
    let database_url = support::fresh_database_url().await;
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let serve_log = dir.path().join("serve.log");

    // Register the agent on a first server run, then stop it: the worker starts with no server.
    let mut serve = start_serve(port, &database_url, &serve_log);
    wait_ready(&base).await;
    let v = admin_call(
        &base,
        Method::POST,
        "/api/v1/agents",
        Some(json!({"name": "patient", "labels": ["p"]})),
    )
    .await;
    let token = v["token"].as_str().unwrap().to_string();
    stop(&mut serve);

    let w = Worker::start(
        &base,
        &token,
        &["--exec", "echo ran $PULLMAN_WORK_ORDER_ID"],
    );
    w.log_contains(30, "server not reachable; retrying").await;
    let mut serve = start_serve(port, &database_url, &serve_log);
    wait_ready(&base).await;
    w.log_contains(60, "connected").await;
    let first = admin_call(
        &base,
        Method::POST,
        "/api/v1/work-orders",
        Some(configmap_order("p")),
    )
    .await;
    let first = first["id"].as_str().unwrap().to_string();
    assert_eq!(outcome(&base, &first).await, "succeeded");

    // The server goes away while the worker long-polls, and comes back on the same port and
    // database: the worker says so and carries on.
    stop(&mut serve);
    w.log_contains(60, "claim failed; retrying").await;
    let mut serve = start_serve(port, &database_url, &serve_log);
    wait_ready(&base).await;
    w.log_contains(60, "connected to the server again").await;
    let second = admin_call(
        &base,
        Method::POST,
        "/api/v1/work-orders",
        Some(configmap_order("p")),
    )
    .await;
    let second = second["id"].as_str().unwrap().to_string();
    assert_eq!(outcome(&base, &second).await, "succeeded");
    assert_eq!(
        w.log().matches("connected to the server again").count(),
        1,
        "said once per outage:\n{}",
        w.log()
    );
    stop(&mut serve);
}

fn stop(serve: &mut Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(serve.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    serve.wait().unwrap();
}
