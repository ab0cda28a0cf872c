//! The embedded PostgreSQL (docs/design.md §7): with no `DATABASE_URL`, `pullman serve` initializes and
//! runs a private PostgreSQL from the server binaries installed on the machine, under the data
//! directory, reachable only through a Unix socket in a private directory. The test suite uses the
//! same code on a loopback port.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// How the embedded server listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    /// Unix socket only (`<root>/run/.s.PGSQL.5432`); no TCP.
    UnixSocket,
    /// `127.0.0.1:<port>` (and the Unix socket).
    Loopback(u16),
}

/// Options for [`EmbeddedPostgres::start`].
#[derive(Debug, Clone)]
pub struct Options {
    /// Directory holding `data/`, `run/` and `postgres.log`; created if missing, reused if present.
    pub root: PathBuf,
    pub listen: Listen,
    /// Database to create (if missing) and connect to.
    pub database: String,
    /// Directory holding `initdb` and `postgres`; `None` searches `PATH`, then
    /// `/usr/lib/postgresql/*/bin`.
    pub bin_dir: Option<PathBuf>,
    /// Ask the kernel to stop the server (SIGQUIT) when the starting thread dies. For tests, whose
    /// process may exit without running destructors.
    pub die_with_parent: bool,
}

/// A running embedded PostgreSQL.
pub struct EmbeddedPostgres {
    child: Child,
    root: PathBuf,
    listen: Listen,
    database: String,
}

/// The unprivileged account to run PostgreSQL as when started by root (PostgreSQL refuses root).
fn run_as() -> anyhow::Result<Option<(u32, u32)>> {
    if !nix::unistd::Uid::effective().is_root() {
        return Ok(None);
    }
    match nix::unistd::User::from_name("postgres") {
        Ok(Some(user)) => Ok(Some((user.uid.as_raw(), user.gid.as_raw()))),
        _ => bail!(
            "PostgreSQL refuses to run as root and there is no 'postgres' user to run it as; \
             run pullman as an unprivileged user, create a 'postgres' user, or set DATABASE_URL"
        ),
    }
}

/// Finds a directory holding `initdb` and `postgres`: `explicit` if given, else the first on
/// `PATH`, else the newest `/usr/lib/postgresql/<version>/bin`.
pub fn find_binaries(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    let has_both = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    if let Some(dir) = explicit {
        anyhow::ensure!(
            has_both(dir),
            "no PostgreSQL server binaries found (initdb and postgres) in {}: install PostgreSQL \
             (e.g. apt install postgresql) or set DATABASE_URL to an existing database",
            dir.display()
        );
        return Ok(dir.to_path_buf());
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if has_both(&dir) {
                return Ok(dir);
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            has_both(&bin).then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).ok_or_else(|| {
        anyhow::anyhow!(
            "no PostgreSQL server binaries found (initdb and postgres, on PATH or in \
             /usr/lib/postgresql/*/bin): install PostgreSQL (e.g. apt install postgresql) or set \
             DATABASE_URL to an existing database"
        )
    })
}

fn chown_tree(path: &Path, uid: u32, gid: u32) -> anyhow::Result<()> {
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
        .with_context(|| format!("chown {}", path.display()))?;
    if path.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path(), uid, gid)?;
        }
    }
    Ok(())
}

fn command(bin: &Path, user: Option<(u32, u32)>) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(bin);
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
    }
    cmd.env("LC_ALL", "C").env_remove("PGDATA");
    cmd
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

