//! `pullman work-orders logs ID [-f] [--tail N] [--attempt N] [--timestamps]` and
//! `work-orders create --wait --logs` (docs/design.md §9, issue #24): print an order's output; with
//! `-f` follow it as it is stored and exit with the order's outcome, as `wait` does.

use std::process::ExitCode;
use std::time::Duration;

use uuid::Uuid;

use super::args::LogsArgs;
use super::wait::exit_code_of;
use crate::client::{Client, ClientError};
use crate::wire::{OutputEntry, OutputQuery};

/// Lines asked for per page.
const PAGE_LINES: i64 = crate::queue::limits::OUTPUT_PAGE_LINES_DEFAULT;
/// Pause before following again after the server could not be reached.
const RETRY: Duration = Duration::from_secs(1);

/// Prints order `id`'s output as `args` says. Without `-f`: every stored line (or the last
/// `--tail`), exit 0. With `-f`: then every new line until the order finishes, and the order's
/// outcome as exit status; a cut connection or a server restart is resumed from the last line
/// printed (no line twice), with a note on stderr. A server never reached is an error at once
/// (exit 1), as for `wait`: a wrong `--server` is not waited out.
pub async fn logs(client: &Client, id: Uuid, args: &LogsArgs) -> anyhow::Result<ExitCode> {
    let filter = OutputQuery {
        attempt: args.attempt.map(|a| a as i32),
        ..OutputQuery::default()
    };
    if !args.follow {
        let mut query = match args.tail {
            Some(n) => OutputQuery {
                tail: Some(i64::from(n)),
                ..filter.clone()
            },
            None => OutputQuery {
                limit: Some(PAGE_LINES),
                ..filter.clone()
            },
        };
        loop {
            let page = client.read_output(id, &query).await?;
            print_lines(&page.lines, args.timestamps);
            match (page.more, page.next_cursor) {
                (true, Some(c)) => {
                    query = OutputQuery {
                        limit: Some(PAGE_LINES),
                        after: Some(c),
                        ..filter.clone()
                    }
                }
                _ => return Ok(ExitCode::SUCCESS),
            }
        }
    }
    let mut after: Option<i64> = None;
    let mut reported = false;
    let mut first = true;
    // Whether the server has answered once: only then is a failure a restart to wait out.
    let mut reached = false;
    loop {
        let query = match (after, args.tail) {
            (Some(c), _) => OutputQuery {
                after: Some(c),
                ..filter.clone()
            },
            (None, Some(n)) if first => OutputQuery {
                tail: Some(i64::from(n)),
                ..filter.clone()
            },
            (None, _) => filter.clone(),
        };
        first = false;
        match follow_once(
            client,
            id,
            &query,
            &mut after,
            &mut reached,
            args.timestamps,
        )
        .await
        {
            Ok(()) => {
                // A clean end: the order finished (or the server is stopping: look).
                match client.get_log_entry(id).await {
                    Ok(entry) => {
                        eprintln!(
                            "work order {} {} (retries {}, reclaims {})",
                            entry.id,
                            entry.outcome.as_str(),
                            entry.retry_count,
                            entry.reclaim_count
                        );
                        return Ok(ExitCode::from(exit_code_of(entry.outcome)));
                    }
                    Err(e) if is_not_found(&e) || e.is_transient() => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) if e.is_transient() && reached => {
                if !reported {
                    eprintln!("{e}; still following");
                    reported = true;
                }
                // A busy server (503 too_many_followers, 429) says when to come back.
                tokio::time::sleep(e.retry_after().unwrap_or(RETRY).max(RETRY)).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        tokio::time::sleep(RETRY).await;
    }
}

fn is_not_found(e: &ClientError) -> bool {
    matches!(e, ClientError::Api { status, .. } if *status == reqwest::StatusCode::NOT_FOUND)
}

/// One follow request: prints lines until the stream ends (`Ok`) or is cut (a transport error,
/// transient). `after` tracks the last line printed; `reached` is set once the server answers.
async fn follow_once(
    client: &Client,
    id: Uuid,
    query: &OutputQuery,
    after: &mut Option<i64>,
    reached: &mut bool,
    timestamps: bool,
) -> Result<(), ClientError> {
    let answer = client.follow_output(id, query).await;
    // Any answer of the server's (a 503 too) shows it is the right one, only busy.
    *reached |= answer.is_ok() || matches!(answer, Err(ClientError::Api { .. }));
    let mut resp = answer?;
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let chunk = resp
            .chunk()
            .await
            .map_err(|source| ClientError::Transport {
                url: "the output stream".into(),
                source,
            })?;
        let Some(chunk) = chunk else {
            return Ok(());
        };
        pending.extend_from_slice(&chunk);
        let Some(end) = pending.iter().rposition(|b| *b == b'\n') else {
            continue;
        };
        let complete: Vec<u8> = pending.drain(..=end).collect();
        let mut lines = Vec::new();
        for raw in complete.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let line: OutputEntry = serde_json::from_slice(raw)
                .map_err(|e| ClientError::Protocol(format!("a line of the output stream: {e}")))?;
            lines.push(line);
        }
        print_lines(&lines, timestamps);
        if let Some(last) = lines.last() {
            *after = Some(last.cursor);
        }
    }
}

/// Prints lines as read, one flush per batch; a closed pipe ends the process quietly.
fn print_lines(lines: &[OutputEntry], timestamps: bool) {
    if lines.is_empty() {
        return;
    }
    let mut out = String::new();
    for l in lines {
        if timestamps {
            out.push_str(&l.at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
            out.push(' ');
        }
        // The executor's lines name their pod and container; a worker's stdout/stderr do not.
        if !matches!(
            l.stream.as_str(),
            "stdout" | "stderr" | crate::queue::output::MARKER_STREAM
        ) {
            out.push('[');
            out.push_str(&l.stream);
            out.push_str("] ");
        }
        out.push_str(&l.text);
        out.push('\n');
    }
    crate::stdout::write_all(out.as_bytes());
}
