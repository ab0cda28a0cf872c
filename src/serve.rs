//! `pullman serve` and `pullman migrate` (docs/design.md §7): wiring of the database (external or
//! embedded), the API, maintenance and notifications, with graceful shutdown on SIGINT/SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use std::future::IntoFuture;

use anyhow::Context;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio_util::sync::CancellationToken;

use crate::api::{self, AppState};
use crate::auth::{AdminToken, AdminTokenSource};
use crate::cli::{DatabaseArgs, ServeArgs};
use crate::postgres::{EmbeddedPostgres, Listen, Options};
use crate::queue::{self, Notifications, Queue};
use crate::telemetry::Metrics;

/// A database connection, and the embedded server behind it if this process started one.
pub struct Database {
    pub pool: PgPool,
    pub embedded: Option<EmbeddedPostgres>,
    /// Exclusive lock on the data dir while the embedded server runs (see [`lock_data_dir`]).
    data_dir_lock: Option<DataDirLock>,
}

/// Name of the lock file in the data dir.
pub const LOCK_FILE: &str = "pullman.lock";

/// An exclusive `flock` on `<data-dir>/pullman.lock`, held for as long as this process runs the
/// embedded PostgreSQL there. The kernel drops it when the process dies, so a crash never
/// leaves a stale lock behind.
pub struct DataDirLock(#[allow(dead_code)] nix::fcntl::Flock<std::fs::File>);

/// Takes the data dir for this process (issue #15): a second `serve` or `migrate` on a data dir
/// in use is refused, naming the process that holds it, instead of sharing (and later stopping)
/// the first one's embedded database. The holder's pid is written into the lock file for that
/// message.
pub fn lock_data_dir(data_dir: &std::path::Path) -> anyhow::Result<DataDirLock> {
    use nix::fcntl::{Flock, FlockArg};
    use std::io::{Read, Seek, Write};
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("creating data directory {}", data_dir.display()))?;
    let path = data_dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => lock,
        Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            anyhow::bail!(
                "the data directory {} is in use by another pullman process{}; stop it first, or \
                 give this one its own --data-dir (or a DATABASE_URL)",
                data_dir.display(),
                if holder.is_empty() {
                    String::new()
                } else {
                    format!(" (pid {holder})")
                }
            )
        }
        Err((_, e)) => {
            return Err(e).with_context(|| format!("locking {}", path.display()));
        }
    };
    lock.set_len(0)?;
    lock.rewind()?;
    writeln!(lock, "{}", std::process::id())?;
    Ok(DataDirLock(lock))
}

/// Connects to `DATABASE_URL`, or starts the embedded PostgreSQL under `<data-dir>/postgres`.
pub async fn open_database(args: &DatabaseArgs) -> anyhow::Result<Database> {
    let mut data_dir_lock = None;
    let (options, embedded): (PgConnectOptions, _) = match &args.database_url {
        Some(url) => (
            url.parse()
                .context("DATABASE_URL is not a valid PostgreSQL URL")?,
            None,
        ),
        None => {
            data_dir_lock = Some(lock_data_dir(&args.data_dir)?);
            let root = args.data_dir.join("postgres");
            let pg = EmbeddedPostgres::start(Options {
                root: root.clone(),
                listen: Listen::UnixSocket,
                database: "pullman".into(),
                bin_dir: args.postgres_bin_dir.clone(),
                // Issue #36: a `serve` killed by SIGKILL or a crash must not leave it running.
                die_with_parent: true,
            })
            .await
            .context("starting the embedded PostgreSQL (set DATABASE_URL to use another one)")?;
            tracing::info!(
                dir = %root.display(),
                pid = pg.pid(),
                "embedded PostgreSQL running (Unix socket only)"
            );
            (pg.options(), Some(pg))
        }
    };
    let pool = pool_options(args.db_max_connections, &options)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .context("connecting to PostgreSQL")?;
    Ok(Database {
        pool,
        embedded,
        data_dir_lock,
    })
}

