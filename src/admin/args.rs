//! The admin subcommands and their flags (clap). Every flag says its unit and default, as the
//! `--help` of `gh` or `kubectl` does (issue #15).

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

use crate::queue::limits::PAGE_LIMIT;

/// How results are printed (`-o`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Columns for people.
    Table,
    /// More columns (tenant, targeting, claim, last error, exact times).
    Wide,
    /// The API's JSON (a list prints an array of items).
    Json,
    /// The same document as json, in YAML.
    Yaml,
    /// One id per line (agents: one name per line), for scripts.
    Name,
}

/// Server and admin credentials of the admin commands.
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// Pullman server URL (scheme, host and port).
    #[arg(
        long,
        global = true,
        env = "PULLMAN_SERVER",
        default_value = "http://127.0.0.1:8080",
        value_parser = crate::client::parse_server_url
    )]
    pub server: String,
    /// Admin token (prefer the environment variable or --token-file: command lines are visible
    /// to other users). Default: read from --token-file.
    #[arg(
        long,
        global = true,
        env = "PULLMAN_ADMIN_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// File holding the admin token. Default: <PULLMAN_DATA_DIR or ./.pullman>/admin-token, as
    /// written by `pullman serve`.
    #[arg(long, global = true, env = "PULLMAN_ADMIN_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Output format. Colour is used only when printing to a terminal and NO_COLOR is unset.
    #[arg(short = 'o', long, global = true, value_enum, default_value = "table")]
    pub output: Output,
}

/// How a list command pages (`work-orders list`, `log list`): how many items it shows and how
/// many it asks the server for at once. The server's page is at most `PAGE_LIMIT.max` items
/// (docs/design.md §5 "Lists"); the help states that number in prose, and
/// `tests/integration/limits.rs` holds it there.
#[derive(Debug, Clone, Copy, Args)]
pub struct Paging {
    /// Most items shown; past 1000 the list is fetched page by page.
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
    /// Show every matching item, following the pages to the end (ignores --limit).
    #[arg(long)]
    pub all: bool,
    /// Items fetched per request, 1-1000 (the API's page size); lists longer than this are
    /// fetched page by page, following next_cursor.
    #[arg(long, default_value_t = PAGE_LIMIT.max as u16,
        value_parser = clap::value_parser!(u16).range(PAGE_LIMIT.min..=PAGE_LIMIT.max))]
    pub chunk_size: u16,
}

impl Paging {
    /// `--chunk-size` as a count of items.
    pub fn chunk(&self) -> usize {
        usize::from(self.chunk_size)
    }
}

#[derive(Debug, Subcommand)]
pub enum AgentsCommand {
    /// Register an agent and print its token (shown once).
    Create(CreateAgent),
    /// List agents with their health.
    List {
        /// Most agents shown; past 1000 the list is fetched page by page.
        #[arg(long, default_value_t = PAGE_LIMIT.max as usize)]
        limit: usize,
    },
    /// Show one agent.
    Get {
        /// The agent's name, id, or a unique prefix of its id.
        agent: String,
    },
    /// Retire an agent: its token is revoked and its claims return to PENDING.
    Retire {
        /// The agent's name, id, or a unique prefix of its id.
        agent: String,
    },
    /// Issue a new token for an agent, revoking the old one.
    RotateToken {
        /// The agent's name, id, or a unique prefix of its id.
        agent: String,
        /// Write the token to this file (mode 0600) instead of printing it. Default: print it.
        #[arg(long)]
        token_out: Option<PathBuf>,
    },
}

#[derive(Debug, Args)]
pub struct CreateAgent {
    /// Unique name of the agent (other commands accept it in place of the id).
    #[arg(long)]
    pub name: String,
    /// Label (repeatable). An order goes to agents matching any one of its targeted labels,
    /// names, ids or annotations.
    #[arg(long = "label")]
    pub labels: Vec<String>,
    /// Annotation KEY=VALUE (repeatable).
    #[arg(long = "annotation", value_parser = parse_key_value)]
    pub annotations: Vec<(String, String)>,
    /// Work type it takes: build or custom (repeatable). Default: all work types.
    #[arg(long = "work-type")]
    pub work_types: Vec<String>,
    /// Tenant it serves: it then takes only orders of this tenant. Default: none (instance-wide:
    /// takes orders of any tenant or none).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Most claims held at once, 1-100000. Default: unlimited.
    #[arg(long)]
    pub max_concurrency: Option<i64>,
    /// Write the token to this file (mode 0600) instead of printing it. Default: print it.
    #[arg(long)]
    pub token_out: Option<PathBuf>,
}

