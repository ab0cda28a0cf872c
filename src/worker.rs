//! `pullman worker --exec CMD`: the reference external worker (docs/design.md §7). It carries an order
//! out by running CMD with the work order JSON on stdin; exit 0 is success, exit 3 a failure not
//! worth retrying, any other exit a retryable failure. CMD's output is streamed into the worker's
//! log line by line, under the order's id, as it runs, and sent to the server as the order's
//! output (docs/design.md §9, [`crate::pull::output`]).

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::pull::lines::LineCutter;
use crate::pull::output::{self, OutputConfig, OutputHandle, OutputSender, REDACTED, Redactor};
use crate::pull::redact::{MIN_SECRET_BYTES, SecretParts};
use crate::pull::{
    self, Abandon, Carrier, ConnectError, Ended, LoopConfig, PullError, Reported, Shutdown, Verdict,
};
use crate::queue::limits;
use crate::wire::WorkOrder;

/// Most bytes of output reported as the result message.
pub const MESSAGE_TAIL_BYTES: usize = 4096;
/// Exit code of CMD meaning "failed, do not retry".
pub const EXIT_NO_RETRY: i32 = 3;
/// Longest line of CMD's output logged as one entry; longer lines are logged in pieces.
pub const LOG_LINE_BYTES: usize = 4096;

/// Exit codes of `pullman worker` (documented in `--help`, [`WORKER_HELP`]; a test runs each).
/// With `--once` they are those of `pullman work-orders wait` (3 failed, 4 cancelled, 5 timed
/// out), so a script reads both alike; 0 with `--once` only ever means the order succeeded.
pub mod exit {
    /// Stopped by a signal after draining; with `--once`: the order succeeded.
    pub const OK: i32 = 0;
    /// The worker could not start (unreadable token file, admin token given, …).
    pub const ERROR: i32 = 1;
    /// `--once`: the order failed (reported; the server may retry it elsewhere).
    pub const ORDER_FAILED: i32 = 3;
    /// `--once`: the order was cancelled, reclaimed or abandoned, or its result could not be
    /// delivered.
    pub const ABANDONED: i32 = 4;
    /// `--once`: no order was run (`--wait` ran out, also while the server was unreachable, or
    /// a signal came first).
    pub const NO_ORDER: i32 = 5;
    /// The server refused the token: the agent was retired or its token revoked or rotated.
    pub const UNAUTHORIZED: i32 = 6;
}

