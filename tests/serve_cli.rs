//! `pullman serve` on the embedded PostgreSQL (start, stop, restart, nothing lost, no stray
//! process) and the admin CLI against a running server.

mod support;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::{eventually, free_port, pullman_bin};

fn start_serve(data_dir: &Path, port: u16) -> Child {
    start_serve_logging(data_dir, port, Stdio::inherit())
}

fn start_serve_logging(data_dir: &Path, port: u16, stderr: impl Into<Stdio>) -> Child {
    Command::new(pullman_bin())
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
        ])
        .arg(data_dir)
        // This test is about the embedded database; the controller has tests of its own.
        .args(["--controller", "off"])
        .env_remove("DATABASE_URL")
        .env_remove("PULLMAN_ADMIN_TOKEN")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap()
}

async fn wait_ready(port: u16) {
    let http = reqwest::Client::new();
    eventually(90, "pullman serve to be ready", || {
        let http = http.clone();
        async move {
            let r = http
                .get(format!("http://127.0.0.1:{port}/readyz"))
                .send()
                .await
                .ok()?;
            r.status().is_success().then_some(())
        }
    })
    .await;
}

fn postgres_processes_for(dir: &Path) -> Vec<String> {
    let needle = dir.to_string_lossy().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains("postgres") && c.contains(&needle))
        .collect()
}

fn sigterm(child: &Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
}

/// Waits (at most 60 s) for `child` to exit.
fn wait_for_exit(child: &mut Child) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "serve did not stop within 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn sigterm_and_wait(mut child: Child) -> std::process::ExitStatus {
    sigterm(&child);
    wait_for_exit(&mut child)
}

/// Starts `serve` (controller off, log level info) on a fresh database with `extra` arguments,
/// logging to `log`; returns once `/readyz` answers 200.
async fn serve_on_fresh_database(extra: &[&str], log: &Path) -> (Child, u16) {
    let db = support::fresh_database_url().await;
    let port = free_port();
    let child = Command::new(pullman_bin())
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--controller",
            "off",
        ])
        .args(extra)
        .env("DATABASE_URL", &db)
        .env("PULLMAN_ADMIN_TOKEN", support::ADMIN_TOKEN)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    wait_ready(port).await;
    (child, port)
}

fn cli(port: u16, token_file: &Path, args: &[&str]) -> Output {
    Command::new(pullman_bin())
        .args(args)
        .args([
            "--server",
            &format!("http://127.0.0.1:{port}"),
            "--token-file",
        ])
        .arg(token_file)
        .env_remove("PULLMAN_ADMIN_TOKEN")
        .output()
        .unwrap()
}

