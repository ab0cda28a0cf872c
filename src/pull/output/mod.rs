//! Sending an order's output to the server while it runs (docs/design.md §9), shared by the worker
//! (its command's stdout and stderr) and the executor (the logs of its pods' containers).
//!
//! The producer side ([`OutputHandle::push`]) appends to a bounded buffer. One task per order
//! sends the buffer in numbered chunks (`seq` 0, 1, 2, … per claim) at least once a second while
//! there is output, each at most [`CHUNK_BUDGET_BYTES`] of text. A chunk that failed (timeout,
//! 5xx, 429) is sent again with the same `seq` after `Retry-After` or the capped backoff, so the
//! server stores it once. `409` (the claim is no longer live) and `401`/`403` stop sending for
//! good. [`OutputSender::finish`] flushes what is left before the order is completed, for as
//! long as the server takes chunks.
//!
//! The buffer holds at most `buffer_bytes` of text. When it is full the producer's next line
//! depends on the server, as the sender last saw it ([`ServerState`]):
//!
//! | server                         | a line that does not fit                                      |
//! |--------------------------------|---------------------------------------------------------------|
//! | accepting (chunks stored)      | waits until the sender has taken a chunk (back-pressure: the  |
//! |                                | command blocks on its pipe, as on a slow terminal)            |
//! | away (no answer, 5xx)          | goes in; the oldest lines are dropped and counted             |
//! | refusing (`429`, `503`)        | goes in; the oldest lines are dropped and counted             |
//!
//! Dropped bytes go out as `dropped_bytes` with the next chunk, a gap marker that names the cause
//! (never a silent loss), and the agent's log says when it starts and stops dropping.
//!
//! Redaction happens before a line enters the buffer ([`Redactor`], [`super::redact`]): the
//! agent's own token and the values it is told to hide become `[REDACTED]`.

use std::collections::VecDeque;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use uuid::Uuid;

pub use super::redact::{REDACTED, Redactor};
use crate::client::Client;
use crate::wire::OutputLine;

mod send;
use send::send_loop;

/// Text bytes in one chunk, leaving room under the server's 1 MiB body limit (docs/design.md §9) for
/// the JSON around each line (see [`LINE_OVERHEAD_BYTES`]).
pub const CHUNK_BUDGET_BYTES: usize = 768 * 1024;
/// Bytes counted per line on top of its text and stream name (as JSON strings, escapes counted)
/// when a chunk is formed: the JSON keys, quotes and the timestamp.
pub const LINE_OVERHEAD_BYTES: usize = 64;
/// Default bound of the output text held (`--output-buffer-bytes`), bytes.
pub const DEFAULT_BUFFER_BYTES: usize = 8 << 20;
/// Longest line sent as one; longer lines are sent in pieces of this many bytes.
pub const MAX_LINE_BYTES: usize = crate::queue::limits::MAX_OUTPUT_LINE_BYTES;
/// How often buffered output goes out while there is some (docs/design.md §9: at least once a second).
pub const SEND_INTERVAL: Duration = Duration::from_secs(1);
/// How long the order's completion waits for the last lines while no chunk is delivered.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// A chunk not answered within this long is sent again (same `seq`).
pub const CHUNK_TIMEOUT: Duration = Duration::from_secs(15);

/// What every order's sender needs: where to send and how much to hold.
#[derive(Clone)]
pub struct OutputConfig {
    pub client: Client,
    pub agent_id: Uuid,
    /// Most bytes of output text held (at least [`CHUNK_BUDGET_BYTES`]). Past it a producer
    /// waits while the server accepts chunks; while it is away or refusing the oldest lines
    /// are dropped and reported as a gap.
    pub buffer_bytes: usize,
    pub redactor: Redactor,
}

/// How the server answered output, as the sender last saw it: what a full buffer does (see the
/// module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerState {
    /// The last chunk was stored (also before the first one is sent).
    Accepting,
    /// The last attempt got no answer: connection refused or broken, timeout, or a 5xx other
    /// than 503.
    Away,
    /// The server answered `429` or `503` (it is behind, or stopping).
    Refusing(u16),
}

impl std::fmt::Display for ServerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServerState::Accepting => f.write_str("the server accepts output"),
            ServerState::Away => f.write_str("the server is unreachable"),
            ServerState::Refusing(status) => write!(f, "the server refuses output with {status}"),
        }
    }
}