/// A pooled connection idle at least this long is pinged before it is handed out
/// ([`pool_options`]); one used more recently is handed out as it is. A connection that died
/// within this window (a database restarted faster than it) fails the statement that finds it
/// (`503 database_unavailable`, as any statement a restart cuts off, until the server's probe
/// finds the database again: `queue::availability`) and is closed.
pub const PING_IDLE_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// The server's connection pool settings (the tests' and benchmarks' pools use them too), for
/// at most `max_connections` connections. Every connection plans prepared statements
/// generically and never compiles them with JIT (docs/design.md §11). Connections over TCP to
/// `database` (the options the pool will connect with) get keepalive and a user timeout
/// (`db_keepalive`), so a server that vanished under them is found dead within seconds.
///
/// A connection's buffers grow to the largest message it carried (a 1 MiB `yaml_content` each
/// way) and keep that size; shrinking them as the connection returns to the pool keeps a burst of
/// large orders from leaving every pooled connection megabytes larger (issue #16). When they are
/// small that is a capacity check.
pub fn pool_options(max_connections: u32, database: &PgConnectOptions) -> PgPoolOptions {
    let tcp_port = database.get_socket().is_none().then(|| database.get_port());
    PgPoolOptions::new()
        .max_connections(max_connections)
        // sqlx pings every connection it hands out, a round trip before each statement (0.4 ms
        // of a claim's 3.2 ms on a loaded 2-core machine, issue #34); it pings each one again as
        // it comes back (`after_release`'s caller), so a connection idle for less than
        // PING_IDLE_AFTER was found alive moments ago. One idle longer, as every connection of
        // a quiet server, or one left in the pool across a database restart, is pinged first
        // and, dead, replaced before a request sees it.
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= PING_IDLE_AFTER {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
        .after_connect(move |conn, _meta| {
            Box::pin(async move {
                if let Some(port) = tcp_port
                    && let Err(error) = crate::db_keepalive::arm_connections_to(port)
                {
                    // Not fatal: the connection works, it would only wait longer on a dead server.
                    tracing::warn!(%error, "could not set TCP keepalive on a database connection");
                }
                // A generic plan's costs are estimated without the parameters' values, so a
                // large or skewed backlog can push a claim past jit_above_cost: PostgreSQL then
                // compiled every claim (50–100 ms each, where the claim itself takes 1–3 ms).
                // One round trip for the settings and the primary check.
                // The simple protocol: nothing prepared for a statement run once per connection,
                // and a transaction-mode pooler gets as far as `queue::check_delivery`, which
                // names it.
                // (A query string without arguments goes as a simple Query message.)
                let row = sqlx::Executor::fetch_one(
                    &mut *conn,
                    "SELECT set_config('plan_cache_mode', 'force_generic_plan', false), \
                     set_config('jit', 'off', false), pg_is_in_recovery()",
                )
                .await?;
                let in_recovery: bool = sqlx::Row::try_get(&row, 2)?;
                if in_recovery {
                    return Err(crate::queue::standby_refused());
                }
                Ok(())
            })
        })
        .after_release(|conn, _meta| {
            Box::pin(async move {
                sqlx::Connection::shrink_buffers(conn);
                Ok(true)
            })
        })
}

impl Database {
    /// Closes the pool and stops the embedded server, if any.
    pub async fn close(self) -> anyhow::Result<()> {
        self.pool.close().await;
        if let Some(pg) = self.embedded {
            pg.stop().await?;
        }
        // Only now may another process take the data dir.
        drop(self.data_dir_lock);
        Ok(())
    }
}

/// `pullman migrate`.
pub async fn migrate(args: DatabaseArgs) -> anyhow::Result<()> {
    let db = open_database(&args).await?;
    queue::MIGRATOR
        .run(&db.pool)
        .await
        .context("applying migrations")?;
    tracing::info!("migrations applied");
    db.close().await
}

/// `pullman serve`. The port is taken first: a port in use is refused at once, before a
/// database is started or migrated.
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let listener = bind_listen(args.listen).await?;
    let db = open_database(&args.database).await?;
    let result = run_server(&args, &db.pool, listener).await;
    db.close().await?;
    result
}