fn json_of(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "CLI failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_keeps_its_data_across_restarts_and_cli_works_against_it() {
    let dir = tempfile::tempdir().unwrap();
    {
        // The embedded PostgreSQL may run as an unprivileged user, who must reach the data dir.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let data = dir.path().join("data");
    let port = free_port();
    let serve = start_serve(&data, port);
    wait_ready(port).await;
    let token_file = data.join("admin-token");
    let mode = std::fs::metadata(&token_file).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );

    // Admin CLI: create an agent and a work order, list, get.
    let agent = json_of(&cli(
        port,
        &token_file,
        &[
            "agents",
            "create",
            "--name",
            "cli-agent",
            "--label",
            "c",
            "-o",
            "json",
        ],
    ));
    assert_eq!(agent["agent"]["name"], "cli-agent");
    assert!(agent["token"].as_str().unwrap().starts_with("pullman_"));
    let manifest = dir.path().join("cm.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kept\n",
    )
    .unwrap();
    let order = json_of(&cli(
        port,
        &token_file,
        &[
            "work-orders",
            "create",
            "-f",
            manifest.to_str().unwrap(),
            "--label",
            "c",
            "-o",
            "json",
        ],
    ));
    let id = order["id"].as_str().unwrap().to_string();
    let list = json_of(&cli(
        port,
        &token_file,
        &["work-orders", "list", "-o", "json"],
    ));
    assert_eq!(list[0]["id"], id.as_str());
    let table = cli(port, &token_file, &["work-orders", "list"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.starts_with("ID") && text.contains(&id) && text.contains("PENDING"),
        "{text}"
    );
    let agents =
        String::from_utf8_lossy(&cli(port, &token_file, &["agents", "list"]).stdout).to_string();
    assert!(
        agents.contains("cli-agent") && agents.contains("never_seen"),
        "{agents}"
    );

    // Clear errors for a wrong token and a wrong URL.
    let bad_token = dir.path().join("bad-token");
    std::fs::write(&bad_token, "not-the-token").unwrap();
    let out = cli(port, &bad_token, &["work-orders", "list"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("401") && err.contains("token"), "{err}");
    let out = cli(free_port(), &token_file, &["agents", "list"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach the Pullman server"), "{err}");

    // Stop with SIGTERM: clean exit, no stray postgres.
    let status = sigterm_and_wait(serve);
    assert!(status.success(), "serve exit status {status}");
    assert!(
        postgres_processes_for(&data).is_empty(),
        "stray postgres: {:?}",
        postgres_processes_for(&data)
    );

    // Start again: the order is still there; cancel it through the CLI.
    let port = free_port();
    let serve = start_serve(&data, port);
    wait_ready(port).await;
    let got = json_of(&cli(
        port,
        &token_file,
        &["work-orders", "get", &id, "-o", "json"],
    ));
    assert_eq!(got["status"], "PENDING");
    assert!(got["yaml_content"].as_str().unwrap().contains("kept"));
    let cancelled = json_of(&cli(
        port,
        &token_file,
        &["work-orders", "cancel", &id, "-o", "json"],
    ));
    assert_eq!(cancelled["outcome"], "cancelled");
    let log = json_of(&cli(port, &token_file, &["log", "get", &id, "-o", "json"]));
    assert_eq!(log["outcome"], "cancelled");
    let status = sigterm_and_wait(serve);
    assert!(status.success());
    assert!(postgres_processes_for(&data).is_empty());
}

#[test]
fn serve_without_postgres_binaries_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(pullman_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .env_remove("DATABASE_URL")
        .env("PATH", "/nonexistent")
        .env("PULLMAN_POSTGRES_BIN_DIR", "/nonexistent")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no PostgreSQL server binaries found") && err.contains("DATABASE_URL"),
        "{err}"
    );
}

/// `--controller auto` with a kubeconfig whose API server is gone: serve runs without the
/// controller and stops promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_an_unreachable_kubernetes_api_runs_without_the_controller_and_stops() {
    let db = support::fresh_database_url().await;
    // A kubeconfig pointing at a port nobody listens on.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let api = listener.local_addr().unwrap();
    drop(listener);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: 'http://{api}'}}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\nusers:\n- name: u\n  user: {{token: x}}\n"
        ),
    )
    .unwrap();
    let port = free_port();
    let child = Command::new(pullman_bin())
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--controller",
            "auto",
        ])
        .env("DATABASE_URL", &db)
        .env("KUBECONFIG", &kubeconfig)
        .env("PULLMAN_ADMIN_TOKEN", support::ADMIN_TOKEN)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_ready(port).await;
    let started = std::time::Instant::now();
    let status = sigterm_and_wait(child);
    assert!(status.success(), "{status}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "stopped in {:?}",
        started.elapsed()
    );
}

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
    let registered: Value = http
        .post(format!("{base}/agents"))
        .bearer_auth(support::ADMIN_TOKEN)
        .json(&serde_json::json!({"name": "poller", "labels": ["none"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let agent = registered["agent"]["id"].as_str().unwrap().to_string();
    let token = registered["token"].as_str().unwrap().to_string();
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

/// Issue #15: a second `serve` on a data dir in use refuses with a clear message (it used to share
/// the first one's embedded PostgreSQL, then stop it); the first keeps serving. A restart that
/// finds the generated token file says it read it, not that it generated one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_serve_on_a_data_dir_in_use_is_refused_and_a_restart_reads_the_token() {
    let dir = tempfile::tempdir().unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let data = dir.path().join("data");
    let first_log = dir.path().join("first.log");
    let port = free_port();
    let first = start_serve_logging(&data, port, std::fs::File::create(&first_log).unwrap());
    wait_ready(port).await;
    let said = std::fs::read_to_string(&first_log).unwrap();
    assert!(said.contains("admin token: generated"), "{said}");

    let second = Command::new(pullman_bin())
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{}", free_port()),
            "--data-dir",
        ])
        .arg(&data)
        .args(["--controller", "off"])
        .env_remove("DATABASE_URL")
        .env_remove("PULLMAN_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        err.contains("is in use by another pullman process")
            && err.contains(&format!("pid {}", first.id())),
        "{err}"
    );
    // `migrate` on the same dir is refused the same way.
    let migrate = Command::new(pullman_bin())
        .args(["migrate", "--data-dir"])
        .arg(&data)
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(!migrate.status.success());
    assert!(String::from_utf8_lossy(&migrate.stderr).contains("in use"));
    // A second serve on the port in use is refused at once, before it starts a database.
    let other = dir.path().join("other");
    let started = std::time::Instant::now();
    let busy = Command::new(pullman_bin())
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
        ])
        .arg(&other)
        .args(["--controller", "off"])
        .env_remove("DATABASE_URL")
        .env_remove("PULLMAN_ADMIN_TOKEN")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&busy.stderr);
    assert_eq!(busy.status.code(), Some(1), "{err}");
    assert!(
        err.contains("the address is in use") && err.contains("--listen"),
        "{err}"
    );
    assert!(!err.contains("WARN"), "nothing else is said first: {err}");
    assert!(!other.join("postgres").exists(), "no database was started");
    assert!(started.elapsed() < Duration::from_secs(5));

    // The first still serves, with its database.
    let token_file = data.join("admin-token");
    let agents = cli(port, &token_file, &["agents", "list", "-o", "json"]);
    assert!(
        agents.status.success(),
        "{}",
        String::from_utf8_lossy(&agents.stderr)
    );
    let status = sigterm_and_wait(first);
    assert!(status.success(), "{status}");
    assert!(postgres_processes_for(&data).is_empty());

    // Restart: the token is read from the file written by the first start.
    let token_before = std::fs::read_to_string(&token_file).unwrap();
    let again_log = dir.path().join("again.log");
    let port = free_port();
    let again = start_serve_logging(&data, port, std::fs::File::create(&again_log).unwrap());
    wait_ready(port).await;
    let said = std::fs::read_to_string(&again_log).unwrap();
    assert!(said.contains("admin token: read from this file"), "{said}");
    assert!(!said.contains("admin token: generated"), "{said}");
    assert_eq!(std::fs::read_to_string(&token_file).unwrap(), token_before);
    assert!(sigterm_and_wait(again).success());
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

/// The pid in `<pg_data>/postmaster.pid`, if the file is there.
fn postmaster_pid(pg_data: &Path) -> Option<i32> {
    std::fs::read_to_string(pg_data.join("postmaster.pid"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

/// Whether `pid` is a live process; a zombie (exited, not yet reaped by its parent) is not.
fn is_running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

/// Waits (at most `secs`) for `pid` to be gone; says whether it went.
fn gone_within(pid: i32, secs: u64) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while is_running(pid) {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
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
