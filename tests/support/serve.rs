//! `pullman serve` as a child process on a fresh database of the test PostgreSQL: for what only
//! the binary does (its flags, its log lines) and for walk-throughs a shell runs against it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{eventually, free_port, fresh_database_url, pullman_bin};

/// A running `pullman serve` (controller off, listening on 127.0.0.1). Killed when dropped, so a
/// failing test leaves no server behind.
pub struct Serve {
    pub child: Child,
    pub port: u16,
}

impl Serve {
    /// Starts `pullman serve --listen 127.0.0.1:<free port> --controller off` then `extra`, in
    /// directory `dir` (its default data dir is `dir/.pullman`, where it writes the admin token
    /// it generates), on a fresh database, with `envs` added and stderr to `stderr`; returns once
    /// `/readyz` answers 200. The caller's admin token and data dir settings are removed from
    /// the environment, so the server generates its token as a new user's would.
    ///
    /// # Panics
    /// When the binary cannot be started or is not ready within 90 s.
    pub async fn start(
        dir: &Path,
        extra: &[&str],
        envs: &[(&str, &str)],
        stderr: impl Into<Stdio>,
    ) -> Serve {
        let db = fresh_database_url().await;
        Serve::start_with(dir, &db, extra, envs, stderr).await
    }

    /// As [`Serve::start`], on `database_url` (a database of the test PostgreSQL behind a
    /// pooler, say), with no extra flags or variables.
    pub async fn start_on(dir: &Path, database_url: &str, stderr: impl Into<Stdio>) -> Serve {
        Serve::start_with(dir, database_url, &[], &[], stderr).await
    }

    async fn start_with(
        dir: &Path,
        db: &str,
        extra: &[&str],
        envs: &[(&str, &str)],
        stderr: impl Into<Stdio>,
    ) -> Serve {
        let port = free_port();
        let child = Command::new(pullman_bin())
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--controller", "off"])
            .args(extra)
            .current_dir(dir)
            .env("DATABASE_URL", db)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("PULLMAN_ADMIN_TOKEN")
            .env_remove("PULLMAN_ADMIN_TOKEN_FILE")
            .env_remove("PULLMAN_DATA_DIR")
            .env_remove("PULLMAN_LOG_FORMAT")
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("starting pullman serve");
        // Made before the wait, so a serve that never gets ready is killed when it is dropped.
        let serve = Serve { child, port };
        wait_ready(port).await;
        serve
    }

    /// [`start_serve_over`] (`database_url`, `extra`, `log`, `rust_log`) on a free port, killed
    /// when dropped. Does not wait for it to be ready ([`wait_ready`]).
    pub fn over(database_url: &str, extra: &[&str], log: &Path, rust_log: &str) -> Serve {
        let port = free_port();
        let child = start_serve_over(database_url, port, extra, log, rust_log);
        Serve { child, port }
    }

