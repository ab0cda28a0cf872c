//! `pullman serve` stopping (docs/design.md §11 "stopping"): held long-polls answered and the
//! process gone within seconds of SIGTERM, the shutdown delay and a second signal that ends it,
//! and a killed `serve` that takes its embedded PostgreSQL along.

use crate::support;

use std::process::{Command, Stdio};
use std::time::Duration;

use support::serve::{
    gone_within, is_running, postgres_processes_for, postmaster_pid, serve_on_fresh_database,
    sigterm, sigterm_and_wait, start_serve, start_serve_logging, wait_for_exit, wait_ready,
};
use support::{eventually, free_port};

/// docs/design.md §7: `serve` is gone within a few seconds of SIGTERM while agents long-poll (it took
/// 23–29 s, the long-polls' wait, and Kubernetes kills at 30 s), answering the held long-polls at
/// once and saying what it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_held_long_polls_and_stops_within_seconds_of_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let (child, port) = serve_on_fresh_database(&[], &log).await;
    let base = format!("http://127.0.0.1:{port}/api/v1");
    let http = reqwest::Client::new();
    let (agent, token) = support::ApiClient::new(&format!("http://127.0.0.1:{port}"))
        .agent(serde_json::json!({"name": "poller", "labels": ["none"]}))
        .await;
    let polls: Vec<_> = (0..16)
        .map(|_| {
            let req = http
                .post(format!("{base}/agents/{agent}/claim"))
                .bearer_auth(&token)
                .json(&serde_json::json!({"max_wait_seconds": 30}));
            tokio::spawn(async move { req.send().await.map(|r| r.status().as_u16()) })
        })
        .collect();
    // Let every long-poll reach its wait.
    eventually(10, "16 long-polls held", || {
        let http = http.clone();
        async move {
            let text = http
                .get(format!("http://127.0.0.1:{port}/metrics"))
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            text.lines()
                .any(|l| l.starts_with("pullman_long_polls ") && l.ends_with(" 16"))
                .then_some(())
        }
    })
    .await;

    let started = std::time::Instant::now();
    let status = sigterm_and_wait(child);
    let took = started.elapsed();
    assert!(status.success(), "{status}");
    assert!(took < Duration::from_secs(8), "serve took {took:?} to stop");
    for p in polls {
        let answered = p.await.unwrap();
        assert_eq!(
            answered.ok(),
            Some(204),
            "a held long-poll was not answered"
        );
    }
    let said = std::fs::read_to_string(&log).unwrap();
    for step in [
        "answering held long-polls",
        "in-flight requests finished",
        "maintenance and notification listener stopped",
    ] {
        assert!(
            said.contains(step),
            "the log does not say {step:?}:\n{said}"
        );
    }
}

/// docs/design.md §7: during `--shutdown-delay-seconds` after SIGTERM, `serve` still answers new
/// connections (a rolling update routed some there and they timed out: serve had gone within
/// 0.3 s of the signal), `/readyz` says it is stopping, and it exits once the delay is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_keeps_answering_through_its_shutdown_delay() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let (mut child, port) = serve_on_fresh_database(&["--shutdown-delay-seconds", "4"], &log).await;
    let url = |path: &str| format!("http://127.0.0.1:{port}{path}");
    let started = std::time::Instant::now();
    sigterm(&child);
    // A fresh client for each request: a new connection, as a Service routes a new one.
    let fresh = || {
        reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap()
    };
    let not_ready = eventually(3, "/readyz to answer 503", || async {
        let r = fresh().get(url("/readyz")).send().await.ok()?;
        (r.status() == 503).then_some(r.text().await.ok()?)
    })
    .await;
    assert!(not_ready.contains("shutting down"), "{not_ready}");
    let mut answered = 0;
    while started.elapsed() < Duration::from_secs(3) {
        assert_eq!(
            fresh().get(url("/healthz")).send().await.unwrap().status(),
            200
        );
        let agents = fresh()
            .get(url("/api/v1/agents"))
            .bearer_auth(support::ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(agents.status(), 200, "an API call during the delay");
        answered += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(answered > 5, "only {answered} rounds during the delay");
    assert!(
        child.try_wait().unwrap().is_none(),
        "serve exited inside its delay"
    );
    let status = wait_for_exit(&mut child);
    let took = started.elapsed();
    assert!(status.success(), "{status}");
    assert!(
        took >= Duration::from_secs(4) && took < Duration::from_secs(4 + 8),
        "serve stopped {took:?} after SIGTERM with a 4 s delay"
    );
    let said = std::fs::read_to_string(&log).unwrap();
    for step in [
        "still answering for the shutdown delay",
        "in-flight requests finished",
    ] {
        assert!(
            said.contains(step),
            "the log does not say {step:?}:\n{said}"
        );
    }
    assert!(
        fresh().get(url("/healthz")).send().await.is_err(),
        "still listening after exit"
    );
}

/// A second signal ends the shutdown delay: an operator's second Ctrl-C is not made to wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_ends_the_shutdown_delay() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let (mut child, port) =
        serve_on_fresh_database(&["--shutdown-delay-seconds", "120"], &log).await;
    sigterm(&child);
    let http = reqwest::Client::new();
    eventually(3, "/readyz to answer 503", || async {
        let r = http
            .get(format!("http://127.0.0.1:{port}/readyz"))
            .send()
            .await
            .ok()?;
        (r.status() == 503).then_some(())
    })
    .await;
    let started = std::time::Instant::now();
    sigterm(&child);
    let status = wait_for_exit(&mut child);
    assert!(status.success(), "{status}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "serve took {:?} after the second signal",
        started.elapsed()
    );
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("a second signal ends the shutdown delay"),
        "{said}"
    );
}