impl EmbeddedPostgres {
    /// Initializes (first time) and starts the server, waits until it accepts connections, and
    /// creates the database. Errors carry the server log's tail.
    pub async fn start(opts: Options) -> anyhow::Result<Self> {
        let bin = find_binaries(opts.bin_dir.as_deref())?;
        let user = run_as()?;
        let root = std::path::absolute(&opts.root)?;
        let data = root.join("data");
        let run = root.join("run");
        let log = root.join("postgres.log");
        std::fs::create_dir_all(&run).with_context(|| format!("creating {}", run.display()))?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))?;
        }
        if let Some((uid, gid)) = user {
            chown_tree(&root, uid, gid)?;
        }
        if !data.join("PG_VERSION").exists() {
            tracing::info!(data = %data.display(), "initializing the embedded PostgreSQL");
            let out = command(&bin.join("initdb"), user)
                .arg("-D")
                .arg(&data)
                .args([
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--no-instructions",
                ])
                .output()
                .context("running initdb")?;
            if !out.status.success() {
                bail!(
                    "initdb failed for {}: {}{}",
                    data.display(),
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&log, Some(uid), Some(gid))?;
        }
        let mut cmd = command(&bin.join("postgres"), user);
        cmd.arg("-D")
            .arg(&data)
            .arg("-k")
            .arg(&run)
            .args(["-c", "unix_socket_permissions=0700"])
            .args(["-c", "fsync=on"]);
        match opts.listen {
            Listen::UnixSocket => cmd.args(["-c", "listen_addresses=", "-p", "5432"]),
            Listen::Loopback(port) => cmd
                .args(["-c", "listen_addresses=127.0.0.1", "-p"])
                .arg(port.to_string()),
        };
        if opts.die_with_parent {
            use std::os::unix::process::CommandExt;
            // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                cmd.pre_exec(|| {
                    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGQUIT)
                        .map_err(std::io::Error::from)
                });
            }
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("starting {}", bin.join("postgres").display()))?;
        let mut pg = EmbeddedPostgres {
            child,
            root,
            listen: opts.listen,
            database: opts.database,
        };
        pg.wait_ready(&log).await?;
        Ok(pg)
    }

    async fn wait_ready(&mut self, log: &Path) -> anyhow::Result<()> {
        use sqlx::ConnectOptions;
        let deadline = Instant::now() + Duration::from_secs(60);
        let admin = self.connect_options("postgres");
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "the embedded PostgreSQL exited during start-up ({status}); log {}:\n{}",
                    log.display(),
                    log_tail(log)
                );
            }
            match admin.connect().await {
                Ok(mut conn) => {
                    let exists: Option<(i32,)> =
                        sqlx::query_as("SELECT 1 FROM pg_database WHERE datname = $1")
                            .bind(&self.database)
                            .fetch_optional(&mut conn)
                            .await?;
                    if exists.is_none() {
                        sqlx::query(&format!("CREATE DATABASE \"{}\"", self.database))
                            .execute(&mut conn)
                            .await?;
                    }
                    return Ok(());
                }
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => bail!(
                    "the embedded PostgreSQL did not accept connections within 60 s ({e}); log {}:\n{}",
                    log.display(),
                    log_tail(log)
                ),
            }
        }
    }

    fn connect_options(&self, database: &str) -> sqlx::postgres::PgConnectOptions {
        let opts = sqlx::postgres::PgConnectOptions::new()
            .username("postgres")
            .database(database);
        match self.listen {
            Listen::UnixSocket => opts.socket(self.root.join("run")).port(5432),
            Listen::Loopback(port) => opts.host("127.0.0.1").port(port),
        }
    }

    /// Connection options for the database this server was started for.
    pub fn options(&self) -> sqlx::postgres::PgConnectOptions {
        self.connect_options(&self.database)
    }

    /// A `postgres://` URL for the database (loopback servers only; socket servers give a
    /// `host=` query parameter).
    pub fn url(&self) -> String {
        match self.listen {
            Listen::Loopback(port) => {
                format!("postgres://postgres@127.0.0.1:{port}/{}", self.database)
            }
            Listen::UnixSocket => format!(
                "postgres://postgres@localhost/{}?host={}",
                self.database,
                self.root.join("run").display()
            ),
        }
    }

    /// The postmaster's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fast shutdown (SIGINT: roll back open transactions, checkpoint, exit), escalating to
    /// SIGQUIT after 30 s. Waits for the postmaster to exit.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        let pid = Pid::from_raw(self.child.id() as i32);
        let _ = kill(pid, Signal::SIGINT);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.child.try_wait()?.is_some() {
                tracing::info!("embedded PostgreSQL stopped");
                return Ok(());
            }
            if Instant::now() > deadline {
                tracing::warn!("embedded PostgreSQL did not stop within 30 s; sending SIGQUIT");
                let _ = kill(pid, Signal::SIGQUIT);
                self.child.wait()?;
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