/// What `pullman worker --help` says after the flags: how CMD's exit status is reported, what
/// stops the worker, and its exit codes.
pub const WORKER_HELP: &str = "\
Claims work orders with a lease (long-poll), checks in every --check-in-seconds while an order
runs (a cancelled order's CMD is stopped as on a second signal), and runs CMD through
`sh -c` with the work order JSON on stdin and PULLMAN_WORK_ORDER_ID, PULLMAN_CLAIM_ID and
PULLMAN_WORK_TYPE in its environment. CMD's stdout and stderr are logged line by line as it
runs, under the order's id, then its exit status, and sent to the server as the order's output
(`pullman work-orders logs ID`) at least once a second, with the agent's token and the values
of --redact-env replaced by [REDACTED] (a multi-line value whole and each of its lines of 4 or
more characters). Up to --output-buffer-bytes of output are held. When they are full and the
server takes output, CMD waits on its pipe as on a slow terminal, so nothing is lost; while the
server is unreachable or refuses output (429, 503), CMD runs on and the oldest lines are dropped,
logged, and marked in the output as a gap naming the cause. The result is reported from the
status:

  exit 0   success; the message is the tail of stdout (at most 4 KiB)
  exit 3   failure, not retried; the message is the tail of stderr
  other    failure, retried per the order's max_retries/backoff_seconds

If a heartbeat says the order was cancelled or reclaimed, CMD's process group gets SIGTERM
(SIGKILL 10 s later) and nothing is reported. SIGTERM/SIGINT: stop claiming and let the running
order finish; a second signal stops it too and leaves it to the reaper. While the server is
unreachable (at start or later) the worker retries with backoff (0.5 s doubling to 30 s) and
logs when it is connected again.

Exit codes (with --once, as `pullman work-orders wait`):
  0   stopped by a signal; with --once: the order succeeded
  1   could not start (unreadable token file, admin token, …)
  2   bad command line
  3   --once: the order failed (reported; the server may retry it)
  4   --once: the order was cancelled, reclaimed or abandoned (nothing reported)
  5   --once: no order was run (--wait ran out, the server unreachable included, or a
      signal came first)
  6   the server refused the token: agent retired or token revoked/rotated";

/// Run work orders with a shell command (see [`WORKER_HELP`]).
#[derive(Debug, Clone, Args)]
#[command(after_long_help = WORKER_HELP)]
pub struct WorkerArgs {
    /// Pullman server URL, scheme, host and port, e.g. http://127.0.0.1:8080.
    #[arg(long, env = "PULLMAN_SERVER", value_parser = crate::client::parse_server_url)]
    pub server: String,
    /// File holding this agent's bearer token (from `pullman agents create`).
    #[arg(long, env = "PULLMAN_TOKEN_FILE")]
    pub token_file: PathBuf,
    /// Only claim orders of this work type, `build` or `custom` (repeatable or comma-separated;
    /// default: whatever the agent may take).
    #[arg(long = "work-type", env = "PULLMAN_WORK_TYPES", value_delimiter = ',')]
    pub work_types: Vec<String>,
    /// Lease requested on each claim, in seconds (5-86400); a running order checks in every
    /// --check-in-seconds, at least every third of it.
    #[arg(long, env = "PULLMAN_LEASE_SECONDS", default_value_t = limits::AGENT_LEASE_SECONDS as u32,
          value_parser = clap::value_parser!(u32).range(limits::LEASE_SECONDS.min..=limits::LEASE_SECONDS.max))]
    pub lease_seconds: u32,
    /// How often a running order checks in with the server, in seconds (1-3600, at most a third
    /// of --lease-seconds). A check-in is a heartbeat: it keeps the lease and is how the worker
    /// learns that the order was cancelled, so a cancel stops CMD within about this long. Each
    /// is one small write on the server: raise it for a large fleet of busy workers.
    #[arg(long, env = "PULLMAN_CHECK_IN_SECONDS", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub check_in_seconds: u32,
    /// Orders run at once (1-1024; ignored with --once).
    #[arg(long, env = "PULLMAN_CONCURRENCY", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub concurrency: u32,
    /// Run one order, then exit with its status (0 succeeded, 3 failed, 4 cancelled or
    /// reclaimed, 5 no order); for CI jobs and scripts.
    #[arg(long, env = "PULLMAN_ONCE")]
    pub once: bool,
    /// With --once: give up after this many seconds without an order and exit 5, counted from
    /// the start, connecting included (default: wait until one arrives or a signal comes).
    #[arg(
        long,
        env = "PULLMAN_WAIT_SECONDS",
        value_name = "SECONDS",
        requires = "once"
    )]
    pub wait: Option<u64>,
    /// Shell command that carries out one order (run with `sh -c`). It gets the work order JSON
    /// on stdin and PULLMAN_WORK_ORDER_ID, PULLMAN_CLAIM_ID, PULLMAN_WORK_TYPE in its
    /// environment. Exit 0: success (message: tail of stdout); exit 3: failure, not retried;
    /// any other exit: retryable failure (message: tail of stderr). At most 4 KiB is reported.
    #[arg(long, env = "PULLMAN_EXEC")]
    pub exec: String,
    /// Hide the value of this environment variable in the output sent to the server (and in the
    /// result message and the worker's log): it becomes [REDACTED]. A multi-line value (a key, a
    /// kubeconfig) is hidden whole and line by line, each line of 4 or more characters (shorter
    /// lines only as part of the whole; a warning names the variable). A value shorter than 4
    /// characters is refused at start (exit 1): hiding it would hide those characters
    /// everywhere. Repeatable or comma-separated. The agent's own token is always hidden.
    #[arg(
        long = "redact-env",
        env = "PULLMAN_REDACT_ENV",
        value_name = "NAME",
        value_delimiter = ','
    )]
    pub redact_env: Vec<String>,
    /// Bytes of output text held for the server (at least 1 MiB). When full, CMD waits while
    /// the server takes output; while it is unreachable or refusing (429, 503) the oldest lines
    /// are dropped instead and the server is told how many bytes are missing, and why.
    #[arg(long, env = "PULLMAN_OUTPUT_BUFFER_BYTES", default_value_t = output::DEFAULT_BUFFER_BYTES as u64,
          value_parser = clap::value_parser!(u64).range(1 << 20..=1 << 32))]
    pub output_buffer_bytes: u64,
}