/// Exit codes of `work-orders wait` and `create --wait`; see [`crate::admin::wait`].
pub const WAIT_EXIT_CODES: &str = "\
Exit status:
  0  the order succeeded
  1  the command failed (unknown id, server unreachable, admin token refused)
  2  bad command line (unknown flag, bad value)
  3  the order failed (retries exhausted, a non-retryable failure, or too many reclaims)
  4  the order was cancelled
  5  --timeout passed while the order was still queued or running";

/// After-help of `work-orders logs`.
pub const LOGS_HELP: &str = "\
Lines are printed as the agent read them; a worker's stdout and stderr are merged, an executor's
lines start with [pod/container]. Lines starting with [pullman: ...] are the server's: output the
agent could not deliver (a gap), or older output dropped past the server's per-order cap. Where
an attempt after the first begins, a line says so and how the attempt before it ended:
  --- attempt 2 (attempt 1 retry_scheduled: exit status 1: ...) ---
-o json prints each line as one JSON object (text, stream, attempt, at, cursor) per line, with no
boundary lines; -o table and wide print the text; -o yaml and name are refused. While the order
waits for an agent, -f says why on stderr (after 3 s, and again when the reason changes).

Exit status with -f (as `work-orders wait`):
  0  the order succeeded
  1  the command failed (unknown id, server unreachable, admin token refused)
  3  the order failed
  4  the order was cancelled
Without -f: 0 once the lines are printed.

Examples:
  pullman work-orders logs 3f2a -f
  pullman work-orders logs 3f2a --tail 20 --timestamps
  pullman work-orders create -f job.yaml --label gpu --wait --logs";

#[derive(Debug, Subcommand)]
pub enum WorkOrdersCommand {
    /// Create a work order from a file of Kubernetes YAML (or a Shipwright Build).
    #[command(after_help = WAIT_EXIT_CODES)]
    Create(Box<CreateWorkOrder>),
    /// List active work orders (finished ones are in `pullman log list`).
    List {
        #[command(flatten)]
        filter: OrderListFilter,
        #[command(flatten)]
        paging: Paging,
        /// Keep polling (every 2 s) and print orders that appear, change or leave; Ctrl-C stops.
        #[arg(short = 'w', long)]
        watch: bool,
    },
    /// Show one active work order: state, retries, reclaims, lease, attempts, YAML.
    Get {
        /// The order's id or a unique prefix of it (with or without dashes).
        id: String,
        /// Keep polling (every 2 s) and print a line whenever the order changes; stops when it
        /// finishes.
        #[arg(short = 'w', long)]
        watch: bool,
    },
    /// Say why a work order waits: no matching agent, none connected, all busy, backing off, or
    /// its place in the queue; with the agents that may take it and how long it has waited.
    Explain {
        /// The order's id or a unique prefix of it (with or without dashes).
        id: String,
    },
    /// Wait until a work order finishes; print its result message and exit with its outcome.
    #[command(after_help = WAIT_EXIT_CODES)]
    Wait {
        /// The order's id or a unique prefix of it (with or without dashes).
        id: String,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Print a work order's output (what its agent's command or pods printed), active or
    /// finished; with -f follow it until the order finishes and exit with its outcome.
    #[command(after_help = LOGS_HELP)]
    Logs {
        /// The order's id or a unique prefix of it (with or without dashes).
        id: String,
        #[command(flatten)]
        logs: LogsArgs,
    },
    /// Cancel a work order (it moves to the log as cancelled).
    Cancel {
        /// The order's id or a unique prefix of it (with or without dashes).
        id: String,
    },
    /// Queue a new order from a finished one (same YAML, targeting and limits), linked to it.
    Rerun {
        /// The finished order's id or a unique prefix of it (with or without dashes).
        id: String,
    },
}

/// Filters of `work-orders list` (sent to the server as query parameters).
#[derive(Debug, Clone, Args)]
pub struct OrderListFilter {
    /// Only this state: PENDING, CLAIMED or RETRY_PENDING (any case). Default: all.
    #[arg(long, value_parser = parse_status)]
    pub status: Option<String>,
    /// Only this work type: build or custom. Default: both.
    #[arg(long)]
    pub work_type: Option<String>,
    /// Only orders targeting this label. Default: any.
    #[arg(long)]
    pub label: Option<String>,
    /// Only orders this agent holds a claim on now (name, id or unique id prefix).
    #[arg(long)]
    pub agent: Option<String>,
    /// Only orders created since this time: RFC 3339 (2026-12-01T08:00:00Z) or an age (90s, 5m,
    /// 2h, 1d). Default: any time.
    #[arg(long, value_parser = parse_since)]
    pub since: Option<chrono::DateTime<chrono::Utc>>,
}

