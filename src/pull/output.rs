//! Sending an order's output to the server while it runs (docs/design.md §9), shared by the worker
//! (its command's stdout and stderr) and the executor (the logs of its pods' containers).
//!
//! The producer side ([`OutputHandle::push`]) never waits on the network: it appends to a bounded
//! buffer and returns, so a command's pipes are always drained. One task per order sends the
//! buffer in numbered chunks (`seq` 0, 1, 2, … per claim) at least once a second while there is
//! output, each at most [`CHUNK_BUDGET_BYTES`] of text. A chunk that failed (timeout, 5xx, 429)
//! is sent again with the same `seq` after `Retry-After` or the capped backoff, so the server
//! stores it once. While the server is away the buffer holds at most `buffer_bytes`; past it the
//! oldest lines are dropped and their byte count goes out as `dropped_bytes` with the next chunk
//! (a gap marker, never a silent loss). `409` (the claim is no longer live) and `401`/`403` stop
//! sending for good. [`OutputSender::finish`] flushes what is left within a bound before the
//! order is completed.
//!
//! Redaction happens before a line enters the buffer ([`Redactor`]): the agent's own token and
//! the values it is told to hide become `[REDACTED]`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use uuid::Uuid;

use super::connect::{Backoff, MAX_BACKOFF};
use crate::client::{Client, ClientError};
use crate::wire::{OutputChunk, OutputLine};

/// Text bytes in one chunk, leaving room under the server's 1 MiB body limit (docs/design.md §9) for
/// the JSON around each line (see [`LINE_OVERHEAD_BYTES`]).
pub const CHUNK_BUDGET_BYTES: usize = 768 * 1024;
/// Bytes counted per line on top of its text and stream name: the JSON keys, quotes and the
/// timestamp. Escapes can make a line's JSON up to 6 × its text (`\u0001`); the budget's margin
/// covers ordinary text, and a `413` is logged and counted as a gap.
pub const LINE_OVERHEAD_BYTES: usize = 64;
/// Default bound of what is held while the server is away (`--output-buffer-bytes`), bytes.
pub const DEFAULT_BUFFER_BYTES: usize = 8 << 20;
/// Longest line sent as one; longer lines are sent in pieces of this many bytes.
pub const MAX_LINE_BYTES: usize = 64 * 1024;
/// How often buffered output goes out while there is some (docs/design.md §9: at least once a second).
pub const SEND_INTERVAL: Duration = Duration::from_secs(1);
/// How long the order's completion waits for the last lines to be delivered.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// A chunk not answered within this long is sent again (same `seq`).
pub const CHUNK_TIMEOUT: Duration = Duration::from_secs(15);
/// What a hidden value is replaced with.
pub const REDACTED: &str = "[REDACTED]";

/// Replaces secret values with [`REDACTED`] in output before it leaves the agent.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    /// Longest first, so a secret containing another is replaced whole.
    secrets: Arc<Vec<Vec<u8>>>,
}

impl Redactor {
    /// Hides each of `values`; empty and all-whitespace values are ignored (they would hide every
    /// line's spaces, or everything).
    pub fn new(values: impl IntoIterator<Item = String>) -> Self {
        let mut secrets: Vec<Vec<u8>> = values
            .into_iter()
            .filter(|v| !v.trim().is_empty())
            .map(String::into_bytes)
            .collect();
        secrets.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
        secrets.dedup();
        Redactor {
            secrets: Arc::new(secrets),
        }
    }

