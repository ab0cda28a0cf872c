//! The embedded PostgreSQL (docs/design.md §7): with no `DATABASE_URL`, `pullman serve` initializes and
//! runs a private PostgreSQL from the server binaries installed on the machine, under the data
//! directory, reachable only through a Unix socket in a private directory. The test suite uses the
//! same code on a loopback port.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::sync::watch;

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
    /// Stop the server (SIGQUIT: immediate shutdown; the next start recovers from the WAL) when
    /// this process dies without stopping it, by `kill -9` or a crash included (issue #36: a
    /// killed `serve` left its PostgreSQL running), or drops it without [`EmbeddedPostgres::stop`].
    /// The kernel sends the signal (`PR_SET_PDEATHSIG`) when the *thread* that started the server
    /// ends, so the server is started from a thread of its own that waits for it to exit.
    pub die_with_parent: bool,
}

/// A running embedded PostgreSQL.
pub struct EmbeddedPostgres {
    pid: u32,
    /// The postmaster's exit, once its parent thread has reaped it: only then is it gone.
    exit: watch::Receiver<Option<Result<ExitStatus, String>>>,
    die_with_parent: bool,
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

/// Whether `pid` is a live process. A zombie (exited, not yet reaped by its parent) is not, though
/// `kill(pid, 0)` says it is.
fn is_running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses, which may hold anything.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) if Path::new("/proc/self/stat").exists() => false,
        Err(_) => matches!(
            kill(Pid::from_raw(pid as i32), None),
            Ok(()) | Err(nix::errno::Errno::EPERM)
        ),
    }
}

/// The postmaster running on `data`, if any: the pid in its `postmaster.pid`, when that process
/// lives and works in `data` (a postmaster's working directory is its data directory), so that a
/// stale file naming a pid since reused by another process is never taken for one.
fn running_postmaster(data: &Path) -> Option<u32> {
    let pid = pid_file_pid(data)?;
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?;
    (is_running(pid) && std::fs::canonicalize(data).ok()? == cwd).then_some(pid)
}

/// The pid in `<data>/postmaster.pid`, which a postmaster writes before it accepts connections.
fn pid_file_pid(data: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(data.join("postmaster.pid")).ok()?;
    text.lines()
        .next()?
        .trim()
        .parse()
        .ok()
        .filter(|&pid| pid > 0)
}

