//! Command-line interface: one binary, `pullman`, with a subcommand per process (docs/design.md §7).
//! Every flag has an environment twin.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::telemetry::LogFormat;

/// `pullman --version`: the crate version and the git commit it was built from (`unknown`
/// outside a git checkout; see build.rs).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("PULLMAN_GIT_COMMIT"),
    ")"
);

/// Pullman: a pull-based work-order queue and Kubernetes operator.
///
/// Work orders are queued in PostgreSQL and pulled by agents over HTTP. Start the server with
/// `pullman serve`; with no DATABASE_URL it runs its own PostgreSQL under --data-dir.
#[derive(Debug, Parser)]
#[command(name = "pullman", version = VERSION, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The log format the command asked for: `--log-format` where the command has it (the
    /// processes that log), text for the rest, whose own messages go to stdout and stderr
    /// directly and whose `RUST_LOG` debugging is read by people.
    pub fn log_format(&self) -> LogFormat {
        match &self.command {
            Command::Serve { log, .. }
            | Command::Migrate { log, .. }
            | Command::Executor { log, .. }
            | Command::Worker { log, .. } => log.log_format,
            _ => LogFormat::Text,
        }
    }
}

/// `--log-format`, flattened into the commands that log through `tracing` (serve, migrate,
/// executor, worker) and only those: on the admin commands it changed nothing (issue #36).
#[derive(Debug, Clone, Copy, Args)]
pub struct LogArgs {
    /// Log format: text for people, json (one object per line) for log collectors. The level
    /// is read from RUST_LOG.
    #[arg(long, env = "PULLMAN_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the REST API, the reaper and (when a cluster is reachable) the controller.
    Serve {
        #[command(flatten)]
        args: ServeArgs,
        #[command(flatten)]
        log: LogArgs,
    },
    /// Apply the database migrations and exit.
    Migrate {
        #[command(flatten)]
        args: DatabaseArgs,
        #[command(flatten)]
        log: LogArgs,
    },
    /// Print the CustomResourceDefinitions (YAML) of WorkOrder and Executor.
    Crdgen,
    /// Run work orders in this Kubernetes cluster (the in-cluster executor).
    Executor {
        #[command(flatten)]
        args: crate::executor::ExecutorArgs,
        #[command(flatten)]
        log: LogArgs,
    },
    /// Run work orders with a shell command (the reference external worker).
    Worker {
        #[command(flatten)]
        args: crate::worker::WorkerArgs,
        #[command(flatten)]
        log: LogArgs,
    },
    /// Manage agents (admin).
    Agents {
        #[command(flatten)]
        conn: crate::admin::Connection,
        #[command(subcommand)]
        command: crate::admin::AgentsCommand,
    },
    /// Manage work orders (admin).
    #[command(name = "work-orders")]
    WorkOrders {
        #[command(flatten)]
        conn: crate::admin::Connection,
        #[command(subcommand)]
        command: crate::admin::WorkOrdersCommand,
    },
    /// Read the log of finished work orders (admin).
    Log {
        #[command(flatten)]
        conn: crate::admin::Connection,
        #[command(subcommand)]
        command: crate::admin::LogCommand,
    },
    /// Print a shell completion script.
    ///
    /// bash: `source <(pullman completion bash)`; zsh: `pullman completion zsh >
    /// "${fpath[1]}/_pullman"`; fish: `pullman completion fish >
    /// ~/.config/fish/completions/pullman.fish`.
    Completion {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// Where the database is.
#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// PostgreSQL URL, e.g. postgres://user:pass@host/db. Without it, `serve` starts an embedded
    /// PostgreSQL under --data-dir.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// Directory for the embedded PostgreSQL and the generated admin token.
    #[arg(long, env = "PULLMAN_DATA_DIR", default_value = "./.pullman")]
    pub data_dir: PathBuf,

    /// Directory with the PostgreSQL server binaries (initdb, postgres) for the embedded database.
    /// Default: PATH, then the newest /usr/lib/postgresql/*/bin.
    #[arg(long, env = "PULLMAN_POSTGRES_BIN_DIR")]
    pub postgres_bin_dir: Option<PathBuf>,

    /// Most database connections this process opens (a pool; connections open as needed). At
    /// least 2: one is held for LISTEN.
    #[arg(long, env = "PULLMAN_DB_MAX_CONNECTIONS", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(2..))]
    pub db_max_connections: u32,
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// Address and port the HTTP API listens on (IP:PORT).
    #[arg(long, env = "PULLMAN_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,

    /// The admin bearer token. Prefer the environment variable or --admin-token-file: command
    /// lines are visible to other users. Without either, a token is generated into
    /// <data-dir>/admin-token (mode 0600) and its path is logged.
    #[arg(long, env = "PULLMAN_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// File holding the admin bearer token (surrounding whitespace ignored). Default:
    /// <data-dir>/admin-token, generated on first start.
    #[arg(long, env = "PULLMAN_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,

    /// Seconds between reaper / retry-promotion passes.
    #[arg(long, env = "PULLMAN_MAINTENANCE_INTERVAL_SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub maintenance_interval_seconds: u64,

    /// Seconds between computations of the database gauges of /metrics (orders by status,
    /// waiting orders by reason, orders per tenant). One replica per period computes them and
    /// every replica's scrape reads the result, so a scrape costs the same at a million pending
    /// orders as at none; pullman_database_gauges_age_seconds says how old they are.
    #[arg(long, env = "PULLMAN_GAUGE_REFRESH_SECONDS", default_value_t = 15,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub gauge_refresh_seconds: u64,

    /// Days a finished work order stays in the log (GET /api/v1/work-order-log) before the
    /// maintenance loop deletes it, in batches; 0 keeps the log forever. WorkOrder resources
    /// keep their own status regardless.
    #[arg(long, env = "PULLMAN_LOG_RETENTION_DAYS", default_value_t = 30,
          value_parser = clap::value_parser!(u32).range(0..=36_500))]
    pub log_retention_days: u32,

    /// Most claim-next long-polls held at once (each holds a connection for up to 30 s); past it
    /// claims answer 503 with Retry-After.
    #[arg(long, env = "PULLMAN_MAX_LONG_POLLS", default_value_t = 1024)]
    pub max_long_polls: usize,

    /// Bytes of output kept per work order (each line's text and stream, plus 16 bytes per line;
    /// docs/design.md §9); past it the oldest
    /// output is dropped and readers see a marker saying how many bytes. At least 1 MiB (one
    /// chunk).
    #[arg(long, env = "PULLMAN_OUTPUT_CAP_BYTES", default_value_t = crate::queue::limits::OUTPUT_CAP_BYTES_DEFAULT,
          value_parser = clap::value_parser!(u64).range(crate::queue::limits::OUTPUT_CAP_BYTES_MIN..))]
    pub output_cap_bytes: u64,

    /// Output chunks stored at once; past it agents are answered 429 with Retry-After, so
    /// output never takes the database connections that claims need.
    #[arg(long, env = "PULLMAN_MAX_OUTPUT_WRITES", default_value_t = crate::queue::limits::MAX_OUTPUT_WRITES_DEFAULT,
          value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub max_output_writes: u64,

    /// Open `follow=true` output streams (`work-orders logs -f`) this replica serves at once;
    /// past it a new one is answered 503 with Retry-After.
    #[arg(long, env = "PULLMAN_MAX_OUTPUT_FOLLOWERS", default_value_t = crate::queue::limits::MAX_FOLLOWERS_DEFAULT,
          value_parser = clap::value_parser!(u64).range(1..=crate::queue::limits::MAX_FOLLOWERS_MAX))]
    pub max_output_followers: u64,

    /// Most successful completes committed together (group commit): completes arriving from
    /// many agents at once share one statement and one commit, each answered after it. 1 runs
    /// each complete alone.
    #[arg(long, env = "PULLMAN_COMPLETE_BATCH", default_value_t = crate::queue::limits::COMPLETE_BATCH_DEFAULT,
          value_parser = clap::value_parser!(u64).range(1..=crate::queue::limits::COMPLETE_BATCH_MAX))]
    pub complete_batch: u64,

    /// Most one-order claims served together (group claims): claims of many agents arriving at
    /// once share one statement and one commit, each agent handed only what it may take (a
    /// claim the group cannot serve, such as an agent with orders targeting it by name, runs
    /// alone). 1 runs each claim alone.
    #[arg(long, env = "PULLMAN_CLAIM_BATCH", default_value_t = crate::queue::limits::CLAIM_BATCH_DEFAULT,
          value_parser = clap::value_parser!(u64).range(1..=crate::queue::limits::CLAIM_BATCH_MAX))]
    pub claim_batch: u64,

    /// Longest a request under /api/v1 may go unanswered, in seconds, not counting a claim-next's
    /// long-poll wait or a followed output stream: past it the request is answered 503
    /// `database_unavailable` and the database is taken for down until a probe answers
    /// (docs/design.md §5). It ends waits that nothing else would: a database that still
    /// acknowledges at the TCP level but answers nothing (a stopped process, a proxy whose server
    /// is gone). A request body must arrive within it too.
    #[arg(long, env = "PULLMAN_REQUEST_TIMEOUT_SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub request_timeout_seconds: u64,

    /// Seconds `serve` keeps answering after SIGTERM/SIGINT before it stops accepting
    /// connections (docs/design.md §7). Meanwhile `/readyz` answers 503 and the controller hands
    /// its Lease on; the delay lets Services and load balancers stop routing here first, so a
    /// rolling update refuses no request. A second signal ends the delay. The chart sets 5.
    #[arg(long, env = "PULLMAN_SHUTDOWN_DELAY_SECONDS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=300))]
    pub shutdown_delay_seconds: u64,

    #[command(flatten)]
    pub controller: ControllerArgs,
}