/// Binds `--listen`. Errors: the address is in use or cannot be bound, with what to do.
async fn bind_listen(addr: std::net::SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => Ok(l),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(anyhow::anyhow!(
            "--listen {addr}: the address is in use (another pullman serve?); stop that process \
             or give another address with --listen"
        )),
        Err(e) => Err(e).with_context(|| format!("--listen {addr}: cannot listen there")),
    }
}

async fn run_server(
    args: &ServeArgs,
    pool: &PgPool,
    listener: tokio::net::TcpListener,
) -> anyhow::Result<()> {
    // Before the migrations: through a transaction-mode pooler they could fail first, with a
    // message that does not name the cause.
    queue::check_delivery(pool)
        .await
        .map_err(|e| anyhow::anyhow!("checking that notifications arrive: {e}"))?;
    queue::MIGRATOR
        .run(pool)
        .await
        .context("applying migrations")?;
    let generated_path = args.database.data_dir.join("admin-token");
    let generated_earlier = std::fs::read_to_string(&generated_path)
        .map(|t| !t.trim().is_empty())
        .unwrap_or(false);
    let (admin, source) = AdminToken::load(
        args.admin_token.as_deref(),
        args.admin_token_file.as_deref(),
        &args.database.data_dir,
    )?;
    match source {
        AdminTokenSource::Environment => tracing::info!("admin token: from PULLMAN_ADMIN_TOKEN"),
        AdminTokenSource::File(p) => tracing::info!(file = %p.display(), "admin token: from file"),
        // `load` reuses a token generated by an earlier start; say so rather than "generated".
        AdminTokenSource::Generated(p) if generated_earlier => {
            tracing::info!(file = %p.display(), "admin token: read from this file (generated by an earlier start)")
        }
        AdminTokenSource::Generated(p) => {
            tracing::info!(file = %p.display(), "admin token: generated; read it from this file")
        }
    }

    let shutdown = CancellationToken::new();
    let queue = Queue::new(pool.clone())
        .with_group_commit(args.complete_batch as usize)
        .with_group_claims(args.claim_batch as usize);
    let metrics = Arc::new(Metrics::new());
    let notifications = Notifications::new();
    let listener_task = queue::spawn_listener(&queue, notifications.clone(), shutdown.clone());
    let maintenance_task = {
        let metrics = metrics.clone();
        tokio::spawn(queue::run_maintenance(
            queue.clone(),
            Duration::from_secs(args.maintenance_interval_seconds),
            (args.log_retention_days > 0)
                .then(|| Duration::from_secs(u64::from(args.log_retention_days) * 86_400)),
            shutdown.clone(),
            move |r| {
                metrics.reaped_claims.inc_by(r.reclaimed);
                metrics.reclaims_exhausted.inc_by(r.reclaims_exhausted);
                metrics.retries_promoted.inc_by(r.promoted);
            },
        ))
    };

    let probe_task = queue::spawn_availability_probe(queue.clone(), shutdown.clone());
    let gauges_task = tokio::spawn(queue::gauges::run_gauge_refresh(
        queue.clone(),
        Duration::from_secs(args.gauge_refresh_seconds),
        crate::telemetry::tenants::TOP_TENANTS,
        shutdown.clone(),
    ));
    // Cancelled at the first signal, before the shutdown delay: the controller stops (its Lease
    // passes on at once) and `/readyz` answers 503.
    let stopping = shutdown.child_token();
    let controller_task = start_controller(args, &queue, &notifications, &stopping).await?;

    let state = AppState::new(
        queue,
        admin,
        metrics.clone(),
        notifications.clone(),
        args.max_long_polls,
    )
    .with_output(api::OutputSettings {
        cap_bytes: args.output_cap_bytes,
        max_writes: args.max_output_writes as usize,
        max_followers: args.max_output_followers as usize,
    })
    .with_stopping(stopping.clone())
    .with_request_timeout(Duration::from_secs(args.request_timeout_seconds));
    tracing::info!(listen = %listener.local_addr()?, "pullman API listening");
    // Before the first request can be answered: readiness must not precede the handler.
    let mut signals = crate::signals::Signals::install().context("installing signal handlers")?;
    let stop_http = CancellationToken::new();
    let mut server = tokio::spawn(
        axum::serve(listener, api::router(state))
            .with_graceful_shutdown(stop_http.clone().cancelled_owned())
            .into_future(),
    );
    let served = tokio::select! {
        _ = signals.recv() => None,
        ended = &mut server => Some(ended),
    };

    // docs/design.md §7: gone within a few seconds of SIGTERM (Kubernetes kills at 30 s), saying what
    // it does meanwhile. Held long-polls are answered first: they would otherwise hold the
    // graceful shutdown for up to their 30 s wait.
    let result = match served {
        Some(ended) => ended
            .context("the HTTP server task failed")
            .and_then(|served| served.context("serving HTTP")),
        None => {
            stopping.cancel();
            shutdown_delay(
                Duration::from_secs(args.shutdown_delay_seconds),
                &mut signals,
            )
            .await;
            tracing::info!(
                held_long_polls = metrics.long_polls.get(),
                "shutdown: refusing new connections; answering held long-polls now"
            );
            notifications.stop_waiting();
            stop_http.cancel();
            // Maintenance, the listener and the controller (which hands its Lease on) stop
            // meanwhile; the pool stays open until the requests in flight are done.
            shutdown.cancel();
            match tokio::time::timeout(DRAIN_TIMEOUT, &mut server).await {
                Ok(ended) => {
                    tracing::info!("shutdown: in-flight requests finished");
                    ended
                        .context("the HTTP server task failed")
                        .and_then(|served| served.context("serving HTTP"))
                }
                Err(_) => {
                    tracing::warn!(
                        timeout_s = DRAIN_TIMEOUT.as_secs(),
                        "shutdown: requests still in flight; closing their connections"
                    );
                    server.abort();
                    Ok(())
                }
            }
        }
    };
    shutdown.cancel();
    let _ = listener_task.await;
    let _ = maintenance_task.await;
    let _ = probe_task.await;
    let _ = gauges_task.await;
    tracing::info!("shutdown: maintenance and notification listener stopped");
    if let Some(task) = controller_task {
        let _ = task.await;
        tracing::info!("shutdown: controller stopped");
    }
    result
}

