//! `pullman serve` as a child process on a fresh database of the test PostgreSQL: for what only
//! the binary does (its flags, its log lines) and for walk-throughs a shell runs against it.

use std::path::Path;
use std::process::{Child, Command, Stdio};

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
        let port = free_port();
        let child = Command::new(pullman_bin())
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--controller", "off"])
            .args(extra)
            .current_dir(dir)
            .env("DATABASE_URL", &db)
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
        let serve = Serve { child, port };
        let http = reqwest::Client::new();
        eventually(90, "pullman serve to be ready", || {
            let http = http.clone();
            let url = serve.url("/readyz");
            async move {
                let r = http.get(url).send().await.ok()?;
                r.status().is_success().then_some(())
            }
        })
        .await;
        serve
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