/// Issue #36 point 6: a `kill -9` of `serve` took nothing of its PostgreSQL with it; the next
/// `serve` then connected to that orphan, said "embedded PostgreSQL running" although its own
/// postmaster had failed on the lock file, and said "stopped" on SIGTERM while the orphan ran on.
/// Now the embedded PostgreSQL goes with a killed `serve`, and a PostgreSQL found running on the
/// data dir anyway (left by an older pullman, or started by hand) is named in the log and stopped
/// before `serve` starts its own; "stopped" is said once the postmaster has exited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_serve_takes_its_postgres_along_and_a_left_over_one_is_stopped_and_said() {
    let dir = tempfile::tempdir().unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let data = dir.path().join("data");
    let pg_root = data.join("postgres");
    let pg_data = pg_root.join("data");

    // kill -9 of serve: its postmaster exits too.
    let port = free_port();
    let mut first = start_serve(&data, port);
    wait_ready(port).await;
    let killed_with_serve = postmaster_pid(&pg_data).expect("postmaster.pid of the first serve");
    assert!(is_running(killed_with_serve));
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(
        gone_within(killed_with_serve, 15),
        "the embedded PostgreSQL (pid {killed_with_serve}) outlived a kill -9 of serve: {:?}",
        postgres_processes_for(&data)
    );

    // A PostgreSQL left running on the data dir anyway, on the socket serve uses.
    let bin = pullman::postgres::find_binaries(None).unwrap();
    let mut orphan = Command::new(bin.join("postgres"));
    if nix::unistd::Uid::effective().is_root() {
        use std::os::unix::process::CommandExt;
        let user = nix::unistd::User::from_name("postgres").unwrap().unwrap();
        orphan.uid(user.uid.as_raw()).gid(user.gid.as_raw());
    }
    let orphan_log = std::fs::File::create(dir.path().join("orphan.log")).unwrap();
    let mut orphan = orphan
        .arg("-D")
        .arg(&pg_data)
        .arg("-k")
        .arg(pg_root.join("run"))
        .args(["-c", "listen_addresses=", "-p", "5432"])
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stdout(orphan_log.try_clone().unwrap())
        .stderr(orphan_log)
        .spawn()
        .unwrap();
    let orphan_pid = orphan.id() as i32;
    eventually(60, "the left-over PostgreSQL to be ready", || {
        let file = std::fs::read_to_string(pg_data.join("postmaster.pid")).unwrap_or_default();
        let ready = file.lines().next() == Some(orphan_pid.to_string().as_str())
            && file.lines().nth(7).is_some_and(|s| s.trim() == "ready");
        async move { ready.then_some(()) }
    })
    .await;

    let log = dir.path().join("second.log");
    let port = free_port();
    let second = start_serve_logging(&data, port, std::fs::File::create(&log).unwrap());
    wait_ready(port).await;
    let said = std::fs::read_to_string(&log).unwrap();
    let found = said
        .lines()
        .find(|l| l.contains("left running on this data directory"))
        .unwrap_or_else(|| panic!("serve does not say it found a PostgreSQL running: {said}"));
    assert!(found.contains(&format!("pid={orphan_pid}")), "{found}");
    assert!(
        said.contains("the left-over PostgreSQL stopped"),
        "serve does not say what became of it: {said}"
    );
    assert!(
        orphan.try_wait().unwrap().is_some(),
        "serve is ready while the left-over PostgreSQL still runs"
    );
    let own = postmaster_pid(&pg_data).expect("postmaster.pid of the second serve");
    assert_ne!(own, orphan_pid);
    assert!(is_running(own));
    assert!(!said.contains("embedded PostgreSQL stopped"), "{said}");

    // SIGTERM: "stopped" is said, and true.
    let status = sigterm_and_wait(second);
    assert!(status.success(), "serve exit status {status}");
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("embedded PostgreSQL stopped"), "{said}");
    assert!(
        !is_running(own),
        "serve said its PostgreSQL (pid {own}) stopped; it runs on"
    );
    assert!(
        postgres_processes_for(&data).is_empty(),
        "stray postgres: {:?}",
        postgres_processes_for(&data)
    );
}
