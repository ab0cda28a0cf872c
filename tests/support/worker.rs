//! `pullman worker` against a test server: run `--once` to its end, or started as a process the
//! test watches and signals; and the stored output read back whole.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use serde_json::Value;

use super::{ADMIN_TOKEN, eventually, pullman_bin};

/// How a `pullman worker` process ended and everything it printed.
pub struct WorkerRun {
    /// The exit code; `None` when killed by a signal.
    pub code: Option<i32>,
    pub stdout: String,
    /// The worker's log (`RUST_LOG=info`, no colours).
    pub stderr: String,
}

impl WorkerRun {
    /// Both streams, for assertions on what the worker printed anywhere.
    pub fn printed(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
}

/// Runs `pullman worker --once --server <base>` with a token file holding `token`, then `args`,
/// with `envs` added to its environment; waits for its exit at most `secs` seconds.
///
/// # Panics
/// When the binary cannot be started or runs past `secs` (it is then killed).
pub async fn run_worker_once(
    base: &str,
    token: &str,
    args: &[&str],
    envs: &[(&str, &str)],
    secs: u64,
) -> WorkerRun {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, token).expect("writing the token file");
    let child = tokio::process::Command::new(pullman_bin())
        .args(["worker", "--once", "--server", base, "--token-file"])
        .arg(&token_file)
        .args(args)
        .envs(envs.iter().copied())
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("starting pullman worker");
    let out = tokio::time::timeout(Duration::from_secs(secs), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("pullman worker still running after {secs} s"))
        .expect("waiting for pullman worker");
    WorkerRun {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Every stored line of order `id` on the server at `base`, markers included, read page by page
/// through the API.
pub async fn all_output(base: &str, id: &str) -> Vec<Value> {
    let http = reqwest::Client::new();
    let mut lines = Vec::new();
    let mut after = String::new();
    loop {
        let r = http
            .get(format!(
                "{base}/api/v1/work-orders/{id}/output?limit=10000{after}"
            ))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("reading the output");
        assert_eq!(r.status(), 200);
        let page: Value = r.json().await.expect("a page of output");
        lines.extend(page["lines"].as_array().expect("lines").iter().cloned());
        if page["more"] != true {
            return lines;
        }
        after = format!("&after={}", page["next_cursor"]);
    }
}

/// A running `pullman worker` whose log (stderr, `RUST_LOG=info`, no colours) goes to a file the
/// test reads while it runs. Killed when dropped.
pub struct WorkerProcess {
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl WorkerProcess {
    /// Starts `pullman worker --server <server> --token-file <a file holding token>` then `args`.
    pub fn start(server: &str, token: &str, args: &[&str]) -> Self {
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
        WorkerProcess {
            child,
            log,
            _dir: dir,
        }
    }

    /// Everything it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }

    /// The exit code, which must come within `secs` seconds.
    ///
    /// # Panics
    /// When it is still running then (with its log), or was killed by a signal.
    pub async fn exit_code(&mut self, secs: f64) -> i32 {
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

    /// Waits up to `secs` seconds for `needle` in its log.
    pub async fn log_contains(&self, secs: u64, needle: &str) {
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

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