/// `pullman worker`: exits the process with one of the [`exit`] codes.
pub async fn run(args: WorkerArgs) -> anyhow::Result<()> {
    let code = run_for_exit_code(args).await;
    if code != exit::OK {
        std::process::exit(code);
    }
    Ok(())
}

async fn run_for_exit_code(args: WorkerArgs) -> i32 {
    let mut secrets = match redact_env_values(&args.redact_env, |name| std::env::var_os(name)) {
        Ok(values) => values,
        Err(e) => {
            tracing::error!("could not start: {e}");
            return exit::ERROR;
        }
    };
    let shutdown = Shutdown::on_signals();
    // `--wait` bounds the whole run up to the claim, connecting included: a server that is down
    // or never answers must not keep a CI job waiting past it.
    let deadline = args
        .wait
        .filter(|_| args.once)
        .map(|w| tokio::time::Instant::now() + Duration::from_secs(w));
    let (client, agent_id) =
        match pull::connect_as_agent(&args.server, &args.token_file, &shutdown.drain, deadline)
            .await
        {
            Ok(c) => c,
            // With --once, 0 means "the order succeeded": a signal before any order is "no order".
            Err(ConnectError::Stopped) => {
                let code = if args.once { exit::NO_ORDER } else { exit::OK };
                tracing::info!(exit_code = code, "worker stopped before connecting");
                return code;
            }
            Err(ConnectError::DeadlinePassed) => {
                tracing::error!(
                    server = %args.server,
                    exit_code = exit::NO_ORDER,
                    "the server did not answer within --wait; no order was run"
                );
                return exit::NO_ORDER;
            }
            Err(e @ ConnectError::Unauthorized(_)) => {
                tracing::error!("{e}");
                return exit::UNAUTHORIZED;
            }
            Err(e) => {
                tracing::error!("could not start: {e:#}");
                return exit::ERROR;
            }
        };
    let config = LoopConfig {
        agent_id,
        work_types: args.work_types.clone(),
        lease_seconds: args.lease_seconds,
        concurrency: args.concurrency as usize,
        max_wait_seconds: limits::MAX_WAIT_SECONDS,
        heartbeat_every: Some(
            Duration::from_secs(args.check_in_seconds.into())
                .min(pull::lease_third(args.lease_seconds)),
        ),
    };
    secrets.push(client.token().to_string());
    let carrier = Arc::new(ExecCarrier {
        command: args.exec.clone(),
        output: Some(OutputConfig {
            client: client.clone(),
            agent_id,
            buffer_bytes: usize::try_from(args.output_buffer_bytes).unwrap_or(usize::MAX),
            redactor: Redactor::new(secrets),
        }),
    });
    let ended = if args.once {
        pull::run_once(client, config, carrier, shutdown, deadline).await
    } else {
        pull::run(client, config, carrier, shutdown)
            .await
            .map(|()| None)
    };
    let code = match &ended {
        Err(PullError::Unauthorized(_)) => exit::UNAUTHORIZED,
        Ok(None) if args.once => exit::NO_ORDER,
        Ok(None) => exit::OK,
        Ok(Some(end)) => once_exit_code(end),
    };
    match ended {
        Err(e) => tracing::error!("worker stopped: {e}"),
        Ok(_) => tracing::info!(exit_code = code, "worker stopped"),
    }
    code
}