    /// `http://127.0.0.1:<port>` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Sends SIGTERM and waits (at most 60 s) for the exit, as a service manager stops it.
    ///
    /// # Panics
    /// When serve is still running after 60 s.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("signalling pullman serve");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for pullman serve") {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "pullman serve did not stop within 60 s of SIGTERM"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// What the tests of `serve` as a process share (tests/integration/serve_cli.rs,
// tests/integration/serve_shutdown.rs): starting it on its embedded PostgreSQL or a fresh database, signals, and its processes.

pub fn start_serve(data_dir: &Path, port: u16) -> Child {
    start_serve_logging(data_dir, port, Stdio::inherit())
}

pub fn start_serve_logging(data_dir: &Path, port: u16, stderr: impl Into<Stdio>) -> Child {
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

/// Waits (at most 90 s) until the serve on 127.0.0.1:`port` answers `/readyz` with 200.
pub async fn wait_ready(port: u16) {
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

pub fn postgres_processes_for(dir: &Path) -> Vec<String> {
    let needle = dir.to_string_lossy().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains("postgres") && c.contains(&needle))
        .collect()
}

pub fn sigterm(child: &Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
}

/// Waits (at most 60 s) for `child` to exit.
pub fn wait_for_exit(child: &mut Child) -> std::process::ExitStatus {
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

pub fn sigterm_and_wait(mut child: Child) -> std::process::ExitStatus {
    stop(&mut child)
}

/// Starts `serve` (controller off, log level info) on a fresh database with `extra` arguments,
/// logging to `log`; returns once `/readyz` answers 200.
pub async fn serve_on_fresh_database(extra: &[&str], log: &Path) -> (Child, u16) {
    let db = super::fresh_database_url().await;
    let port = free_port();
    let child = start_serve_over(&db, port, extra, log, "info");
    wait_ready(port).await;
    (child, port)
}

/// Starts `pullman serve` (controller off, `RUST_LOG=rust_log`, the test admin token) on
/// 127.0.0.1:`port` over `database_url`, a database that outlives it, with `extra` arguments. Its
/// log is appended to `log`, so a restart on the same port and database keeps one log. Does not
/// wait for it to be ready ([`wait_ready`]).
pub fn start_serve_over(
    database_url: &str,
    port: u16,
    extra: &[&str],
    log: &Path,
    rust_log: &str,
) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Command::new(pullman_bin())
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--controller", "off"])
        .args(extra)
        .env("DATABASE_URL", database_url)
        .env("PULLMAN_ADMIN_TOKEN", super::ADMIN_TOKEN)
        .env("RUST_LOG", rust_log)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// `pullman serve` ([`start_serve_over`]) over a fresh database that outlives it, on a port that
/// stays the same: a test stops it and starts it again to take the server away from its clients
/// and give it back. Killed when dropped.
pub struct Restartable {
    pub port: u16,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    pub api: super::ApiClient,
    /// Its log, appended to by every start.
    pub log: PathBuf,
    database_url: String,
    extra: Vec<String>,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl Restartable {
    /// Starts it with `extra` arguments and waits for `/readyz`.
    pub async fn start(extra: &[&str]) -> Self {
        let port = free_port();
        let base = format!("http://127.0.0.1:{port}");
        let dir = tempfile::tempdir().unwrap();
        let mut serve = Restartable {
            port,
            api: super::ApiClient::new(&base),
            base,
            log: dir.path().join("serve.log"),
            database_url: super::fresh_database_url().await,
            extra: extra.iter().map(|a| a.to_string()).collect(),
            child: None,
            _dir: dir,
        };
        serve.start_again().await;
        serve
    }

    /// Starts it again on the same port and database; waits for `/readyz`.
    pub async fn start_again(&mut self) {
        assert!(self.child.is_none(), "serve is already running");
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        // Warnings only: these tests read their clients' logs, not the server's.
        self.child = Some(start_serve_over(
            &self.database_url,
            self.port,
            &extra,
            &self.log,
            "warn",
        ));
        wait_ready(self.port).await;
    }

    /// SIGTERM, and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop(&mut child);
        }
    }

    /// SIGKILL, and waits for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }
}

impl Drop for Restartable {
    fn drop(&mut self) {
        self.kill();
    }
}

/// SIGTERM to `child`, then waits (at most 60 s) for its exit.
pub fn stop(child: &mut Child) -> std::process::ExitStatus {
    sigterm(child);
    wait_for_exit(child)
}

/// The pid in `<pg_data>/postmaster.pid`, if the file is there.
pub fn postmaster_pid(pg_data: &Path) -> Option<i32> {
    std::fs::read_to_string(pg_data.join("postmaster.pid"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

/// Whether `pid` is a live process; a zombie (exited, not yet reaped by its parent) is not.
pub fn is_running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

/// Waits (at most `secs`) for `pid` to be gone; says whether it went.
pub fn gone_within(pid: i32, secs: u64) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while is_running(pid) {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}
