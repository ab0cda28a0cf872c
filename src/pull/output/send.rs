//! The sender task of one claim's output (docs/design.md §9): takes numbered chunks from the
//! buffer that [`super::OutputHandle`] fills, and delivers each with its `seq` until the server
//! stores it, refuses it (a gap, reported with the next chunk) or the claim ends.

use std::sync::Arc;

use uuid::Uuid;

use super::{Buffer, CHUNK_BUDGET_BYTES, CHUNK_TIMEOUT, SEND_INTERVAL, ServerState, Shared, cost};
use crate::client::{Client, ClientError};
use crate::pull::connect::{Backoff, MAX_BACKOFF};
use crate::wire::{DroppedReason, OutputChunk, OutputLine};

/// Takes the next chunk's lines (at most `budget` bytes as JSON, at least one line), the bytes
/// dropped before them and why they were dropped.
pub(super) fn take_chunk(
    b: &mut Buffer,
    budget: usize,
) -> (Vec<OutputLine>, u64, Option<ServerState>) {
    let mut lines = Vec::new();
    let mut size = 0;
    while let Some(front) = b.lines.front() {
        let c = cost(front);
        if !lines.is_empty() && size + c > budget {
            break;
        }
        size += c;
        b.bytes -= c;
        b.held -= front.text.len();
        lines.push(b.lines.pop_front().expect("front exists"));
    }
    (
        lines,
        std::mem::take(&mut b.dropped),
        b.dropped_while.take(),
    )
}

/// The sender task: take the next chunk from the buffer ([`next_chunk`]), deliver it with its
/// `seq` until the server answers ([`deliver`]), then pause unless a full chunk waits.
pub(super) async fn send_loop(
    client: Client,
    agent_id: Uuid,
    order_id: Uuid,
    claim_id: Uuid,
    first_seq: i64,
    shared: Arc<Shared>,
) {
    let mut sending = Sending {
        agent_id,
        claim_id,
        seq: first_seq,
        lost: 0,
        budget: CHUNK_BUDGET_BYTES,
    };
    loop {
        let taken = match next_chunk(&shared, &sending) {
            Next::End => return,
            Next::Wait => {
                // Wait for a full chunk, the end, or the interval, whichever comes first.
                let _ = tokio::time::timeout(SEND_INTERVAL, shared.wake.notified()).await;
                continue;
            }
            Next::Chunk(taken) => taken,
        };
        let chunk = &taken.chunk;
        match deliver(&client, order_id, chunk, &shared).await {
            Delivered::Yes => {
                sending.lost = 0;
                sending.seq += 1;
                shared.buffer().delivered += 1;
            }
            Delivered::Refused(ClientError::Api { status, .. })
                if status == reqwest::StatusCode::PAYLOAD_TOO_LARGE && chunk.lines.len() > 1 =>
            {
                sending.budget = (taken.size / 2).max(1);
                tracing::warn!(
                    seq = sending.seq,
                    budget = sending.budget,
                    "output chunk too large for the server; sending it in smaller chunks"
                );
                shared
                    .buffer()
                    .put_back(taken.chunk.lines, taken.from_buffer, taken.dropped_while);
                continue;
            }
            Delivered::Refused(why) => {
                let dropped = chunk.dropped_bytes.unwrap_or(0) as u64;
                sending.lost =
                    dropped + chunk.lines.iter().map(|l| l.text.len() as u64).sum::<u64>();
                tracing::error!(
                    seq = sending.seq,
                    lost_bytes = sending.lost,
                    "output chunk refused: {why}"
                );
            }
            Delivered::Stop(why) => {
                tracing::info!("output: {why}; sending no more for this claim");
                shared.stop();
                return;
            }
        }
        let (bytes, closed) = {
            let b = shared.buffer();
            (b.bytes, b.closed)
        };
        if !closed && bytes < CHUNK_BUDGET_BYTES {
            let _ = tokio::time::timeout(SEND_INTERVAL, shared.wake.notified()).await;
        }
    }
}

/// What the sender keeps from one chunk to the next.
struct Sending {
    agent_id: Uuid,
    claim_id: Uuid,
    /// The next chunk's sequence number: a chunk keeps its `seq` through every retry.
    seq: i64,
    /// Bytes of chunks the server refused as malformed or too large: reported with the next one.
    lost: u64,
    /// Halved at each `413` for a chunk of several lines: the server takes less than we thought.
    budget: usize,
}