    /// Whether there is nothing to hide.
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// Redacts `buf`. With `complete` (a whole line, or the end of the stream) everything is
    /// consumed. Otherwise `buf` is a piece of a longer line: a tail that may be the start of a
    /// secret (or of a UTF-8 character) is left over, and the answer says how many bytes were
    /// consumed; the caller puts the rest in front of the next piece, so a secret split across
    /// two reads is still hidden. The leftover is shorter than the longest secret plus 4 bytes.
    pub fn redact_bytes(&self, buf: &[u8], complete: bool) -> (Vec<u8>, usize) {
        let mut out = Vec::with_capacity(buf.len());
        let mut i = 0;
        'scan: while i < buf.len() {
            let rest = &buf[i..];
            for s in self.secrets.iter() {
                if rest.starts_with(s) {
                    out.extend_from_slice(REDACTED.as_bytes());
                    i += s.len();
                    continue 'scan;
                }
            }
            if !complete && self.secrets.iter().any(|s| s.starts_with(rest)) {
                break;
            }
            out.push(buf[i]);
            i += 1;
        }
        if !complete {
            // Do not cut a UTF-8 character in two: keep its first bytes for the next piece.
            if let Err(e) = std::str::from_utf8(&out)
                && e.error_len().is_none()
            {
                let cut = out.len() - e.valid_up_to();
                out.truncate(e.valid_up_to());
                i -= cut;
            }
        }
        (out, i)
    }

    /// Redacts one whole line.
    pub fn redact(&self, line: &str) -> String {
        if self.is_empty() {
            return line.to_string();
        }
        String::from_utf8_lossy(&self.redact_bytes(line.as_bytes(), true).0).into_owned()
    }
}

/// What every order's sender needs: where to send and how much to hold.
#[derive(Clone)]
pub struct OutputConfig {
    pub client: Client,
    pub agent_id: Uuid,
    /// Most bytes of text held while the server is away; past it the oldest lines are dropped
    /// and reported as a gap.
    pub buffer_bytes: usize,
    pub redactor: Redactor,
}

#[derive(Default)]
struct Buffer {
    lines: VecDeque<OutputLine>,
    /// Bytes counted against the bound: text, stream and [`LINE_OVERHEAD_BYTES`] per line.
    bytes: usize,
    /// Text bytes dropped since the last chunk was formed.
    dropped: u64,
    /// No more lines will come: send what is left, then end.
    closed: bool,
    /// The server refused the claim (409) or the token: lines are thrown away.
    stopped: bool,
}

struct Shared {
    buffer: Mutex<Buffer>,
    wake: Notify,
    limit: usize,
    redactor: Redactor,
}

fn cost(line: &OutputLine) -> usize {
    line.text.len() + line.stream.len() + LINE_OVERHEAD_BYTES
}

/// Appends lines to an order's output; cheap to clone, never waits.
#[derive(Clone)]
pub struct OutputHandle {
    shared: Arc<Shared>,
}

impl OutputHandle {
    /// Adds one line (without its line ending), redacted, read at `at`. Never waits: past the
    /// buffer's bound the oldest lines are dropped and counted.
    pub fn push(&self, stream: &str, text: &str, at: DateTime<Utc>) {
        let text = self.shared.redactor.redact(text);
        self.push_redacted(stream, text, at);
    }

    /// Adds a line already passed through [`Redactor`] (see [`OutputHandle::redactor`]).
    pub fn push_redacted(&self, stream: &str, text: String, at: DateTime<Utc>) {
        let line = OutputLine {
            stream: stream.to_string(),
            text,
            at,
        };
        let wake = {
            let mut b = self.shared.buffer.lock().expect("output buffer lock");
            if b.stopped || b.closed {
                return;
            }
            b.bytes += cost(&line);
            b.lines.push_back(line);
            while b.bytes > self.shared.limit
                && let Some(old) = b.lines.pop_front()
            {
                b.bytes -= cost(&old);
                b.dropped += old.text.len() as u64;
            }
            b.bytes >= CHUNK_BUDGET_BYTES
        };
        if wake {
            self.shared.wake.notify_one();
        }
    }

    /// The redactor this handle applies, for producers that read in pieces.
    pub fn redactor(&self) -> &Redactor {
        &self.shared.redactor
    }
}

/// The sending task of one claim's output.
pub struct OutputSender {
    handle: OutputHandle,
    task: Option<JoinHandle<()>>,
}

