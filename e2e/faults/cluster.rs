//! The processes under test and the faults done to them: one PostgreSQL and `pullman serve`
//! replicas, each a child of the suite. Every child is started from the suite's main thread with a
//! parent-death signal, so none outlives the suite even when it is killed; `Drop` kills the
//! replicas on an ordinary exit.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pullman::postgres::{EmbeddedPostgres, Listen, Options};

use crate::report::progress;

/// The admin bearer token every replica is started with.
pub const ADMIN_TOKEN: &str = "faults-admin-token-0123456789abcdef";

/// How PostgreSQL is stopped: the three shutdown modes of `pg_ctl stop -m`, plus a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PgStop {
    /// SIGINT: sessions are terminated, open transactions rolled back, a checkpoint written.
    Fast,
    /// SIGQUIT: every process exits at once; the next start runs crash recovery.
    Immediate,
    /// SIGKILL of the postmaster alone: its backends notice and exit on their own.
    Kill,
}

impl PgStop {
    fn signal(self) -> Signal {
        match self {
            PgStop::Fast => Signal::SIGINT,
            PgStop::Immediate => Signal::SIGQUIT,
            PgStop::Kill => Signal::SIGKILL,
        }
    }
}

/// A free TCP port on the loopback interface (free when asked; nobody else binds here).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding an ephemeral loopback port")
}

/// The PostgreSQL the replicas share, on a fixed loopback port so it can be stopped and started
/// again on the same data directory without the replicas' configuration changing.
pub struct Postgres {
    opts: Options,
    running: Option<EmbeddedPostgres>,
    url: String,
}

impl Postgres {
    /// Initializes a data directory under `root` and starts the server with database `pullman`.
    pub async fn start(root: PathBuf) -> anyhow::Result<Self> {
        let opts = Options {
            root,
            listen: Listen::Loopback(free_port()),
            database: "pullman".into(),
            bin_dir: None,
            die_with_parent: true,
        };
        let pg = EmbeddedPostgres::start(opts.clone())
            .await
            .context("starting PostgreSQL for the fault suite")?;
        let url = pg.url();
        Ok(Postgres {
            opts,
            running: Some(pg),
            url,
        })
    }

    /// `postgres://` URL of the `pullman` database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Stops the postmaster the way `how` says and waits until it has exited.
    pub async fn stop(&mut self, how: PgStop) -> anyhow::Result<()> {
        let Some(pg) = self.running.take() else {
            return Ok(());
        };
        let _ = kill(Pid::from_raw(pg.pid() as i32), how.signal());
        // `stop` adds a SIGINT (ignored by a postmaster already shutting down or dead) and reaps it.
        pg.stop().await
    }

    /// Starts the server again on the same data directory and port. After a SIGKILL of the
    /// postmaster its orphaned backends may still hold the shared memory for a moment, and
    /// PostgreSQL refuses to start until they are gone, so this retries for up to a minute.
    pub async fn start_again(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match EmbeddedPostgres::start(self.opts.clone()).await {
                Ok(pg) => {
                    self.running = Some(pg);
                    return Ok(());
                }
                Err(e) if Instant::now() < deadline => {
                    let why = format!("{e:#}");
                    progress(&format!(
                        "PostgreSQL did not start yet, retrying: {}",
                        why.lines().next().unwrap_or_default()
                    ));
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e.context("starting PostgreSQL again")),
            }
        }
    }

    /// `pg_terminate_backend` of every other session on the database: the replicas' pooled
    /// connections die mid-use while PostgreSQL itself stays up. Returns how many were ended.
    pub async fn terminate_sessions(&self) -> anyhow::Result<usize> {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&self.url).await?;
        let ended: Vec<(bool,)> = sqlx::query_as(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_all(&mut conn)
        .await?;
        conn.close().await?;
        Ok(ended.iter().filter(|(ok,)| *ok).count())
    }

    /// Fast shutdown at the end of the run.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.stop(PgStop::Fast).await
    }
}

/// One `pullman serve` replica on a fixed loopback port (kept across restarts, so agents keep
/// their address), with the reaper every second and no controller.
pub struct Server {
    pub index: usize,
    pub addr: SocketAddr,
    db_url: String,
    log: PathBuf,
    child: Option<Child>,
}

impl Server {
    /// Starts replica `index` and waits until `/readyz` answers `200`.
    pub async fn start(index: usize, db_url: &str, log_dir: &Path) -> anyhow::Result<Self> {
        let mut server = Server {
            index,
            addr: SocketAddr::from(([127, 0, 0, 1], free_port())),
            db_url: db_url.to_string(),
            log: log_dir.join(format!("serve-{index}.log")),
            child: None,
        };
        server.restart().await?;
        Ok(server)
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The server log (all starts of this replica, appended).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        use std::os::unix::process::CommandExt;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pullman"));
        cmd.arg("serve")
            .args(["--database-url", &self.db_url])
            .args(["--listen", &self.addr.to_string()])
            .args(["--admin-token", ADMIN_TOKEN])
            .args(["--controller", "off"])
            .args(["--maintenance-interval-seconds", "1"])
            .env_remove("KUBECONFIG")
            .env_remove("DATABASE_URL")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
            });
        }
        self.child = Some(cmd.spawn().context("starting pullman serve")?);
        Ok(())
    }

    /// Starts the process (again) and waits up to 60 s for `/readyz`.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill9();
        self.spawn()?;
        let http = reqwest::Client::new();
        let url = format!("{}/readyz", self.base_url());
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.child = None;
                bail!(
                    "replica {} exited during start-up ({status}); see {}",
                    self.index,
                    self.log.display()
                );
            }
            let ready = http
                .get(&url)
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "replica {} not ready within 60 s; see {}",
                    self.index,
                    self.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `kill -9` and reap; nothing of the process is left to answer.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}