/// The exit code of `--once` for how its order ended.
pub fn once_exit_code(ended: &Ended) -> i32 {
    match ended {
        Ended::Reported {
            reported: Reported::Unauthorized,
            ..
        }
        | Ended::Abandoned(Abandon::Unauthorized) => exit::UNAUTHORIZED,
        Ended::Reported {
            verdict: Verdict::Success { .. },
            reported: Reported::Finished(_),
        } => exit::OK,
        Ended::Reported {
            reported: Reported::Refused | Reported::Lost,
            ..
        } => exit::ABANDONED,
        Ended::Reported { .. } => exit::ORDER_FAILED,
        Ended::Abandoned(_) => exit::ABANDONED,
    }
}

/// The values of the variables named by `--redact-env`, read through `var` (docs/design.md §9,
/// [`crate::pull::redact`]). An unset or empty variable is warned about and skipped; a value
/// shorter than [`MIN_SECRET_BYTES`] (trimmed), or not UTF-8, is an error naming the variable;
/// a multi-line value whose lines are partly shorter than that is warned about (those lines are
/// hidden only where the value is printed whole). No value is ever logged or put in an error.
pub fn redact_env_values(
    names: &[String],
    var: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Result<Vec<String>, String> {
    let mut values = Vec::new();
    for name in names {
        let Some(value) = var(name).filter(|v| !v.is_empty()) else {
            tracing::warn!(
                name,
                "--redact-env: variable unset or empty; nothing to hide"
            );
            continue;
        };
        let Ok(value) = value.into_string() else {
            return Err(format!(
                "--redact-env {name}: the value is not valid UTF-8, so it cannot be matched in \
                 the output"
            ));
        };
        let parts = SecretParts::of(&value);
        if parts.whole.is_empty() {
            tracing::warn!(
                name,
                "--redact-env: variable is only whitespace; nothing to hide"
            );
            continue;
        }
        if parts.too_short() {
            return Err(format!(
                "--redact-env {name}: the value is shorter than {MIN_SECRET_BYTES} characters, \
                 too short to hide: every occurrence of those characters in the output would \
                 become {REDACTED}. Use a longer secret, or leave {name} out of --redact-env"
            ));
        }
        if parts.short_lines > 0 {
            tracing::warn!(
                name,
                short_lines = parts.short_lines,
                "--redact-env: lines of this multi-line value shorter than {MIN_SECRET_BYTES} \
                 characters are not hidden on their own, only where the value is printed whole"
            );
        }
        values.push(value);
    }
    Ok(values)
}

/// Carries orders out by running a shell command: `Applying` starts it, `Watching` waits for
/// its exit.
pub struct ExecCarrier {
    pub command: String,
    /// Where CMD's output goes besides the log; `None`: only the log.
    pub output: Option<OutputConfig>,
}

/// A started CMD: the process and the tasks streaming its output (each returns the tail).
pub struct Running {
    child: tokio::process::Child,
    sender: Option<OutputSender>,
    feed: JoinHandle<()>,
    stdout: JoinHandle<std::io::Result<Vec<u8>>>,
    stderr: JoinHandle<std::io::Result<Vec<u8>>>,
}

impl Carrier for ExecCarrier {
    type Started = Running;

    async fn start(
        &self,
        order: &WorkOrder,
        _stop: &CancellationToken,
    ) -> Result<Running, Verdict> {
        spawn_command(&self.command, order, self.output.as_ref()).map_err(|e| Verdict::Failure {
            message: format!("could not run the command: {e:#}"),
            retryable: true,
        })
    }

    async fn finish(
        &self,
        _order: &WorkOrder,
        running: Running,
        stop: &CancellationToken,
        _progress: &pull::Progress,
    ) -> Verdict {
        match wait_command(running, stop).await {
            Ok(v) => v,
            Err(e) => Verdict::Failure {
                message: format!("could not run the command: {e:#}"),
                retryable: true,
            },
        }
    }
}

fn spawn_command(
    command: &str,
    order: &WorkOrder,
    output: Option<&OutputConfig>,
) -> anyhow::Result<Running> {
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .env("PULLMAN_WORK_ORDER_ID", order.id.to_string())
        .env(
            "PULLMAN_CLAIM_ID",
            order.claim_id.map(|c| c.to_string()).unwrap_or_default(),
        )
        .env("PULLMAN_WORK_TYPE", order.work_type.as_str())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Own process group, so a stop reaches everything CMD started.
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .context("spawning sh")?;
    tracing::info!(pid = child.id().unwrap_or(0), "command started");
    let input = serde_json::to_vec(order)?;
    let mut stdin = child.stdin.take().expect("piped");
    let feed = tokio::spawn(async move {
        // CMD may not read its input; a broken pipe is fine.
        let _ = stdin.write_all(&input).await;
    });
    let sender = match (output, order.claim_id) {
        (Some(config), Some(claim)) => Some(OutputSender::start(config, order.id, claim, 0)),
        _ => None,
    };
    let sink = Sink {
        handle: sender.as_ref().map(OutputSender::handle),
        redactor: output.map(|c| c.redactor.clone()).unwrap_or_default(),
    };
    let stdout = tokio::spawn(
        stream_lines(child.stdout.take().expect("piped"), "stdout", sink.clone()).in_current_span(),
    );
    let stderr = tokio::spawn(
        stream_lines(child.stderr.take().expect("piped"), "stderr", sink).in_current_span(),
    );
    Ok(Running {
        child,
        sender,
        feed,
        stdout,
        stderr,
    })
}

async fn wait_command(mut running: Running, stop: &CancellationToken) -> anyhow::Result<Verdict> {
    let status = tokio::select! {
        s = running.child.wait() => s?,
        _ = stop.cancelled() => {
            stop_group(&mut running.child).await;
            return Ok(Verdict::Failure { message: "stopped".into(), retryable: true });
        }
    };
    running.feed.abort();
    let out = running.stdout.await??;
    let err = running.stderr.await??;
    // The last lines are in before the order is completed (docs/design.md §9), within a bound.
    if let Some(sender) = running.sender.take() {
        sender.finish(output::FLUSH_TIMEOUT).await;
    }
    match status.code() {
        Some(code) => tracing::info!(exit_status = code, "command exited"),
        None => tracing::warn!(%status, "command killed"),
    }
    Ok(match status.code() {
        Some(0) => Verdict::Success {
            message: tail_utf8(&out, MESSAGE_TAIL_BYTES),
        },
        Some(code) => Verdict::Failure {
            message: failure_message(&format!("exit status {code}"), &err, &out),
            retryable: code != EXIT_NO_RETRY,
        },
        None => Verdict::Failure {
            message: failure_message(&format!("killed ({status})"), &err, &out),
            retryable: true,
        },
    })
}

/// Where a stream's lines go besides the log: the order's output, after redaction.
#[derive(Clone)]
struct Sink {
    handle: Option<OutputHandle>,
    redactor: Redactor,
}

/// Logs a stream line by line as it comes and sends each line to the order's output, keeping the
/// last 2 × [`MESSAGE_TAIL_BYTES`] (redacted) for the result message. Lines are cut as the
/// executor cuts its containers' ([`LineCutter`]: redacted before any cut, pieces of
/// [`output::MAX_LINE_BYTES`] for longer lines, invalid UTF-8 as U+FFFD; docs/design.md §9).
/// While the output buffer is full and the server accepts output, this waits, and CMD blocks on
/// its pipe.
async fn stream_lines(
    mut r: impl AsyncRead + Unpin,
    stream: &'static str,
    sink: Sink,
) -> std::io::Result<Vec<u8>> {
    let keep = 2 * MESSAGE_TAIL_BYTES;
    let mut tail: Vec<u8> = Vec::with_capacity(keep);
    let mut cutter = LineCutter::new(sink.redactor.clone(), output::MAX_LINE_BYTES);
    let mut buf = vec![0u8; READ_BYTES];
    loop {
        let n = r.read(&mut buf).await?;
        let pieces = if n == 0 {
            cutter.finish()
        } else {
            cutter.feed(&buf[..n])
        };
        for piece in pieces {
            if piece.starts_line && !tail.is_empty() {
                tail.push(b'\n');
            }
            tail.extend_from_slice(piece.text.as_bytes());
            if tail.len() > keep {
                tail.drain(..tail.len() - keep);
            }
            emit_line(piece.text, stream, &sink).await;
        }
        if n == 0 {
            return Ok(tail);
        }
    }
}

/// Bytes asked of a command's pipe per read.
const READ_BYTES: usize = 16 * 1024;

/// One redacted line (or piece of one) into the worker's log and the order's output.
async fn emit_line(text: String, stream: &'static str, sink: &Sink) {
    let mut rest = text.as_str();
    loop {
        let cut = rest.floor_char_boundary(LOG_LINE_BYTES);
        tracing::info!(stream, "{}", &rest[..cut]);
        rest = &rest[cut..];
        if rest.is_empty() {
            break;
        }
    }
    if let Some(h) = &sink.handle {
        h.push_redacted(stream, text, chrono::Utc::now()).await;
    }
}

fn failure_message(what: &str, stderr: &[u8], stdout: &[u8]) -> String {
    let detail = if stderr.iter().any(|b| !b.is_ascii_whitespace()) {
        stderr
    } else {
        stdout
    };
    let head = format!("{what}: ");
    head.clone() + &tail_utf8(detail, MESSAGE_TAIL_BYTES - head.len())
}

/// SIGTERM to the group, SIGKILL after 10 s.
async fn stop_group(child: &mut tokio::process::Child) {
    use nix::sys::signal::{Signal, killpg};
    use nix::unistd::Pid;
    if let Some(pid) = child.id() {
        let group = Pid::from_raw(pid as i32);
        let _ = killpg(group, Signal::SIGTERM);
        if tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .is_err()
        {
            let _ = killpg(group, Signal::SIGKILL);
            let _ = child.wait().await;
        }
    }
}

/// The last at most `max` bytes of `bytes` as valid UTF-8, trimmed of surrounding whitespace;
/// a cut never splits a character, and invalid sequences become U+FFFD.
pub fn tail_utf8(bytes: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    text[text.ceil_char_boundary(text.len().saturating_sub(max))..].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tails_are_bounded_valid_utf8() {
        let s = "é".repeat(3000); // 6000 bytes
        let t = tail_utf8(s.as_bytes(), 4096);
        assert!(t.len() <= 4096 && t.len() >= 4094);
        assert!(t.chars().all(|c| c == 'é'));
        let mut bad = b"ok \xff\xfe end".to_vec();
        bad.extend_from_slice(b"\n");
        assert_eq!(tail_utf8(&bad, 100), "ok \u{fffd}\u{fffd} end");
        assert_eq!(tail_utf8(b"  short\n", 4096), "short");
    }

    #[test]
    fn failure_messages_prefer_stderr_and_stay_under_the_limit() {
        let m = failure_message("exit status 2", b"boom\n", b"out");
        assert_eq!(m, "exit status 2: boom");
        let m = failure_message("exit status 2", b"", b"only stdout");
        assert_eq!(m, "exit status 2: only stdout");
        let long = vec![b'x'; 10_000];
        assert!(failure_message("exit status 1", &long, b"").len() <= MESSAGE_TAIL_BYTES);
    }
}