/// docs/design.md §7: after the first signal, keeps answering for `delay` (a second signal ends
/// it), so that Services and load balancers, told by the pod's deletion, stop routing here before
/// the listener closes: a connection routed here meanwhile would be refused, or time out once the
/// pod's address is gone (a rolling update did this without the delay).
async fn shutdown_delay(delay: Duration, signals: &mut crate::signals::Signals) {
    if delay.is_zero() {
        return;
    }
    tracing::info!(
        delay_s = delay.as_secs(),
        "shutdown: still answering for the shutdown delay while routing moves away; \
         /readyz answers 503, the controller hands its Lease on"
    );
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = signals.recv() => {
            tracing::info!("shutdown: a second signal ends the shutdown delay");
        }
    }
}

/// Longest `serve` waits for in-flight requests after SIGTERM before closing their connections.
/// Held long-polls end at once; what remains are ordinary requests of a few milliseconds.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Which of the controller's CRDs the API server does not serve, in words (`None`: both are, or
/// discovery failed otherwise than with a 404, which the controller's own retries then meet).
/// Discovery is open to every authenticated user, so this needs no right beyond the controller's.
async fn crds_not_served(client: &kube::Client) -> Option<String> {
    use crate::crd::{Executor, WorkOrderResource};
    use kube::Resource;
    let served: Vec<String> = match client
        .list_api_group_resources(&Executor::api_version(&()))
        .await
    {
        Ok(list) => list.resources.into_iter().map(|r| r.name).collect(),
        // A group nobody serves is a plain-text 404 ("404 page not found"), so its reason is
        // kube's "Failed to parse error data" and `is_not_found()` says no: ask the code.
        Err(kube::Error::Api(status)) if status.code == 404 => Vec::new(),
        Err(error) => {
            tracing::warn!(%error, "could not list the pullman.dev resources; starting the controller anyway");
            return None;
        }
    };
    let group = Executor::group(&());
    let missing: Vec<String> = [WorkOrderResource::plural(&()), Executor::plural(&())]
        .into_iter()
        .filter(|plural| !served.iter().any(|name| name == plural))
        .map(|plural| format!("{plural}.{group}"))
        .collect();
    match missing.as_slice() {
        [] => None,
        [one] => Some(format!("CRD {one} is")),
        several => Some(format!("CRDs {} are", several.join(" and "))),
    }
}

