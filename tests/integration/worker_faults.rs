//! `pullman worker` when the server is not there (issue #23), the binary against no server, a
//! server that stops and comes back, and a socket that accepts and never answers: `--once --wait
//! N` ends within N + 5 s with the documented code 5, a signal never turns `--once` into 0, a
//! signal cuts a hung request short, a `--server` that is not a root URL is refused at once, and
//! "connected" is logged when the server answers, not when a long-poll ends.

use crate::support;

use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::json;
use support::serve::Restartable;
use support::worker::WorkerProcess;
use support::{free_port, pullman_bin};

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
        let mut w = WorkerProcess::start(
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
            let mut w = WorkerProcess::start(server, "some-token", &["--once", "--exec", "true"]);
            tokio::time::sleep(Duration::from_millis(1500)).await;
            w.signal(signal);
            let code = w.exit_code(2.0).await;
            assert_eq!(code, 5, "{server} {signal}; log:\n{}", w.log());
        }
        // Without --once a signal is a clean stop (0), and as prompt while a request hangs.
        let mut w = WorkerProcess::start(server, "some-token", &["--exec", "true"]);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stops_is_noticed_back_at_once_and_bounds_a_once_wait() {
    let mut serve = Restartable::start(&[]).await;
    let base = serve.base.clone();
    let (_, token) = serve.api.agent(json!({"name": "w", "labels": ["w"]})).await;

    // A long-running worker: after an outage, "connected again" comes when the server answers,
    // not when the first long-poll after it ends (30 s later).
    let w = WorkerProcess::start(&base, &token, &["--exec", "true"]);
    w.log_contains(30, "connected").await;
    // --once --wait 6, connected, then the server stops: it still ends within 6 + 5 s.
    let started = Instant::now();
    let mut once =
        WorkerProcess::start(&base, &token, &["--once", "--wait", "6", "--exec", "true"]);
    once.log_contains(30, "connected").await;
    serve.stop();
    assert_eq!(
        once.exit_code(11.0 - started.elapsed().as_secs_f64()).await,
        5,
        "{}",
        once.log()
    );

    w.log_contains(30, "claim failed; retrying").await;
    serve.start_again().await;
    let back = Instant::now();
    w.log_contains(60, "connected to the server again").await;
    let late = back.elapsed();
    // The backoff after a few seconds' outage is at most 8 s; a long-poll would be 30 s.
    assert!(
        late < Duration::from_secs(12),
        "said {late:?} after the server was back"
    );
    serve.stop();
}
