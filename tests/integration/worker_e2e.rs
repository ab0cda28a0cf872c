//! `pullman worker --exec` end to end against a running server and a real PostgreSQL: the binary
//! is started as a user would start it.

use crate::support;

use std::process::{Child, Command, Stdio};

use serde_json::json;
use support::{TestServer, configmap_order, eventually, pullman_bin};

struct Worker {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Worker {
    fn start(s: &TestServer, token: &str, exec: &str, lease: u32) -> Self {
        Self::start_with(s, token, exec, &["--lease-seconds", &lease.to_string()])
    }

    /// A worker carrying out up to `concurrency` orders at once.
    fn start_concurrent(s: &TestServer, token: &str, exec: &str, concurrency: u32) -> Self {
        Self::start_with(s, token, exec, &["--concurrency", &concurrency.to_string()])
    }

    /// `pullman worker --exec EXEC` with `flags`, its token in a file of its own.
    fn start_with(s: &TestServer, token: &str, exec: &str, flags: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, token).unwrap();
        let child = Command::new(pullman_bin())
            .args(["worker", "--server", &s.base, "--token-file"])
            .arg(&token_file)
            .args(flags)
            .args(["--exec", exec])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        Worker { child, _dir: dir }
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_reports_success_failure_retry_and_exit_3() {
    let s = TestServer::start_maintained().await;
    let (_, token) = s.agent(json!({"name": "w", "labels": ["w"]})).await;
    // The script reads the order from stdin and decides by the ConfigMap's name.
    let script = r#"order=$(cat); case "$order" in
        *name:\ ok*) echo "all good for $PULLMAN_WORK_ORDER_ID";;
        *name:\ flaky*) if [ -e "$FLAG" ]; then echo recovered; else touch "$FLAG"; echo "first try broke" >&2; exit 1; fi;;
        *name:\ fatal*) echo "cannot ever work" >&2; exit 3;;
    esac"#;
    let flag = tempfile::tempdir().unwrap();
    let exec = format!("FLAG={}/flag; {script}", flag.path().display());
    let _w = Worker::start(&s, &token, &exec, 15);
    let order = |name: &str, retries: i64| {
        json!({
            "work_type": "custom",
            "yaml_content": format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n"),
            "max_retries": retries, "backoff_seconds": 1,
            "targeting": {"labels": ["w"]},
        })
    };
    let ok = s.order(order("ok", 0)).await;
    let flaky = s.order(order("flaky", 1)).await;
    let fatal = s.order(order("fatal", 3)).await;

    let v = s.log_entry(&ok, 30).await;
    assert_eq!(v["outcome"], "succeeded");
    assert_eq!(v["message"], format!("all good for {ok}"));

    let v = s.log_entry(&flaky, 45).await;
    assert_eq!(v["outcome"], "succeeded", "{v}");
    assert_eq!(
        v["retry_count"], 1,
        "one failed attempt, retried through the 202 path"
    );
    assert_eq!(v["last_error"], "exit status 1: first try broke");
    assert_eq!(v["message"], "recovered");

    let v = s.log_entry(&fatal, 30).await;
    assert_eq!(v["outcome"], "failed");
    assert_eq!(
        v["retry_count"], 0,
        "exit 3 is not retried although max_retries is 3"
    );
    assert_eq!(v["message"], "exit status 3: cannot ever work");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_outlives_its_lease_while_heartbeating_is_not_reaped() {
    let s = TestServer::start_maintained().await;
    let (_, token) = s.agent(json!({"name": "slow", "labels": ["slow"]})).await;
    let _w = Worker::start(&s, &token, "sleep 14; echo finished", 6);
    let o = s.order(configmap_order("slow")).await;
    let v = s.log_entry(&o, 60).await;
    assert_eq!(v["outcome"], "succeeded", "{v}");
    assert_eq!(v["message"], "finished");
    assert_eq!(
        v["reclaim_count"], 0,
        "heartbeats kept the 6 s lease alive for 14 s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_order_leaves_it_to_the_reaper_and_another_worker() {
    let s = TestServer::start_maintained().await;
    let (a_id, a_tok) = s.agent(json!({"name": "doomed", "labels": ["k"]})).await;
    let o = s.order(configmap_order("k")).await;
    let doomed = Worker::start(&s, &a_tok, "sleep 25", 6);
    eventually(30, "the first worker's claim", || async {
        let (_, v) = s.admin_get(&format!("/api/v1/work-orders/{o}")).await;
        (v["claimed_by"] == json!(a_id)).then_some(())
    })
    .await;
    doomed.signal(nix::sys::signal::Signal::SIGKILL);
    drop(doomed);
    let (b_id, b_tok) = s.agent(json!({"name": "rescuer", "labels": ["k"]})).await;
    let _rescuer = Worker::start(&s, &b_tok, "echo rescued", 6);
    let v = s.log_entry(&o, 60).await;
    assert_eq!(v["outcome"], "succeeded", "{v}");
    assert_eq!(v["claimed_by"], json!(b_id));
    assert_eq!(
        v["reclaim_count"], 1,
        "returned to PENDING after the lease expired"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_the_running_order_finish_and_stops_claiming() {
    let s = TestServer::start_maintained().await;
    let (_, token) = s.agent(json!({"name": "term", "labels": ["t"]})).await;
    let first = s.order(configmap_order("t")).await;
    let mut w = Worker::start(&s, &token, "sleep 3; echo graceful", 30);
    eventually(30, "the claim", || async {
        let (_, v) = s.admin_get(&format!("/api/v1/work-orders/{first}")).await;
        (v["status"] == "CLAIMED").then_some(())
    })
    .await;
    w.signal(nix::sys::signal::Signal::SIGTERM);
    let second = s.order(configmap_order("t")).await;
    let v = s.log_entry(&first, 30).await;
    assert_eq!(v["message"], "graceful");
    let status = tokio::task::spawn_blocking(move || {
        let st = w.child.wait();
        (st, w)
    })
    .await
    .unwrap()
    .0
    .unwrap();
    assert!(
        status.success(),
        "worker exits cleanly after draining: {status}"
    );
    let (_, v) = s.admin_get(&format!("/api/v1/work-orders/{second}")).await;
    assert_eq!(v["status"], "PENDING", "no new claim after SIGTERM");
}

/// `worker --concurrency 4` claims as many orders as it has free slots in one request (multi-claim,
/// `max_orders`): orders claimed by one statement share its `claimed_at` (the transaction's
/// `now()`), so twelve orders queued before the worker starts are claimed in groups, never more
/// than four held at once, and each is completed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_worker_claims_its_free_slots_in_one_request() {
    let s = TestServer::start().await;
    let (agent, token) = s.agent(json!({"name": "multi", "labels": ["multi"]})).await;
    let mut orders = Vec::new();
    for _ in 0..12 {
        orders.push(s.order(configmap_order("multi")).await);
    }
    let _w = Worker::start_concurrent(&s, &token, "sleep 0.5", 4);
    for id in &orders {
        assert_eq!(s.log_entry(id, 60).await["outcome"], "succeeded");
    }
    let groups: Vec<(i64,)> = sqlx::query_as(
        "SELECT count(*) FROM work_order_log WHERE claimed_by = $1::uuid \
         GROUP BY claimed_at ORDER BY count(*) DESC",
    )
    .bind(&agent)
    .fetch_all(&s.pool)
    .await
    .unwrap();
    let sizes: Vec<i64> = groups.iter().map(|g| g.0).collect();
    assert_eq!(sizes.iter().sum::<i64>(), 12, "{sizes:?}");
    assert!(
        sizes[0] > 1,
        "no two orders were claimed together: {sizes:?}"
    );
    assert!(
        sizes.iter().all(|&n| n <= 4),
        "more than --concurrency at once: {sizes:?}"
    );
}

/// A cancel stops CMD within about a check-in (`--check-in-seconds`, default 1), not a third of
/// the lease later, even when CMD prints nothing: here the lease is 60 s, so the heartbeat of
/// docs/design.md §4 alone would take 20 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_stops_a_silent_command_within_seconds() {
    let s = TestServer::start_maintained().await;
    let (_, token) = s.agent(json!({"name": "quiet", "labels": ["q"]})).await;
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let exec = format!("echo $$ > {}; exec sleep 120", pid_file.display());
    let _w = Worker::start(&s, &token, &exec, 60);
    let order = s.order(configmap_order("q")).await;
    let pid = eventually(30, "the command's pid", || async {
        let text = std::fs::read_to_string(&pid_file).ok()?;
        text.trim().parse::<i32>().ok()
    })
    .await;
    let alive = || std::path::Path::new(&format!("/proc/{pid}")).exists() && !zombie(pid);
    assert!(alive(), "the command runs");
    let (status, _) = s.cancel(&order).await;
    assert!((200..300).contains(&status), "cancel answered {status}");
    let cancelled = std::time::Instant::now();
    while alive() {
        assert!(
            cancelled.elapsed() < std::time::Duration::from_secs(3),
            "the cancelled order's command still runs {:?} after the cancel",
            cancelled.elapsed()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let v = s.log_entry(&order, 10).await;
    assert_eq!(v["outcome"], "cancelled", "{v}");
}

/// Whether process `pid` is a zombie (exited, not yet reaped by its parent).
fn zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}
