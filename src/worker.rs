//! `pullman worker --exec CMD`: the reference external worker (DESIGN.md §7). It carries an order
//! out by running CMD with the work order JSON on stdin; exit 0 is success, exit 3 a failure not
//! worth retrying, any other exit a retryable failure.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::agent::{self, Carrier, LoopConfig, Shutdown, Verdict};
use crate::client::Client;
use crate::queue::WorkOrder;

/// Most bytes of output reported as the result message.
pub const MESSAGE_TAIL_BYTES: usize = 4096;
/// Exit code of CMD meaning "failed, do not retry".
pub const EXIT_NO_RETRY: i32 = 3;

/// Run work orders with a shell command.
///
/// Claims work orders with a lease (long-poll), heartbeats every lease/3, and runs CMD through
/// `sh -c` with the work order JSON on stdin and PULLMAN_WORK_ORDER_ID, PULLMAN_CLAIM_ID and
/// PULLMAN_WORK_TYPE in its environment. The result is reported from CMD's exit status:
///
///   exit 0   success; the message is the tail of stdout (at most 4 KiB)
///   exit 3   failure, not retried; the message is the tail of stderr
///   other    failure, retried per the order's max_retries/backoff_seconds
///
/// If a heartbeat says the order was cancelled or reclaimed, CMD's process group gets SIGTERM
/// (SIGKILL 10 s later) and nothing is reported. SIGTERM/SIGINT: stop claiming and let the running
/// order finish; a second signal stops it too and leaves it to the reaper.
#[derive(Debug, Clone, Args)]
#[command(verbatim_doc_comment)]
pub struct WorkerArgs {
    /// Pullman server URL.
    #[arg(long, env = "PULLMAN_SERVER")]
    pub server: String,
    /// File holding this agent's bearer token.
    #[arg(long, env = "PULLMAN_TOKEN_FILE")]
    pub token_file: PathBuf,
    /// Only claim orders of this work type (repeatable; default: whatever the agent may take).
    #[arg(long = "work-type", env = "PULLMAN_WORK_TYPES", value_delimiter = ',')]
    pub work_types: Vec<String>,
    /// Lease requested on each claim, in seconds (heartbeat every third of it).
    #[arg(long, env = "PULLMAN_LEASE_SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u32).range(5..=86400))]
    pub lease_seconds: u32,
    /// Orders run at once.
    #[arg(long, env = "PULLMAN_CONCURRENCY", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub concurrency: u32,
    /// Shell command that carries out one order (run with `sh -c`). It gets the work order JSON
    /// on stdin and PULLMAN_WORK_ORDER_ID, PULLMAN_CLAIM_ID, PULLMAN_WORK_TYPE in its
    /// environment. Exit 0: success (message: tail of stdout); exit 3: failure, not retried;
    /// any other exit: retryable failure (message: tail of stderr). At most 4 KiB is reported.
    #[arg(long, env = "PULLMAN_EXEC")]
    pub exec: String,
}

/// Reads a token file, naming the file in errors.
pub fn read_token(path: &std::path::Path) -> anyhow::Result<String> {
    let token = std::fs::read_to_string(path)
        .with_context(|| format!("reading token file {}", path.display()))?;
    let token = token.trim().to_string();
    anyhow::ensure!(!token.is_empty(), "token file {} is empty", path.display());
    Ok(token)
}

/// Connects with the token and learns which agent it belongs to.
pub async fn connect_as_agent(
    server: &str,
    token_file: &std::path::Path,
) -> anyhow::Result<(Client, uuid::Uuid)> {
    let client = Client::new(server, &read_token(token_file)?)?;
    let me = client.whoami().await.with_context(|| {
        format!(
            "checking the token from {} against {server}",
            token_file.display()
        )
    })?;
    let agent_id = me.agent_id.with_context(|| {
        format!(
            "the token in {} is the admin token; give an agent token (pullman agents create)",
            token_file.display()
        )
    })?;
    tracing::info!(agent = %agent_id, name = me.agent_name.as_deref().unwrap_or(""), server, "connected");
    Ok((client, agent_id))
}

/// `pullman worker`.
pub async fn run(args: WorkerArgs) -> anyhow::Result<()> {
    let (client, agent_id) = connect_as_agent(&args.server, &args.token_file).await?;
    let config = LoopConfig {
        agent_id,
        work_types: args.work_types.clone(),
        lease_seconds: args.lease_seconds,
        concurrency: args.concurrency as usize,
        max_wait_seconds: 30,
    };
    let carrier = Arc::new(ExecCarrier {
        command: args.exec.clone(),
    });
    agent::run(client, config, carrier, Shutdown::on_signals()).await;
    tracing::info!("worker stopped");
    Ok(())
}

/// Carries orders out by running a shell command.
pub struct ExecCarrier {
    pub command: String,
}

impl Carrier for ExecCarrier {
    async fn carry(&self, order: WorkOrder, stop: CancellationToken) -> Verdict {
        match run_command(&self.command, &order, stop).await {
            Ok(v) => v,
            Err(e) => Verdict::Failure {
                message: format!("could not run the command: {e:#}"),
                retryable: true,
            },
        }
    }
}

async fn run_command(
    command: &str,
    order: &WorkOrder,
    stop: CancellationToken,
) -> anyhow::Result<Verdict> {
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
    let input = serde_json::to_vec(order)?;
    let mut stdin = child.stdin.take().expect("piped");
    let feed = tokio::spawn(async move {
        // CMD may not read its input; a broken pipe is fine.
        let _ = stdin.write_all(&input).await;
    });
    let stdout = tokio::spawn(read_tail(child.stdout.take().expect("piped")));
    let stderr = tokio::spawn(read_tail(child.stderr.take().expect("piped")));
    let status = tokio::select! {
        s = child.wait() => s?,
        _ = stop.cancelled() => {
            stop_group(&mut child).await;
            return Ok(Verdict::Failure { message: "stopped".into(), retryable: true });
        }
    };
    feed.abort();
    let out = stdout.await??;
    let err = stderr.await??;
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

/// Reads a stream to its end, keeping only the last 2 × [`MESSAGE_TAIL_BYTES`].
async fn read_tail(mut r: impl AsyncRead + Unpin) -> std::io::Result<Vec<u8>> {
    let keep = 2 * MESSAGE_TAIL_BYTES;
    let mut tail = Vec::with_capacity(keep);
    let mut buf = [0u8; 8192];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Ok(tail);
        }
        tail.extend_from_slice(&buf[..n]);
        if tail.len() > keep {
            tail.drain(..tail.len() - keep);
        }
    }
}

/// The last at most `max` bytes of `bytes` as valid UTF-8, trimmed of surrounding whitespace;
/// a cut never splits a character, and invalid sequences become U+FFFD.
pub fn tail_utf8(bytes: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_string()
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