/// `--wait` / `--timeout` of `wait` and `create`.
#[derive(Debug, Clone, Args)]
pub struct WaitArgs {
    /// Give up after this long: a number of seconds, or with a unit (90s, 5m, 2h). 0 waits
    /// forever. Exit status 5 when it passes.
    #[arg(long, default_value = "0", value_parser = parse_duration)]
    pub timeout: std::time::Duration,
}

/// What to print of an order's output.
#[derive(Debug, Clone, Default, Args)]
pub struct LogsArgs {
    /// Keep printing lines as the agent sends them until the order finishes; then exit with its
    /// outcome (0 succeeded, 3 failed, 4 cancelled), as `work-orders wait` does.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Start with only the last N lines (at least 1). Default: from the first line. Up to 10000
    /// are asked of the server at once; for more, every line is read and the last N printed.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub tail: Option<u32>,
    /// Only the lines of this attempt (1 = the order's first claim, 2 = its first retry or
    /// reclaim, ...). Default: every attempt.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub attempt: Option<u32>,
    /// Begin each line with the time the agent read it (RFC 3339, UTC).
    #[arg(long)]
    pub timestamps: bool,
}

#[derive(Debug, Args)]
pub struct CreateWorkOrder {
    /// File with the YAML documents to apply (`-` for stdin), at most 1 MiB.
    #[arg(short = 'f', long = "filename")]
    pub file: PathBuf,
    /// build (one Shipwright Build) or custom (any Kubernetes YAML).
    #[arg(long, default_value = "custom")]
    pub work_type: String,
    /// Target agents with this label (repeatable). An agent matching any one targeted label,
    /// name, id or annotation may take the order.
    #[arg(long = "label")]
    pub labels: Vec<String>,
    /// Target the agent with this name (repeatable; any of them may take it).
    #[arg(long = "agent-name")]
    pub agent_names: Vec<String>,
    /// Target the agent with this id (repeatable; any of them may take it).
    #[arg(long = "agent-id")]
    pub agent_ids: Vec<uuid::Uuid>,
    /// Target agents with this annotation KEY=VALUE (repeatable; any one match is enough, as
    /// for labels).
    #[arg(long = "annotation", value_parser = parse_key_value)]
    pub annotations: Vec<(String, String)>,
    /// Tenant of the order: agents of this tenant and instance-wide agents (no tenant) may take
    /// it. Default: none (only instance-wide agents take it).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Retries after a failure before the order fails for good, 0-100. Default: 3.
    #[arg(long)]
    pub max_retries: Option<i64>,
    /// Seconds before the first retry, 1-86400; each further retry waits twice as long (at
    /// most 24 h). Default: 60.
    #[arg(long)]
    pub backoff_seconds: Option<i64>,
    /// Seconds a claim may last, from its start, before the reaper hands the order out again
    /// (a reclaim), 60-604800. Default: 3600.
    #[arg(long)]
    pub claim_timeout_seconds: Option<i64>,
    /// Times an expired claim is handed out again before the order fails, 0-100. Default: 5.
    #[arg(long)]
    pub max_reclaims: Option<i64>,
    /// Priority, -1000-1000: of one tenant's orders an agent may take, it takes the higher first,
    /// then the older (tenants take turns before that). Default: 0.
    #[arg(long, allow_negative_numbers = true)]
    pub priority: Option<i64>,
    /// Concurrency key, 1-256 characters: of the orders with this key (per tenant), at most the
    /// key's max hold a claim at once, whichever agents claim them.
    #[arg(long, value_name = "KEY")]
    pub concurrency_key: Option<String>,
    /// With --concurrency-key: most orders of the key holding a claim at once, 1-100000.
    /// Default: 1.
    #[arg(long, value_name = "N", requires = "concurrency_key")]
    pub max_concurrent: Option<i64>,
    /// With --concurrency-key: `queue` waits for a free slot; `supersede` cancels the key's
    /// waiting orders (never claimed ones) when this one is created. Default: queue.
    #[arg(long, value_name = "WHAT", requires = "concurrency_key",
          value_parser = ["queue", "supersede"])]
    pub on_conflict: Option<String>,
    /// What an attempt ended by an eviction, a drain, a preemption or a lost node does:
    /// `never` fails the order; `safe` runs it again at once (counted as a reclaim), once the
    /// disrupted run is known to have stopped. Default: never.
    #[arg(long, value_name = "WHEN", value_parser = ["never", "safe"])]
    pub retry_on_disruption: Option<String>,
    /// Block until the order finishes; print its result and exit with its outcome (see below).
    #[arg(long)]
    pub wait: bool,
    /// With --wait: print the order's output as it arrives while waiting (as `work-orders logs
    /// -f`), then exit with its outcome.
    #[arg(long, requires = "wait")]
    pub logs: bool,
    #[command(flatten)]
    pub wait_args: WaitArgs,
}

