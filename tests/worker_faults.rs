//! `pullman worker` when the server is not there (issue #23), the binary against no server, a
//! server that stops and comes back, and a socket that accepts and never answers: `--once --wait
//! N` ends within N + 5 s with the documented code 5, a signal never turns `--once` into 0, a
//! signal cuts a hung request short, a `--server` that is not a root URL is refused at once, and
//! "connected" is logged when the server answers, not when a long-poll ends.

mod support;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use reqwest::Method;
use serde_json::{Value, json};
use support::{ADMIN_TOKEN, eventually, free_port, pullman_bin};

/// A worker process logging to a file.
struct Worker {
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Worker {
    fn start(server: &str, token: &str, args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, token).unwrap();
        let log = dir.path().join("worker.log");
        let child = Command::new(pullman_bin())
            .args(["worker", "--server", server, "--token-file"])
            .arg(&token_file)
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

    fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }

    /// The exit code, which must come within `secs`.
    async fn exit_code(&mut self, secs: f64) -> i32 {
        let deadline = Instant::now() + Duration::from_secs_f64(secs);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().expect("exited, not killed");
            }
            assert!(
                Instant::now() < deadline,
                "worker still running after {secs} s; log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn log_contains(&self, secs: u64, needle: &str) {
        let log = &self.log;
        eventually(secs, &format!("{needle:?} in the log"), || async move {
            std::fs::read_to_string(log)
                .unwrap_or_default()
                .contains(needle)
                .then_some(())
        })
        .await;
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A socket that accepts connections and never answers (holds them until the test ends).
fn silent_socket() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming() {
            held.push(conn);
        }
    });
    base
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_with_wait_ends_in_time_with_code_5_when_no_server_answers() {
    let nobody = format!("http://127.0.0.1:{}", free_port());
    let silent = silent_socket();
    for server in [&nobody, &silent] {
        let started = Instant::now();
        let mut w = Worker::start(
            server,
            "some-token",
            &["--once", "--wait", "3", "--exec", "true"],
        );
        assert_eq!(w.exit_code(8.0).await, 5, "{server}; log:\n{}", w.log());
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(3),
            "{server}: ended after {took:?}"
        );
        assert!(
            w.log().contains("did not answer within --wait"),
            "{}",
            w.log()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_never_makes_once_succeed_and_cuts_a_hung_request_short() {
    let nobody = format!("http://127.0.0.1:{}", free_port());
    let silent = silent_socket();
    for server in [&nobody, &silent] {
        for signal in [Signal::SIGTERM, Signal::SIGINT] {
            // --once: a signal before any order is "no order", never 0.
            let mut w = Worker::start(server, "some-token", &["--once", "--exec", "true"]);
            tokio::time::sleep(Duration::from_millis(1500)).await;
            w.signal(signal);
            let code = w.exit_code(2.0).await;
            assert_eq!(code, 5, "{server} {signal}; log:\n{}", w.log());
        }
        // Without --once a signal is a clean stop (0), and as prompt while a request hangs.
        let mut w = Worker::start(server, "some-token", &["--exec", "true"]);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        w.signal(Signal::SIGTERM);
        assert_eq!(w.exit_code(2.0).await, 0, "{server}; log:\n{}", w.log());
    }
}

#[test]
fn a_server_url_without_scheme_or_with_a_path_is_refused_at_once() {
    for (server, says) in [
        (
            "127.0.0.1:8080",
            "give the scheme too, e.g. http://127.0.0.1:8080",
        ),
        (
            "http://127.0.0.1:8080/api/v1",
            "give the server's root URL (http://127.0.0.1:8080)",
        ),
        ("ftp://127.0.0.1:8080", "the scheme must be http or https"),
    ] {
        let started = Instant::now();
        let out = Command::new(pullman_bin())
            .args(["worker", "--server", server, "--token-file", "/nonexistent"])
            .args(["--once", "--exec", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{server}: {err}");
        assert!(err.contains(says), "{server}: {err}");
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}

/// `pullman serve` on a fixed port over a database that outlives it.
fn start_serve(port: u16, database_url: &str, log: &Path) -> Child {
    Command::new(pullman_bin())
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--controller", "off"])
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

fn stop(serve: &mut Child) {
    kill(Pid::from_raw(serve.id() as i32), Signal::SIGTERM).unwrap();
    serve.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stops_is_noticed_back_at_once_and_bounds_a_once_wait() {
    let database_url = support::fresh_database_url().await;
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let serve_log = dir.path().join("serve.log");
    let mut serve = start_serve(port, &database_url, &serve_log);
    wait_ready(&base).await;
    let v: Value = reqwest::Client::new()
        .request(Method::POST, format!("{base}/api/v1/agents"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"name": "w", "labels": ["w"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = v["token"].as_str().unwrap().to_string();

    // A long-running worker: after an outage, "connected again" comes when the server answers,
    // not when the first long-poll after it ends (30 s later).
    let w = Worker::start(&base, &token, &["--exec", "true"]);
    w.log_contains(30, "connected").await;
    // --once --wait 6, connected, then the server stops: it still ends within 6 + 5 s.
    let started = Instant::now();
    let mut once = Worker::start(&base, &token, &["--once", "--wait", "6", "--exec", "true"]);
    once.log_contains(30, "connected").await;
    stop(&mut serve);
    assert_eq!(
        once.exit_code(11.0 - started.elapsed().as_secs_f64()).await,
        5,
        "{}",
        once.log()
    );

    w.log_contains(30, "claim failed; retrying").await;
    let mut serve = start_serve(port, &database_url, &serve_log);
    wait_ready(&base).await;
    let back = Instant::now();
    w.log_contains(60, "connected to the server again").await;
    let late = back.elapsed();
    // The backoff after a few seconds' outage is at most 8 s; a long-poll would be 30 s.
    assert!(
        late < Duration::from_secs(12),
        "said {late:?} after the server was back"
    );
    stop(&mut serve);
}