impl Drop for OutputSender {
    fn drop(&mut self) {
        // An abandoned order: nothing more is sent for a claim that is no longer ours.
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

impl OutputSender {
    /// Starts sending the output of `order_id` under `claim_id`, chunks numbered from
    /// `first_seq` (0 for a new claim).
    pub fn start(config: &OutputConfig, order_id: Uuid, claim_id: Uuid, first_seq: i64) -> Self {
        let shared = Arc::new(Shared {
            buffer: Mutex::new(Buffer::default()),
            wake: Notify::new(),
            limit: config.buffer_bytes.max(CHUNK_BUDGET_BYTES),
            redactor: config.redactor.clone(),
        });
        let task = tokio::spawn(send_loop(
            config.client.clone(),
            config.agent_id,
            order_id,
            claim_id,
            first_seq,
            shared.clone(),
        ));
        OutputSender {
            handle: OutputHandle { shared },
            task: Some(task),
        }
    }

    /// A handle to push lines with.
    pub fn handle(&self) -> OutputHandle {
        self.handle.clone()
    }

    /// No more lines: sends what is buffered and waits for it at most `within`. Past that the
    /// order is completed anyway and what was not delivered is logged. Returns whether
    /// everything was delivered (or the server had refused the claim, so nothing more could be).
    pub async fn finish(mut self, within: Duration) -> bool {
        {
            let mut b = self
                .handle
                .shared
                .buffer
                .lock()
                .expect("output buffer lock");
            b.closed = true;
        }
        self.handle.shared.wake.notify_one();
        let Some(mut task) = self.task.take() else {
            return true;
        };
        match tokio::time::timeout(within, &mut task).await {
            Ok(_) => true,
            Err(_) => {
                task.abort();
                let b = self
                    .handle
                    .shared
                    .buffer
                    .lock()
                    .expect("output buffer lock");
                tracing::warn!(
                    unsent_lines = b.lines.len(),
                    unsent_bytes = b.bytes,
                    waited = ?within,
                    "output not all delivered; completing the order anyway"
                );
                false
            }
        }
    }
}

/// Takes the next chunk's lines (at most [`CHUNK_BUDGET_BYTES`], at least one line) and the
/// bytes dropped before them.
fn take_chunk(b: &mut Buffer) -> (Vec<OutputLine>, u64) {
    let mut lines = Vec::new();
    let mut size = 0;
    while let Some(front) = b.lines.front() {
        let c = cost(front);
        if !lines.is_empty() && size + c > CHUNK_BUDGET_BYTES {
            break;
        }
        size += c;
        b.bytes -= c;
        lines.push(b.lines.pop_front().expect("front exists"));
    }
    (lines, std::mem::take(&mut b.dropped))
}

async fn send_loop(
    client: Client,
    agent_id: Uuid,
    order_id: Uuid,
    claim_id: Uuid,
    first_seq: i64,
    shared: Arc<Shared>,
) {
    let mut seq = first_seq;
    // Bytes of chunks the server refused as malformed or too large: reported with the next one.
    let mut lost: u64 = 0;
    loop {
        let (lines, dropped, closed) = {
            let mut b = shared.buffer.lock().expect("output buffer lock");
            let (lines, dropped) = take_chunk(&mut b);
            (lines, dropped, b.closed)
        };
        let dropped = dropped + lost;
        if lines.is_empty() && dropped == 0 {
            if closed {
                return;
            }
            // Wait for a full chunk, the end, or the interval, whichever comes first.
            let _ = tokio::time::timeout(SEND_INTERVAL, shared.wake.notified()).await;
            continue;
        }
        let text_bytes: u64 = lines.iter().map(|l| l.text.len() as u64).sum();
        let chunk = OutputChunk {
            agent_id,
            claim_id,
            seq,
            dropped_bytes: (dropped > 0).then_some(dropped as i64),
            lines,
        };
        match deliver(&client, order_id, &chunk).await {
            Delivered::Yes => {
                lost = 0;
                seq += 1;
            }
            Delivered::Refused(why) => {
                lost = dropped + text_bytes;
                tracing::error!(seq, lost_bytes = lost, "output chunk refused: {why}");
            }
            Delivered::Stop(why) => {
                tracing::info!("output: {why}; sending no more for this claim");
                let mut b = shared.buffer.lock().expect("output buffer lock");
                b.stopped = true;
                b.lines.clear();
                b.bytes = 0;
                return;
            }
        }
        let (bytes, closed) = {
            let b = shared.buffer.lock().expect("output buffer lock");
            (b.bytes, b.closed)
        };
        if !closed && bytes < CHUNK_BUDGET_BYTES {
            let _ = tokio::time::timeout(SEND_INTERVAL, shared.wake.notified()).await;
        }
    }
}

enum Delivered {
    Yes,
    /// This chunk cannot be stored (400, 413): counted as a gap, the next one goes on.
    Refused(ClientError),
    /// The claim is not live or the token is refused: stop sending.
    Stop(String),
}

/// Sends one chunk until it is stored, retrying with the same `seq`.
async fn deliver(client: &Client, order_id: Uuid, chunk: &OutputChunk) -> Delivered {
    let mut backoff = Backoff::default();
    loop {
        let answer = match tokio::time::timeout(CHUNK_TIMEOUT, client.send_output(order_id, chunk))
            .await
        {
            Ok(a) => a,
            Err(_) => {
                let wait = backoff.failed();
                tracing::warn!(seq = chunk.seq, retry_in = ?wait, "output chunk timed out; sending it again");
                tokio::time::sleep(wait).await;
                continue;
            }
        };
        match answer {
            Ok(_) => {
                if backoff.succeeded() > 0 {
                    tracing::info!(seq = chunk.seq, "output delivered again");
                }
                return Delivered::Yes;
            }
            Err(e) if e.is_conflict() => {
                return Delivered::Stop(format!("the claim is no longer live ({e})"));
            }
            Err(e) if e.is_unauthorized() => {
                return Delivered::Stop(format!("the token was refused ({e})"));
            }
            Err(e) if e.is_transient() || e.is_too_many_requests() => {
                let fallback = backoff.failed();
                let wait = e.retry_after().unwrap_or(fallback).min(MAX_BACKOFF);
                if backoff.failures() == 1 || backoff.failures().is_multiple_of(10) {
                    tracing::warn!(seq = chunk.seq, error = %e, retry_in = ?wait, "output not delivered; keeping it and retrying");
                }
                tokio::time::sleep(wait).await;
            }
            Err(e) => return Delivered::Refused(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn red(values: &[&str]) -> Redactor {
        Redactor::new(values.iter().map(|s| s.to_string()))
    }

    #[test]
    fn redacts_whole_lines_longest_first_and_ignores_empty_values() {
        let r = red(&["abc", "abcdef", "", "  "]);
        assert_eq!(r.redact("x abcdef y abc z"), "x [REDACTED] y [REDACTED] z");
        assert_eq!(r.redact("a  b"), "a  b");
        assert!(red(&["", " "]).is_empty());
    }

    #[test]
    fn a_secret_split_across_pieces_is_still_hidden() {
        let r = red(&["s3cr3t-token"]);
        let input = b"before s3cr3t-token after s3cr3t-token";
        // Feed the input in every possible piece size, carrying the leftover forward.
        for piece in 1..input.len() {
            let mut out = Vec::new();
            let mut carry: Vec<u8> = Vec::new();
            for part in input.chunks(piece) {
                carry.extend_from_slice(part);
                let (o, used) = r.redact_bytes(&carry, false);
                out.extend(o);
                carry.drain(..used);
            }
            let (o, _) = r.redact_bytes(&carry, true);
            out.extend(o);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                "before [REDACTED] after [REDACTED]",
                "piece size {piece}"
            );
        }
    }

    #[test]
    fn pieces_never_cut_a_utf8_character() {
        let r = Redactor::default();
        let text = "é".as_bytes();
        let (o, used) = r.redact_bytes(&text[..1], false);
        assert!(o.is_empty());
        assert_eq!(used, 0);
        let (o, used) = r.redact_bytes(text, false);
        assert_eq!((o.as_slice(), used), (text, 2));
    }

    #[test]
    fn the_buffer_drops_the_oldest_and_counts_them() {
        let shared = Arc::new(Shared {
            buffer: Mutex::new(Buffer::default()),
            wake: Notify::new(),
            limit: CHUNK_BUDGET_BYTES,
            redactor: Redactor::default(),
        });
        let h = OutputHandle { shared };
        let line = "x".repeat(1000);
        let n = 2 * CHUNK_BUDGET_BYTES / 1000;
        for _ in 0..n {
            h.push("stdout", &line, Utc::now());
        }
        let mut b = h.shared.buffer.lock().unwrap();
        assert!(b.bytes <= CHUNK_BUDGET_BYTES);
        let kept = b.lines.len();
        assert_eq!(b.dropped, ((n - kept) * 1000) as u64);
        let (lines, dropped) = take_chunk(&mut b);
        assert_eq!(lines.len(), kept);
        assert_eq!(dropped, ((n - kept) * 1000) as u64);
        assert_eq!((b.bytes, b.dropped), (0, 0));
    }
}
