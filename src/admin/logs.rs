//! `pullman work-orders logs ID [-f] [--tail N] [--attempt N] [--timestamps] [-o json]` and
//! `work-orders create --wait --logs` (docs/design.md §9, issue #24): print an order's output; with
//! `-f` follow it as it is stored and exit with the order's outcome, as `wait` does. Each attempt
//! after the first starts with a boundary line saying how the one before it ended; while the
//! order waits for an agent, why it waits is said on stderr ([`super::wait_note`]).

use std::collections::VecDeque;
use std::process::ExitCode;
use std::time::Duration;

use uuid::Uuid;

use super::args::{LogsArgs, Output};
use super::render::one_line;
use super::wait::{eprint_finished, exit_code_of};
use super::wait_note::note_while_waiting;
use crate::client::{Client, ClientError};
use crate::queue::limits::MAX_OUTPUT_TAIL;
use crate::wire::{Attempt, OutputEntry, OutputQuery};

/// Lines asked for per page.
const PAGE_LINES: i64 = crate::queue::limits::OUTPUT_PAGE_LINES_DEFAULT;
/// Pause before following again after the server could not be reached.
const RETRY: Duration = Duration::from_secs(1);

/// Prints order `id`'s output as `args` says, as text or (`-o json`) one JSON object per line
/// with its stream, attempt and time (the API's line shape). Without `-f`: every stored line (or
/// the last `--tail`), exit 0. With `-f`: then every new line until the order finishes, and the
/// order's outcome as exit status; a cut connection or a server restart is resumed from the last
/// line printed (no line twice), with a note on stderr. A server never reached is an error at
/// once (exit 1), as for `wait`: a wrong `--server` is not waited out. `--attempt N` for an
/// attempt the order never had (and, finished, never will) is an error.
pub async fn logs(
    client: &Client,
    id: Uuid,
    args: &LogsArgs,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let json = match output {
        Output::Table | Output::Wide => false,
        Output::Json => true,
        Output::Yaml | Output::Name => anyhow::bail!(
            "logs prints text, or with -o json one JSON object per line; -o {} has no meaning for \
             a stream of lines",
            if output == Output::Yaml {
                "yaml"
            } else {
                "name"
            }
        ),
    };
    if let Some(n) = args.attempt {
        check_attempt(client, id, n, args.follow).await?;
    }
    let filter = OutputQuery {
        attempt: args.attempt.map(|a| a as i32),
        ..OutputQuery::default()
    };
    let mut printer = Printer {
        client,
        id,
        timestamps: args.timestamps,
        json,
        last_attempt: None,
    };
    let mut after = match args.tail {
        Some(n) => printer.tail(&filter, n).await?,
        None => None,
    };
    if !args.follow {
        if args.tail.is_none() {
            printer.pages(&filter, None, None).await?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    // A look already answered is a server reached: only a server never reached fails at once.
    let reached = args.tail.is_some() || args.attempt.is_some();
    tokio::select! {
        code = follow(&mut printer, &filter, &mut after, reached) => code,
        () = note_while_waiting(client, id) => unreachable!("never returns"),
    }
}

/// Follows the stream after `after` until the order finishes; its outcome as exit status.
async fn follow(
    printer: &mut Printer<'_>,
    filter: &OutputQuery,
    after: &mut Option<i64>,
    // Whether the server has answered once: only then is a failure a restart to wait out.
    mut reached: bool,
) -> anyhow::Result<ExitCode> {
    let (client, id) = (printer.client, printer.id);
    let mut reported = false;
    loop {
        let query = OutputQuery {
            after: *after,
            ..filter.clone()
        };
        match follow_once(printer, &query, after, &mut reached).await {
            Ok(()) => {
                // A clean end: the order finished (or the server is stopping: look).
                match client.get_log_entry(id).await {
                    Ok(entry) => {
                        eprint_finished(&entry);
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

/// Order `id`'s attempts so far, and whether it is finished (no attempt will follow).
async fn attempts_of(client: &Client, id: Uuid) -> Result<(Vec<Attempt>, bool), ClientError> {
    match client.get_work_order(id).await {
        Ok(order) => Ok((order.attempts.unwrap_or_default(), false)),
        Err(e) if is_not_found(&e) => {
            let entry = client.get_log_entry(id).await?;
            Ok((entry.attempts.unwrap_or_default(), true))
        }
        Err(e) => Err(e),
    }
}

/// `--attempt n` names an attempt the order had, or, with `-f` on an order still active, one
/// it may have yet (then waited for, with a note).
async fn check_attempt(client: &Client, id: Uuid, n: u32, follow: bool) -> anyhow::Result<()> {
    let (attempts, finished) = attempts_of(client, id).await?;
    let had = attempts.len();
    if n as usize <= had {
        return Ok(());
    }
    let had_text = match had {
        0 => "no attempt (it was never claimed)".to_string(),
        1 => "1 attempt".to_string(),
        _ => format!("{had} attempts"),
    };
    if follow && !finished {
        eprintln!("work order {id} has had {had_text}; following attempt {n} once it starts");
        return Ok(());
    }
    anyhow::bail!(
        "--attempt {n}: work order {id} {} {had_text}",
        if finished {
            "finished after"
        } else {
            "has had"
        }
    )
}

/// Prints lines as text or JSON, with a boundary line where a new attempt starts.
struct Printer<'a> {
    client: &'a Client,
    id: Uuid,
    timestamps: bool,
    json: bool,
    /// The attempt of the last line printed.
    last_attempt: Option<i32>,
}

impl Printer<'_> {
    /// Reads every page after `after` (`None`: from the first line) and prints each as it comes,
    /// or, with `keep_last`, only that many last lines once all are read. Returns the last
    /// cursor.
    async fn pages(
        &mut self,
        filter: &OutputQuery,
        mut after: Option<i64>,
        keep_last: Option<usize>,
    ) -> Result<Option<i64>, ClientError> {
        let mut kept: VecDeque<OutputEntry> = VecDeque::new();
        loop {
            let query = OutputQuery {
                limit: Some(PAGE_LINES),
                after,
                ..filter.clone()
            };
            let page = self.client.read_output(self.id, &query).await?;
            after = page.next_cursor.or(after);
            match keep_last {
                None => self.print(&page.lines).await,
                Some(n) => {
                    for line in page.lines {
                        if kept.len() == n {
                            kept.pop_front();
                        }
                        kept.push_back(line);
                    }
                }
            }
            if !page.more {
                self.print(&Vec::from(kept)).await;
                return Ok(after);
            }
        }
    }

    /// Prints the last `n` lines; returns the cursor of the last one. Up to the server's tail
    /// bound it asks for them at once; past it, it reads every page and keeps the last `n`.
    async fn tail(&mut self, filter: &OutputQuery, n: u32) -> Result<Option<i64>, ClientError> {
        if i64::from(n) > MAX_OUTPUT_TAIL {
            return self.pages(filter, None, Some(n as usize)).await;
        }
        let query = OutputQuery {
            tail: Some(i64::from(n)),
            ..filter.clone()
        };
        let page = self.client.read_output(self.id, &query).await?;
        self.print(&page.lines).await;
        Ok(page.lines.last().map(|l| l.cursor).or(page.next_cursor))
    }

    /// Prints `lines`, one flush per batch; a closed pipe ends the process quietly.
    async fn print(&mut self, lines: &[OutputEntry]) {
        let mut out = String::new();
        for l in lines {
            if !self.json
                && let Some(attempt) = l.attempt
                && self.last_attempt != Some(attempt)
                && (self.last_attempt.is_some() || attempt > 1)
            {
                out.push_str(&self.boundary(attempt).await);
                out.push('\n');
            }
            if l.attempt.is_some() {
                self.last_attempt = l.attempt;
            }
            if self.json {
                out.push_str(&serde_json::to_string(l).expect("an output line serializes"));
                out.push('\n');
                continue;
            }
            if self.timestamps {
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
        if !out.is_empty() {
            crate::stdout::write_all(out.as_bytes());
        }
    }

    /// The line that opens `attempt`: which it is and how the attempt before it ended (read from
    /// the order's attempts; only the number when they cannot be read).
    async fn boundary(&self, attempt: i32) -> String {
        let before = match attempts_of(self.client, self.id).await {
            Ok((attempts, _)) => usize::try_from(attempt - 2)
                .ok()
                .and_then(|i| attempts.get(i))
                .map(|a| {
                    let how = a.result.as_str();
                    match a.message.as_deref().filter(|m| !m.trim().is_empty()) {
                        Some(m) => {
                            format!(" (attempt {} {how}: {})", attempt - 1, one_line(m, 120))
                        }
                        None => format!(" (attempt {} {how})", attempt - 1),
                    }
                }),
            Err(_) => None,
        };
        format!("--- attempt {attempt}{} ---", before.unwrap_or_default())
    }
}

/// One follow request: prints lines until the stream ends (`Ok`) or is cut (a transport error,
/// transient). `after` tracks the last line printed; `reached` is set once the server answers.
async fn follow_once(
    printer: &mut Printer<'_>,
    query: &OutputQuery,
    after: &mut Option<i64>,
    reached: &mut bool,
) -> Result<(), ClientError> {
    let answer = printer.client.follow_output(printer.id, query).await;
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
        printer.print(&lines).await;
        if let Some(last) = lines.last() {
            *after = Some(last.cursor);
        }
    }
}