struct Buffer {
    lines: VecDeque<OutputLine>,
    /// Text bytes of `lines`, counted against the bound.
    held: usize,
    /// `lines` as counted for chunks: text, stream and [`LINE_OVERHEAD_BYTES`] per line.
    bytes: usize,
    /// Text bytes dropped since the last chunk was formed.
    dropped: u64,
    /// Why the oldest lines were last dropped, while `dropped` is not 0.
    dropped_while: Option<ServerState>,
    server: ServerState,
    /// Chunks stored so far (progress, for [`OutputSender::finish`]).
    delivered: u64,
    /// No more lines will come: send what is left, then end.
    closed: bool,
    /// The server refused the claim (409) or the token, or the sender is gone: lines are
    /// thrown away.
    stopped: bool,
}

impl Default for Buffer {
    fn default() -> Self {
        Buffer {
            lines: VecDeque::new(),
            held: 0,
            bytes: 0,
            dropped: 0,
            dropped_while: None,
            server: ServerState::Accepting,
            delivered: 0,
            closed: false,
            stopped: false,
        }
    }
}

impl Buffer {
    /// Puts a chunk the server refused as too large back in front, with the bytes dropped before
    /// it, to be sent again in smaller chunks.
    fn put_back(&mut self, lines: Vec<OutputLine>, dropped: u64, why: Option<ServerState>) {
        for line in lines.into_iter().rev() {
            self.held += line.text.len();
            self.bytes += cost(&line);
            self.lines.push_front(line);
        }
        self.dropped += dropped;
        self.dropped_while = self.dropped_while.or(why);
    }

    /// Appends `line`, dropping the oldest lines past `limit` text bytes (counted, with the
    /// server's state as the cause).
    fn push_dropping(&mut self, line: OutputLine, limit: usize) {
        self.held += line.text.len();
        self.bytes += cost(&line);
        self.lines.push_back(line);
        while self.held > limit
            && self.lines.len() > 1
            && let Some(old) = self.lines.pop_front()
        {
            self.held -= old.text.len();
            self.bytes -= cost(&old);
            if self.dropped == 0 {
                tracing::warn!(
                    "output buffer full while {}: dropping the oldest lines; a gap marker \
                     will say how many bytes",
                    self.server
                );
            }
            self.dropped += old.text.len() as u64;
            self.dropped_while = Some(self.server);
        }
    }
}

struct Shared {
    buffer: Mutex<Buffer>,
    /// Wakes the sender: a full chunk is waiting, or the output ended.
    wake: Notify,
    /// Wakes waiting producers: room was made, the server stopped accepting, or sending ended.
    room: Notify,
    limit: usize,
    redactor: Redactor,
}

impl Shared {
    fn buffer(&self) -> std::sync::MutexGuard<'_, Buffer> {
        self.buffer.lock().expect("output buffer lock")
    }

    /// Records how the server answered; producers waiting for room re-check.
    fn server_is(&self, state: ServerState) {
        let mut b = self.buffer();
        if b.server == state {
            return;
        }
        if state == ServerState::Accepting && b.dropped_while.is_some() {
            tracing::info!(
                "output accepted again; the lines dropped meanwhile are marked as a gap"
            );
        }
        b.server = state;
        drop(b);
        self.room.notify_waiters();
    }

    /// The end-of-order flush ran out: the lines still held become dropped bytes (a gap with
    /// the cause the server last gave), so what is sent next is only their marker.
    fn give_up_lines(&self) {
        let mut b = self.buffer();
        if !b.lines.is_empty() {
            // Each line's text and its line ending, so blank lines (`yes ''`) count too.
            let given_up = (b.held + b.lines.len()) as u64;
            b.lines.clear();
            b.held = 0;
            b.bytes = 0;
            b.dropped += given_up;
            b.dropped_while = Some(b.server);
        }
    }

    /// Nothing more is sent: waiting producers return and later lines are thrown away.
    fn stop(&self) {
        let mut b = self.buffer();
        b.stopped = true;
        b.lines.clear();
        b.held = 0;
        b.bytes = 0;
        drop(b);
        self.room.notify_waiters();
    }
}

