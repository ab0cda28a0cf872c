//! The exit codes the help texts promise, checked against the binary (issue #23): the test reads
//! the codes from `work-orders wait --help` and `worker --help` and runs a case for each; a code
//! in the help without a case here, or a case the help does not list, fails it.

use crate::support;

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use support::{ADMIN_TOKEN, TestServer, configmap_order, free_port, pullman_bin};

/// The codes listed in the help of `args` after the line starting with `heading`: lines of the
/// form `  N  text`.
fn promised_codes(args: &[&str], heading: &str) -> (String, BTreeSet<i32>) {
    let out = Command::new(pullman_bin()).args(args).output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout).to_string();
    let section = help
        .split_once(heading)
        .unwrap_or_else(|| panic!("{heading:?} not in:\n{help}"))
        .1;
    let codes = section
        .lines()
        .filter_map(|l| {
            let l = l.strip_prefix("  ")?;
            let (n, rest) = l.trim_start().split_once(' ')?;
            (!rest.trim().is_empty()).then(|| n.parse().ok())?
        })
        .collect();
    (help, codes)
}

fn run(server: &str, args: &[&str]) -> (i32, String) {
    let out = Command::new(pullman_bin())
        .args(args)
        .env("PULLMAN_SERVER", server)
        .env("PULLMAN_ADMIN_TOKEN", ADMIN_TOKEN)
        .env_remove("PULLMAN_ADMIN_TOKEN_FILE")
        .output()
        .unwrap();
    (
        out.status.code().expect("exited"),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

async fn run_async(server: &str, args: &[&str]) -> (i32, String) {
    let (server, args): (String, Vec<String>) =
        (server.into(), args.iter().map(|a| a.to_string()).collect());
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&server, &args)
    })
    .await
    .unwrap()
}