/// The sender's next step.
enum Next {
    /// Nothing to send, and no more will come.
    End,
    /// Nothing to send yet.
    Wait,
    Chunk(Taken),
}

/// A chunk taken from the buffer, with what putting it back needs.
struct Taken {
    chunk: OutputChunk,
    /// Of the chunk's `dropped_bytes`, those dropped from the buffer (not `Sending::lost`).
    from_buffer: u64,
    /// Why the buffer dropped them (the server's state then).
    dropped_while: Option<ServerState>,
    /// Its lines' size as the budget counts it.
    size: usize,
}

/// Takes the next chunk within the budget, with the bytes dropped before it and their cause
/// (docs/design.md §9: a gap is marked, never hidden); frees room for the producers.
fn next_chunk(shared: &Shared, sending: &Sending) -> Next {
    let (lines, from_buffer, dropped_while, closed) = {
        let mut b = shared.buffer();
        let (lines, dropped, dropped_while) = take_chunk(&mut b, sending.budget);
        (lines, dropped, dropped_while, b.closed)
    };
    shared.room.notify_waiters();
    let dropped = from_buffer + sending.lost;
    if lines.is_empty() && dropped == 0 {
        return if closed { Next::End } else { Next::Wait };
    }
    if let Some(state) = dropped_while {
        tracing::warn!(
            seq = sending.seq,
            dropped_bytes = dropped,
            "output lines dropped while {state}; marked as a gap"
        );
    }
    // The cause of the bytes dropped last; a refused chunk is reported as such.
    let reason = match dropped_while {
        _ if sending.lost > 0 => DroppedReason::ChunkRefused,
        Some(ServerState::Refusing(429)) => DroppedReason::ServerBusy,
        Some(ServerState::Refusing(_)) => DroppedReason::ServerUnavailable,
        _ => DroppedReason::ServerUnreachable,
    };
    let size = lines.iter().map(cost).sum();
    Next::Chunk(Taken {
        chunk: OutputChunk {
            agent_id: sending.agent_id,
            claim_id: sending.claim_id,
            seq: sending.seq,
            dropped_bytes: (dropped > 0).then_some(dropped as i64),
            dropped_reason: (dropped > 0).then_some(reason),
            lines,
        },
        from_buffer,
        dropped_while,
        size,
    })
}

enum Delivered {
    Yes,
    /// This chunk cannot be stored (400, 413): counted as a gap, the next one goes on.
    Refused(ClientError),
    /// The claim is not live or the token is refused: stop sending.
    Stop(String),
}

/// Sends one chunk until it is stored, retrying with the same `seq`; records each answer in
/// `shared`'s [`ServerState`].
async fn deliver(
    client: &Client,
    order_id: Uuid,
    chunk: &OutputChunk,
    shared: &Shared,
) -> Delivered {
    let mut backoff = Backoff::default();
    loop {
        let answer = match tokio::time::timeout(CHUNK_TIMEOUT, client.send_output(order_id, chunk))
            .await
        {
            Ok(a) => a,
            Err(_) => {
                shared.server_is(ServerState::Away);
                let wait = backoff.failed();
                tracing::warn!(seq = chunk.seq, retry_in = ?wait, "output chunk timed out; sending it again");
                tokio::time::sleep(wait).await;
                continue;
            }
        };
        match answer {
            Ok(_) => {
                shared.server_is(ServerState::Accepting);
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
                shared.server_is(match &e {
                    ClientError::Api { status, .. } if matches!(status.as_u16(), 429 | 503) => {
                        ServerState::Refusing(status.as_u16())
                    }
                    _ => ServerState::Away,
                });
                let fallback = backoff.failed();
                let wait = e.retry_after().unwrap_or(fallback).min(MAX_BACKOFF);
                if backoff.failures() == 1 || backoff.failures().is_multiple_of(10) {
                    tracing::warn!(seq = chunk.seq, error = %e, retry_in = ?wait, "output not delivered; keeping it and retrying");
                }
                tokio::time::sleep(wait).await;
            }
            Err(e) => {
                shared.server_is(ServerState::Accepting);
                return Delivered::Refused(e);
            }
        }
    }
}