/// What `line` adds to a chunk's body: its text and stream as JSON strings (escapes counted:
/// `\u001b` is 6 bytes for 1, so colour codes grow a line up to 6 ×), and the rest of the line's
/// JSON ([`LINE_OVERHEAD_BYTES`]).
fn cost(line: &OutputLine) -> usize {
    json_len(&line.text) + json_len(&line.stream) + LINE_OVERHEAD_BYTES
}

/// Bytes of `text` as a JSON string's contents, escaped as `serde_json` writes it.
fn json_len(text: &str) -> usize {
    text.bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..0x20 => 6,
            _ => 1,
        })
        .sum()
}

/// Appends lines to an order's output; cheap to clone.
#[derive(Clone)]
pub struct OutputHandle {
    shared: Arc<Shared>,
}

impl OutputHandle {
    /// Adds one line (without its line ending), redacted, read at `at`. Waits while the buffer
    /// is full and the server accepts chunks; otherwise never waits (see the module
    /// documentation).
    pub async fn push(&self, stream: &str, text: &str, at: DateTime<Utc>) {
        let text = self.shared.redactor.redact(text);
        self.push_redacted(stream, text, at).await;
    }

    /// Adds a line already passed through [`Redactor`] (see [`OutputHandle::redactor`]), as
    /// [`OutputHandle::push`].
    pub async fn push_redacted(&self, stream: &str, text: String, at: DateTime<Utc>) {
        let line = OutputLine {
            stream: stream.to_string(),
            text,
            at,
        };
        let wake = loop {
            let mut room = pin!(self.shared.room.notified());
            {
                let mut b = self.shared.buffer();
                if b.stopped || b.closed {
                    return;
                }
                let fits = b.held + line.text.len() <= self.shared.limit || b.lines.is_empty();
                if fits || b.server != ServerState::Accepting {
                    b.push_dropping(line, self.shared.limit);
                    break b.bytes >= CHUNK_BUDGET_BYTES;
                }
                // Full while the server takes chunks: wait for the sender (back-pressure).
                room.as_mut().enable();
            }
            self.shared.wake.notify_one();
            room.await;
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
        // An abandoned order: nothing more is sent for a claim that is no longer ours, and no
        // producer waits for a sender that is gone.
        if let Some(t) = self.task.take() {
            t.abort();
        }
        self.handle.shared.stop();
    }
}

impl OutputSender {
    /// Starts sending the output of `order_id` under `claim_id`, chunks numbered from
    /// `first_seq` (0 for a new claim).
    pub fn start(config: &OutputConfig, order_id: Uuid, claim_id: Uuid, first_seq: i64) -> Self {
        let shared = Arc::new(Shared {
            buffer: Mutex::new(Buffer::default()),
            wake: Notify::new(),
            room: Notify::new(),
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

    /// No more lines: sends what is buffered, for as long as chunks are delivered. After
    /// `within` without one it gives the lines still held up: they become one gap (their bytes,
    /// with the cause the server last gave), sent for another `within`, so the finished order's
    /// output says where it is incomplete (docs/design.md §9). Then the order is completed anyway
    /// and what was not delivered is logged. Returns whether every line was delivered (or the
    /// server had refused the claim, so nothing more could be).
    pub async fn finish(mut self, within: Duration) -> bool {
        let mut delivered = {
            let mut b = self.handle.shared.buffer();
            b.closed = true;
            b.delivered
        };
        self.handle.shared.wake.notify_one();
        let Some(mut task) = self.task.take() else {
            return true;
        };
        loop {
            if tokio::time::timeout(within, &mut task).await.is_ok() {
                return true;
            }
            let (now_delivered, unsent_lines, unsent_bytes, server) = {
                let b = self.handle.shared.buffer();
                (b.delivered, b.lines.len(), b.held, b.server)
            };
            if now_delivered > delivered {
                delivered = now_delivered;
                continue;
            }
            tracing::warn!(
                unsent_lines,
                unsent_bytes,
                waited = ?within,
                "output not all delivered ({server}); sending it as a gap, then completing the \
                 order anyway"
            );
            self.handle.shared.give_up_lines();
            self.handle.shared.wake.notify_one();
            if tokio::time::timeout(within, &mut task).await.is_err() {
                task.abort();
                tracing::warn!(
                    "the gap could not be delivered either: the order's output ends without saying \
                     what is missing"
                );
            }
            return false;
        }
    }
}

#[cfg(test)]
mod tests;