/// Starts the controller with leader election when a Kubernetes API is reachable (or required).
async fn start_controller(
    args: &ServeArgs,
    queue: &Queue,
    notifications: &Notifications,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    use crate::cli::ControllerMode;
    let c = &args.controller;
    if c.mode == ControllerMode::Off {
        tracing::info!("controller off (--controller off)");
        return Ok(None);
    }
    let client = match kube::Client::try_default().await {
        Ok(client) => match client.apiserver_version().await {
            Ok(v) => {
                tracing::info!(version = %v.git_version, "Kubernetes API reachable");
                client
            }
            Err(e) if c.mode == ControllerMode::Auto => {
                tracing::info!(error = %e, "Kubernetes API not reachable; controller off");
                return Ok(None);
            }
            Err(e) => {
                return Err(anyhow::anyhow!(
                    "--controller on: the Kubernetes API is not reachable: {e}"
                ));
            }
        },
        Err(e) if c.mode == ControllerMode::Auto => {
            tracing::debug!(reason = %e, "no Kubernetes configuration");
            tracing::info!(
                "no Kubernetes configuration (in-cluster or KUBECONFIG); controller off"
            );
            return Ok(None);
        }
        Err(e) => {
            return Err(anyhow::anyhow!(
                "--controller on: no Kubernetes configuration: {e}"
            ));
        }
    };
    // Without the CRDs the controller's watches only fail, at debug level, and nothing says why:
    // `on` (what the Helm chart passes) refuses to start and says what to do, so a chart installed
    // with --skip-crds on a cluster without them fails visibly; `auto` keeps its old way.
    if c.mode == ControllerMode::On
        && let Some(missing) = crds_not_served(&client).await
    {
        return Err(anyhow::anyhow!(
            "--controller on: the {missing} not served by the Kubernetes API; install the CRDs \
             (kubectl apply --server-side -f crds/pullman.dev.yaml, or the Helm chart without \
             --skip-crds) and start again"
        ));
    }
    let lease_namespace = c.leader_election_namespace.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "default".into())
    });
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "pullman".into());
    let config = crate::controller::ControllerConfig {
        namespace: c.watch_namespace.clone(),
        lease_namespace,
        lease_name: c.leader_election_id.clone(),
        identity: format!("{host}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
        executor_server_url: c.executor_server_url.clone(),
        resync: Duration::from_secs(c.resync_seconds.max(5)),
    };
    Ok(Some(tokio::spawn(
        crate::controller::run_with_leader_election(
            client,
            queue.clone(),
            notifications.clone(),
            config,
            shutdown.clone(),
        ),
    )))
}