/// Stops a postmaster this process did not start (fast shutdown, as `pg_ctl stop -m fast`;
/// SIGQUIT after 30 s) and waits until it is gone.
async fn stop_left_over(pid: u32, data: &Path) -> anyhow::Result<()> {
    let target = Pid::from_raw(pid as i32);
    kill(target, Signal::SIGINT).with_context(|| {
        format!(
            "stopping the PostgreSQL (pid {pid}) running on {}; stop it yourself \
             (pg_ctl stop -D {} -m fast)",
            data.display(),
            data.display()
        )
    })?;
    let started = Instant::now();
    let mut quit_sent = false;
    while is_running(pid) {
        if !quit_sent && started.elapsed() > Duration::from_secs(30) {
            tracing::warn!(
                pid,
                "the left-over PostgreSQL did not stop within 30 s; sending SIGQUIT"
            );
            let _ = kill(target, Signal::SIGQUIT);
            quit_sent = true;
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!(
                "the PostgreSQL (pid {pid}) left running on {} did not stop within 60 s; stop it \
                 yourself (pg_ctl stop -D {} -m immediate)",
                data.display(),
                data.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tracing::info!(pid, "the left-over PostgreSQL stopped");
    Ok(())
}

/// Starts the postmaster from a thread that lives until it has exited and reaped it, so that
/// `PR_SET_PDEATHSIG` (which fires when the starting thread ends) fires only when the process
/// dies. Returns its pid and a receiver of its exit.
async fn spawn_postmaster(
    mut cmd: Command,
    die_with_parent: bool,
) -> anyhow::Result<(u32, watch::Receiver<Option<Result<ExitStatus, String>>>)> {
    if die_with_parent {
        use std::os::unix::process::CommandExt;
        let parent = nix::unistd::getpid();
        // SAFETY: prctl and getppid are async-signal-safe and nothing here allocates; nothing
        // else runs between fork and exec. Closures run after the uid change, which would clear
        // the setting.
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(Signal::SIGQUIT).map_err(std::io::Error::from)?;
                // The parent died before the setting took: nobody is left to stop the server.
                if nix::unistd::getppid() != parent {
                    return Err(nix::errno::Errno::ESRCH.into());
                }
                Ok(())
            });
        }
    }
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("postmaster".into())
        .spawn(move || match cmd.spawn() {
            Err(e) => {
                let _ = started_tx.send(Err(e));
            }
            Ok(mut child) => {
                let (exit_tx, exit_rx) = watch::channel(None);
                let _ = started_tx.send(Ok((child.id(), exit_rx)));
                let status = child.wait().map_err(|e| e.to_string());
                exit_tx.send_replace(Some(status));
            }
        })
        .context("starting a thread for the embedded PostgreSQL")?;
    Ok(started_rx
        .await
        .context("the embedded PostgreSQL's thread ended")??)
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
        // A postmaster still running here would answer on our socket while ours fails on its lock
        // file (issue #36). Adopting it would keep settings and a socket not ours: stop it.
        if let Some(pid) = running_postmaster(&data) {
            tracing::warn!(
                pid,
                data = %data.display(),
                "a PostgreSQL is left running on this data directory (by a pullman that was \
                 killed, or started by hand); stopping it (fast shutdown) before starting the \
                 embedded one"
            );
            stop_left_over(pid, &data).await?;
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
        cmd.stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file);
        let (pid, exit) = spawn_postmaster(cmd, opts.die_with_parent)
            .await
            .with_context(|| format!("starting {}", bin.join("postgres").display()))?;
        let mut pg = EmbeddedPostgres {
            pid,
            exit,
            die_with_parent: opts.die_with_parent,
            root,
            listen: opts.listen,
            database: opts.database,
        };
        pg.wait_ready(&data, &log).await?;
        Ok(pg)
    }

    /// How the postmaster exited, once it has.
    fn exited(&self) -> Option<Result<ExitStatus, String>> {
        self.exit.borrow().clone()
    }

    /// Whether the postmaster has exited within `limit`.
    async fn exits_within(&self, limit: Duration) -> bool {
        let mut exit = self.exit.clone();
        matches!(
            tokio::time::timeout(limit, exit.wait_for(Option::is_some)).await,
            Ok(Ok(_))
        )
    }

    async fn wait_ready(&mut self, data: &Path, log: &Path) -> anyhow::Result<()> {
        use sqlx::ConnectOptions;
        let deadline = Instant::now() + Duration::from_secs(60);
        let admin = self.connect_options("postgres");
        loop {
            if let Some(status) = self.exited() {
                bail!(
                    "the embedded PostgreSQL exited during start-up ({}); log {}:\n{}",
                    status.map_or_else(|e| e, |s| s.to_string()),
                    log.display(),
                    log_tail(log)
                );
            }
            // Whoever answers must be ours: another postmaster on the data dir (started since we
            // looked) would answer while ours fails on its lock file, and then exits.
            let ours = || pid_file_pid(data) == Some(self.pid);
            match admin.connect().await {
                Ok(_) if !ours() && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(_) if !ours() => bail!(
                    "another PostgreSQL answers on the embedded one's socket, not the one started \
                     (pid {}); log {}:\n{}",
                    self.pid,
                    log.display(),
                    log_tail(log)
                ),
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
        self.pid
    }

    /// Fast shutdown (SIGINT: roll back open transactions, checkpoint, exit), escalating to
    /// SIGQUIT after 30 s. Returns once the postmaster has exited (and says so), or an error
    /// when it has not within another 30 s: a stop is never reported that did not happen.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let pid = Pid::from_raw(self.pid as i32);
        if self.exited().is_none() {
            let _ = kill(pid, Signal::SIGINT);
        }
        let mut how = "fast shutdown";
        if !self.exits_within(Duration::from_secs(30)).await {
            tracing::warn!(
                pid = self.pid,
                "embedded PostgreSQL did not stop within 30 s; sending SIGQUIT"
            );
            let _ = kill(pid, Signal::SIGQUIT);
            how = "SIGQUIT";
        }
        if !self.exits_within(Duration::from_secs(30)).await {
            bail!(
                "the embedded PostgreSQL (pid {}) did not stop, even after SIGQUIT",
                self.pid
            );
        }
        // Gone: dropping it must not signal the pid, which may belong to another process now.
        self.die_with_parent = false;
        match self.exited() {
            Some(Ok(status)) => {
                tracing::info!(pid = self.pid, %status, how, "embedded PostgreSQL stopped");
            }
            _ => tracing::info!(pid = self.pid, how, "embedded PostgreSQL stopped"),
        }
        Ok(())
    }
}

impl Drop for EmbeddedPostgres {
    /// A server dropped without [`EmbeddedPostgres::stop`] has nobody left to stop it: with
    /// `die_with_parent` it stops now, as it would when the process died.
    fn drop(&mut self) {
        if self.die_with_parent && self.exited().is_none() {
            let _ = kill(Pid::from_raw(self.pid as i32), Signal::SIGQUIT);
        }
    }
}