/// Claims `order` as the agent and completes it.
async fn finish(s: &TestServer, agent: &str, token: &str, order: &str, success: bool) {
    let (st, c) = s.claim(order, agent, token).await;
    assert_eq!(st, 200, "{c}");
    let (st, v) = s
        .complete(
            order,
            token,
            json!({"agent_id": agent, "claim_id": c["claim_id"], "success": success,
                        "retryable": false}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_exits_as_its_help_says() {
    let (help, promised) = promised_codes(&["work-orders", "wait", "--help"], "Exit status:");
    let s = TestServer::start().await;
    let (agent, token) = s.agent(json!({"name": "x", "labels": ["x"]})).await;
    let mut checked = BTreeSet::new();
    let mut check = |code: i32, got: (i32, String), case: &str| {
        assert_eq!(got.0, code, "{case}: {}\nhelp:\n{help}", got.1);
        checked.insert(code);
    };
    let ok = s.order(configmap_order("x")).await;
    finish(&s, &agent, &token, &ok, true).await;
    check(
        0,
        run_async(&s.base, &["work-orders", "wait", &ok]).await,
        "succeeded",
    );
    let unknown = uuid::Uuid::new_v4().to_string();
    check(
        1,
        run_async(&s.base, &["work-orders", "wait", &unknown]).await,
        "unknown id",
    );
    let nobody = format!("http://127.0.0.1:{}", free_port());
    check(
        1,
        run_async(&nobody, &["work-orders", "wait", &ok]).await,
        "server unreachable",
    );
    check(
        1,
        {
            let out = Command::new(pullman_bin())
                .args([
                    "work-orders",
                    "wait",
                    &ok,
                    "--server",
                    &s.base,
                    "--token",
                    "wrong",
                ])
                .output()
                .unwrap();
            (
                out.status.code().unwrap(),
                String::from_utf8_lossy(&out.stderr).to_string(),
            )
        },
        "admin token refused",
    );
    check(
        2,
        run_async(&s.base, &["work-orders", "wait", &ok, "--timeout", "5x"]).await,
        "bad value",
    );
    check(
        2,
        run_async(&s.base, &["work-orders", "wait", &ok, "--no-such-flag"]).await,
        "unknown flag",
    );
    let failed = s.order(configmap_order("x")).await;
    finish(&s, &agent, &token, &failed, false).await;
    check(
        3,
        run_async(&s.base, &["work-orders", "wait", &failed]).await,
        "failed",
    );
    let cancelled = s.order(configmap_order("x")).await;
    let (st, _) = s.cancel(&cancelled).await;
    assert!((200..300).contains(&st));
    check(
        4,
        run_async(&s.base, &["work-orders", "wait", &cancelled]).await,
        "cancelled",
    );
    let pending = s.order(configmap_order("nobody")).await;
    check(
        5,
        run_async(
            &s.base,
            &["work-orders", "wait", &pending, "--timeout", "1"],
        )
        .await,
        "timeout",
    );
    assert_eq!(checked, promised, "codes run vs codes in the help:\n{help}");
}

/// Starts a worker; its exit code, which must come within `secs` (after `signal`, if given, is
/// sent once "connected" is logged or 1.5 s passed).
async fn worker(
    server: &str,
    token: &str,
    args: &[&str],
    signal: Option<nix::sys::signal::Signal>,
    secs: u64,
) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, token).unwrap();
    let log = dir.path().join("log");
    let mut child = Command::new(pullman_bin())
        .args([
            "worker",
            "--server",
            server,
            "--lease-seconds",
            "6",
            "--token-file",
        ])
        .arg(&token_file)
        .args(args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let mut signalled = signal.is_none();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (
                status.code().expect("exited"),
                std::fs::read_to_string(&log).unwrap(),
            );
        }
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        if !signalled
            && (said.contains("connected") || started.elapsed() > Duration::from_millis(1500))
        {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            nix::sys::signal::kill(pid, signal.unwrap()).unwrap();
            signalled = true;
        }
        if started.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            panic!("worker {args:?} still running after {secs} s:\n{said}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_exits_as_its_help_says() {
    use nix::sys::signal::Signal::SIGTERM;
    let (help, promised) = promised_codes(&["worker", "--help"], "Exit codes");
    // The flag lines say the same as the list.
    assert!(
        help.contains("(0 succeeded, 3 failed, 4 cancelled or\n          reclaimed, 5 no order)")
            || help.contains("0 succeeded, 3 failed, 4 cancelled or reclaimed, 5 no order"),
        "{help}"
    );
    assert!(help.contains("exit 5"), "--wait names 5:\n{help}");
    let s = TestServer::start_maintained().await;
    let (agent, token) = s.agent(json!({"name": "w", "labels": ["w"]})).await;
    let mut checked = BTreeSet::new();
    let mut check = |code: i32, got: (i32, String), case: &str| {
        assert_eq!(got.0, code, "{case}: {}\nhelp:\n{help}", got.1);
        checked.insert(code);
    };
    let once = |exec: &'static str| vec!["--once", "--wait", "20", "--exec", exec];
    check(
        0,
        worker(&s.base, &token, &["--exec", "true"], Some(SIGTERM), 20).await,
        "signal",
    );
    s.order(configmap_order("w")).await;
    check(
        0,
        worker(&s.base, &token, &once("true"), None, 30).await,
        "--once succeeded",
    );
    check(
        1,
        worker(&s.base, ADMIN_TOKEN, &once("true"), None, 20).await,
        "admin token",
    );
    check(
        2,
        worker(
            &s.base,
            &token,
            &["--wait", "1", "--exec", "true"],
            None,
            20,
        )
        .await,
        "--wait without --once",
    );
    s.order(
        json!({"work_type": "custom", "max_retries": 0, "targeting": {"labels": ["w"]},
                   "yaml_content": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: f\n"}),
    )
    .await;
    check(
        3,
        worker(&s.base, &token, &once("exit 3"), None, 30).await,
        "--once failed",
    );
    let doomed = s.order(configmap_order("w")).await;
    // Cancelled once the worker holds it.
    let canceller = {
        let (http, url) = (
            s.http.clone(),
            s.url(&format!("/api/v1/work-orders/{doomed}")),
        );
        tokio::spawn(async move {
            loop {
                let r = http
                    .get(&url)
                    .bearer_auth(ADMIN_TOKEN)
                    .send()
                    .await
                    .unwrap();
                let v: serde_json::Value = r.json().await.unwrap();
                if v["status"] == "CLAIMED" {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            http.delete(url)
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    check(
        4,
        worker(&s.base, &token, &once("sleep 60"), None, 40).await,
        "--once cancelled",
    );
    assert!(canceller.await.unwrap().is_success());
    check(
        5,
        worker(
            &s.base,
            &token,
            &["--once", "--wait", "1", "--exec", "true"],
            None,
            20,
        )
        .await,
        "--wait ran out",
    );
    check(
        5,
        worker(
            &s.base,
            &token,
            &["--once", "--exec", "true"],
            Some(SIGTERM),
            20,
        )
        .await,
        "--once, signal",
    );
    let (st, _) = s.retire(&agent).await;
    assert!((200..300).contains(&st));
    check(
        6,
        worker(&s.base, &token, &once("true"), None, 20).await,
        "retired agent",
    );
    assert_eq!(checked, promised, "codes run vs codes in the help:\n{help}");
}