#[derive(Debug, Subcommand)]
pub enum LogCommand {
    /// List finished work orders, newest first.
    List {
        /// Only this work type: build or custom. Default: both.
        #[arg(long)]
        work_type: Option<String>,
        /// true: succeeded only; false: failed or cancelled. Default: all.
        #[arg(long)]
        success: Option<bool>,
        /// Only this outcome: succeeded, failed or cancelled (any case). Default: all.
        #[arg(long, value_parser = parse_outcome)]
        outcome: Option<String>,
        /// Only orders that targeted this label. Default: any.
        #[arg(long)]
        label: Option<String>,
        /// Only orders finished since this time: RFC 3339 (2026-12-01T08:00:00Z) or an age (90s,
        /// 5m, 2h, 1d). Default: any time.
        #[arg(long, value_parser = parse_since)]
        since: Option<chrono::DateTime<chrono::Utc>>,
        /// Only orders whose last claim was this agent's (name, id or unique id prefix).
        #[arg(long = "agent", alias = "agent-id")]
        agent: Option<String>,
        #[command(flatten)]
        paging: Paging,
    },
    /// Show one finished work order with its whole result message.
    Get {
        /// The order's id or a unique prefix of it (with or without dashes).
        id: String,
    },
}

/// `--status` in any case (`pending`, `retry-pending`) as the API spells it (`PENDING`).
pub fn parse_status(s: &str) -> Result<String, String> {
    let state = s.trim().to_ascii_uppercase().replace('-', "_");
    match state.as_str() {
        "PENDING" | "CLAIMED" | "RETRY_PENDING" => Ok(state),
        _ => Err(format!(
            "expected PENDING, CLAIMED or RETRY_PENDING (any case), got {s:?}"
        )),
    }
}

/// `--outcome` in any case as the API spells it (`succeeded`).
pub fn parse_outcome(s: &str) -> Result<String, String> {
    let outcome = s.trim().to_ascii_lowercase();
    match outcome.as_str() {
        "succeeded" | "failed" | "cancelled" => Ok(outcome),
        _ => Err(format!(
            "expected succeeded, failed or cancelled (any case), got {s:?}"
        )),
    }
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

/// `90`, `90s`, `5m`, `2h`, `1d` → a duration.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("expected seconds or a number with s, m, h or d, got {s:?}"))?;
    let factor = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("unknown unit {unit:?} in {s:?}: use s, m, h or d")),
    };
    Ok(std::time::Duration::from_secs(n.saturating_mul(factor)))
}

/// An RFC 3339 time, or an age (`2h`: two hours ago).
pub fn parse_since(s: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&chrono::Utc));
    }
    let age = parse_duration(s)
        .map_err(|_| format!("expected an RFC 3339 time or an age like 2h, got {s:?}"))?;
    let age = chrono::Duration::from_std(age).map_err(|e| e.to_string())?;
    Ok(chrono::Utc::now() - age)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_seconds_or_a_unit() {
        assert_eq!(parse_duration("90").unwrap().as_secs(), 90);
        assert_eq!(parse_duration("5m").unwrap().as_secs(), 300);
        assert_eq!(parse_duration("2h").unwrap().as_secs(), 7200);
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("m").is_err());
        assert_eq!(parse_status("retry-pending").unwrap(), "RETRY_PENDING");
        assert_eq!(parse_status("pending").unwrap(), "PENDING");
        assert!(parse_status("done").is_err());
        assert_eq!(parse_outcome("FAILED").unwrap(), "failed");
        let t = parse_since("2026-12-01T08:00:00Z").unwrap();
        assert_eq!(t.to_rfc3339(), "2026-12-01T08:00:00+00:00");
        let ago = chrono::Utc::now() - parse_since("2h").unwrap();
        assert!((7199..=7201).contains(&ago.num_seconds()));
    }
}