/// Whether `serve` runs the WorkOrder/Executor controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ControllerMode {
    /// Run it when a Kubernetes API is reachable (in-cluster config or KUBECONFIG).
    Auto,
    /// Run it; fail to start without a Kubernetes API.
    On,
    /// Never run it.
    Off,
}

#[derive(Debug, Clone, Args)]
pub struct ControllerArgs {
    /// Run the WorkOrder/Executor controller.
    #[arg(
        long = "controller",
        env = "PULLMAN_CONTROLLER",
        value_enum,
        default_value = "auto"
    )]
    pub mode: ControllerMode,

    /// Reconcile only these namespaces, separated by commas (default: all namespaces).
    #[arg(long, env = "PULLMAN_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,

    /// Namespace of the leader-election Lease (default: the pod's namespace, else `default`).
    #[arg(long, env = "PULLMAN_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,

    /// Name of the leader-election Lease (one controller per name and namespace leads).
    #[arg(
        long,
        env = "PULLMAN_LEADER_ELECTION_ID",
        default_value = "pullman-controller"
    )]
    pub leader_election_id: String,

    /// Pull-API URL that executors deployed for `Executor.spec.deployment` connect to, e.g.
    /// http://pullman.pullman-system.svc:8080. Default: none; such Executors then stall with
    /// reason DeploymentNotConfigured.
    #[arg(long, env = "PULLMAN_EXECUTOR_SERVER_URL", value_parser = crate::client::parse_server_url)]
    pub executor_server_url: Option<String>,

    /// Seconds between full resyncs of WorkOrders (changes arrive through LISTEN/NOTIFY sooner);
    /// values under 5 count as 5.
    #[arg(long, env = "PULLMAN_RESYNC_SECONDS", default_value_t = 60)]
    pub resync_seconds: u64,
}
