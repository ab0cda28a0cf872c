//! Output of running orders (docs/design.md §9): the chunks the claim holder sends, stored once per
//! `(order, claim, seq)`, kept within a per-order cap, and read back line by line with a cursor.
//!
//! Storage is a row per chunk (`work_order_output`, its lines as parallel arrays) plus a row per
//! order (`work_order_output_totals`) that every writer of the order locks first: it serializes
//! the order's writers, so chunk ids (and with them the read cursor) grow in commit order and a
//! follower reading "after cursor c" never skips a chunk that commits late.
//!
//! A line's cursor is `chunk id × 65536 + index`: index 0 is the chunk's gap marker (when the
//! agent reported lost bytes), its lines are 1, 2, …; the marker of bytes dropped by the cap sits
//! just before the oldest chunk still stored.
//!
//! The output's wire shapes (the chunk an agent sends, a stored line, a page) are in `shapes`,
//! re-exported here and by `wire`.

mod shapes;

pub use shapes::{
    DroppedReason, OutputAccepted, OutputChunk, OutputEntry, OutputLine, OutputPage, OutputQuery,
};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{Queue, QueueError, sql};

/// Default per-order cap on stored output, in bytes as counted by [`NewChunk::bytes`] (docs/design.md
/// §9: 16 MiB).
pub const DEFAULT_OUTPUT_CAP_BYTES: u64 = super::limits::OUTPUT_CAP_BYTES_DEFAULT;
/// Bytes a stored line costs against the cap besides its text and stream: its time (8) and the
/// array headers of its text and stream (4 each). Counted so that `yes ''` cannot store many
/// times the cap in empty lines (docs/design.md §9).
pub const STORED_LINE_OVERHEAD_BYTES: i64 = 16;
/// Largest chunk body accepted, in bytes as sent (docs/design.md §9: 1 MiB; `413` above).
pub const MAX_CHUNK_BYTES: usize = super::limits::MAX_OUTPUT_CHUNK_BYTES;
/// Longest `stream` name, in characters (a Kubernetes pod name and container name fit).
pub const MAX_STREAM_CHARS: usize = 253;
/// Most lines in one chunk: the cursor keeps 16 bits for the index (0 is the gap marker).
pub const MAX_CHUNK_LINES: usize = 65_534;
/// `stream` of the lines the server writes itself (gap and dropped markers).
pub const MARKER_STREAM: &str = "pullman";

const INDEX_BITS: u32 = 16;

/// The cursor of line `index` of chunk `chunk` (see the module documentation).
pub fn cursor(chunk: i64, index: u32) -> i64 {
    (chunk << INDEX_BITS) | i64::from(index)
}

/// A chunk checked and made storable ([`prepare_chunk`]).
#[derive(Debug, Clone)]
pub struct NewChunk {
    pub agent_id: Uuid,
    pub claim_id: Uuid,
    pub seq: i64,
    pub gap_bytes: i64,
    /// Why the gap: a [`DroppedReason`] name, when the agent said.
    pub gap_reason: Option<&'static str>,
    pub streams: Vec<String>,
    pub texts: Vec<String>,
    pub ats: Vec<DateTime<Utc>>,
    /// What the lines cost against the cap: each line's text and stream (UTF-8 bytes) plus
    /// [`STORED_LINE_OVERHEAD_BYTES`].
    pub bytes: i64,
}

/// What storing a chunk did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// Lines of the chunk as stored.
    pub lines: i64,
    /// False when this `seq` was stored before (a resend, answered as the first time).
    pub new: bool,
    /// Bytes of older output the cap dropped while storing it.
    pub dropped_by_cap: i64,
}

/// Checks a chunk as received and makes it storable (docs/design.md §9): `seq` and `dropped_bytes`
/// not negative, at most [`MAX_CHUNK_LINES`] lines, each `stream` 1–[`MAX_STREAM_CHARS`]
/// characters. U+0000 in a stream or text is replaced by U+FFFD (PostgreSQL cannot store it;
/// never refused). Errors: `400 invalid_field` naming the field.
pub fn prepare_chunk(chunk: OutputChunk) -> Result<NewChunk, QueueError> {
    let invalid = |field: String, message: String| QueueError::Invalid { field, message };
    if chunk.seq < 0 {
        return Err(invalid(
            "seq".into(),
            format!("seq must be 0 or more, got {}", chunk.seq),
        ));
    }
    let gap_bytes = chunk.dropped_bytes.unwrap_or(0);
    if gap_bytes < 0 {
        return Err(invalid(
            "dropped_bytes".into(),
            format!("dropped_bytes must be 0 or more, got {gap_bytes}"),
        ));
    }
    if chunk.lines.len() > MAX_CHUNK_LINES {
        return Err(invalid(
            "lines".into(),
            format!(
                "lines holds {} lines; a chunk holds at most {MAX_CHUNK_LINES}",
                chunk.lines.len()
            ),
        ));
    }
    let n = chunk.lines.len();
    let (mut streams, mut texts, mut ats) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let mut bytes = 0i64;
    for (i, line) in chunk.lines.into_iter().enumerate() {
        let chars = line.stream.chars().count();
        if chars == 0 || chars > MAX_STREAM_CHARS {
            return Err(invalid(
                format!("lines[{i}].stream"),
                format!(
                    "lines[{i}].stream must be 1 to {MAX_STREAM_CHARS} characters, got {chars}"
                ),
            ));
        }
        let text = without_nul(line.text);
        let stream = without_nul(line.stream);
        bytes += (text.len() + stream.len()) as i64 + STORED_LINE_OVERHEAD_BYTES;
        streams.push(stream);
        texts.push(text);
        ats.push(line.at);
    }
    Ok(NewChunk {
        agent_id: chunk.agent_id,
        claim_id: chunk.claim_id,
        seq: chunk.seq,
        gap_bytes,
        gap_reason: chunk.dropped_reason.map(DroppedReason::as_str),
        streams,
        texts,
        ats,
        bytes,
    })
}

/// U+0000 replaced by U+FFFD, as invalid UTF-8 is: the line keeps its length and shows where.
fn without_nul(text: String) -> String {
    if text.contains('\0') {
        text.replace('\0', "\u{FFFD}")
    } else {
        text
    }
}

/// Whether an order exists, and what its readers need besides lines.
#[derive(Debug, Clone, Copy, sqlx::FromRow)]
pub struct OutputState {
    pub active: bool,
    pub finished: bool,
    /// Bytes the cap dropped so far.
    pub dropped_bytes: i64,
    /// The oldest chunk still stored.
    pub first_chunk: Option<i64>,
    /// When that chunk arrived, by the database's clock: the time of the `dropped` marker.
    pub first_received_at: Option<DateTime<Utc>>,
}

#[derive(sqlx::FromRow)]
struct ChunkRow {
    id: i64,
    claim_id: Uuid,
    seq: i64,
    attempt: i32,
    gap_bytes: i64,
    gap_reason: Option<String>,
    streams: Vec<String>,
    texts: Vec<String>,
    ats: Vec<DateTime<Utc>>,
    received_at: DateTime<Utc>,
}

impl ChunkRow {
    /// The chunk's lines, its gap marker first.
    fn into_entries(self) -> impl Iterator<Item = OutputEntry> {
        let (id, claim_id, seq, attempt) = (self.id, self.claim_id, self.seq, self.attempt);
        // The database's clock: the same at every read, whatever replica answers.
        let received_at = self.received_at;
        let gap = (self.gap_bytes > 0).then(|| OutputEntry {
            cursor: cursor(id, 0),
            claim_id: Some(claim_id),
            attempt: Some(attempt),
            seq: Some(seq),
            stream: MARKER_STREAM.into(),
            text: gap_text(self.gap_bytes, self.gap_reason.as_deref()),
            at: received_at,
            marker: Some("gap".into()),
        });
        let lines = self
            .streams
            .into_iter()
            .zip(self.texts)
            .zip(self.ats)
            .enumerate()
            .map(move |(i, ((stream, text), at))| OutputEntry {
                cursor: cursor(id, i as u32 + 1),
                claim_id: Some(claim_id),
                attempt: Some(attempt),
                seq: Some(seq),
                stream,
                text,
                at,
                marker: None,
            });
        gap.into_iter().chain(lines)
    }
}

/// Chunks fetched per round trip while reading: bounds a reader's memory to a few chunks of at
/// most 1 MiB each.
const CHUNKS_PER_READ: i64 = 4;

impl Queue {
    /// Stores one chunk of the claim's output (docs/design.md §9), one transaction: fenced by the live
    /// claim (`409` as for complete otherwise, `404` unknown order), stored once per `seq` (a
    /// resend is answered as the first time, live claim or not), older chunks dropped past
    /// `cap_bytes`, followers woken by `NOTIFY pullman_output`.
    pub async fn append_output(
        &self,
        order_id: Uuid,
        chunk: &NewChunk,
        cap_bytes: i64,
    ) -> Result<Appended, QueueError> {
        let mut tx = self.pool.begin().await?;
        let fenced: Option<(i64,)> = sqlx::query_as(sql::OUTPUT_FENCE)
            .bind(order_id)
            .bind(chunk.agent_id)
            .bind(chunk.claim_id)
            .fetch_optional(&mut *tx)
            .await?;
        if fenced.is_none() {
            tx.rollback().await?;
            if let Some(lines) = self.stored_chunk(order_id, chunk).await? {
                return Ok(Appended {
                    lines,
                    new: false,
                    dropped_by_cap: 0,
                });
            }
            return Err(self
                .explain_refusal(order_id, chunk.agent_id, Some(chunk.claim_id))
                .await?);
        }
        let inserted: Option<(i32, i64)> = sqlx::query_as(sql::OUTPUT_INSERT)
            .bind(order_id)
            .bind(chunk.claim_id)
            .bind(chunk.seq)
            .bind(chunk.gap_bytes)
            .bind(chunk.bytes)
            .bind(&chunk.streams)
            .bind(&chunk.texts)
            .bind(&chunk.ats)
            .bind(chunk.gap_reason)
            .fetch_optional(&mut *tx)
            .await?;
        let Some((lines, stored_bytes)) = inserted else {
            tx.commit().await?;
            let lines = self.stored_chunk(order_id, chunk).await?.unwrap_or(0);
            return Ok(Appended {
                lines,
                new: false,
                dropped_by_cap: 0,
            });
        };
        let mut dropped_by_cap = 0;
        if stored_bytes > cap_bytes {
            let (n,): (i64,) = sqlx::query_as(sql::OUTPUT_TRIM)
                .bind(order_id)
                .bind(cap_bytes)
                .fetch_one(&mut *tx)
                .await?;
            dropped_by_cap = n;
        }
        tx.commit().await?;
        Ok(Appended {
            lines: i64::from(lines),
            new: true,
            dropped_by_cap,
        })
    }

    /// The line count of a chunk stored before, if it was.
    async fn stored_chunk(
        &self,
        order_id: Uuid,
        chunk: &NewChunk,
    ) -> Result<Option<i64>, QueueError> {
        let row: Option<(i32,)> = sqlx::query_as(sql::OUTPUT_STORED_CHUNK)
            .bind(order_id)
            .bind(chunk.claim_id)
            .bind(chunk.seq)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|(n,)| i64::from(n)))
    }

    /// Whether the order exists (active or finished) and its output's dropped bytes and oldest
    /// stored chunk.
    pub async fn output_state(&self, order_id: Uuid) -> Result<OutputState, QueueError> {
        Ok(sqlx::query_as(sql::OUTPUT_STATE)
            .bind(order_id)
            .fetch_one(&self.pool)
            .await?)
    }

    /// Marks `order_id` as followed by `follower` (one id per stream), so that its move to the
    /// log notifies its followers (`NOTIFY pullman_output`, docs/design.md §9). Call before the
    /// follower's first read: an order finishing later then notifies, one finished earlier is
    /// seen by that read.
    pub async fn register_follower(
        &self,
        order_id: Uuid,
        follower: Uuid,
    ) -> Result<(), QueueError> {
        sqlx::query(sql::OUTPUT_FOLLOW)
            .bind(order_id)
            .bind(follower)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The stream of `follower` ended: its order's finish need not be notified for it.
    pub async fn unregister_follower(
        &self,
        order_id: Uuid,
        follower: Uuid,
    ) -> Result<(), QueueError> {
        sqlx::query(sql::OUTPUT_UNFOLLOW)
            .bind(order_id)
            .bind(follower)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Whether `agent_id` holds the live claim on the order (such an agent may read its output).
    pub async fn holds_live_claim(
        &self,
        order_id: Uuid,
        agent_id: Uuid,
    ) -> Result<bool, QueueError> {
        let (holds,): (bool,) = sqlx::query_as(sql::OUTPUT_READER_HOLDS)
            .bind(order_id)
            .bind(agent_id)
            .fetch_one(&self.pool)
            .await?;
        Ok(holds)
    }

    /// Up to `limit` lines after cursor `after` (from the start when `None`), oldest first, of
    /// every attempt or of `attempt` only; with a `dropped` marker first when the reader's
    /// position lies in output the cap dropped. Returns the lines and whether more are stored.
    pub async fn read_output(
        &self,
        order_id: Uuid,
        state: &OutputState,
        after: Option<i64>,
        attempt: Option<i32>,
        limit: usize,
    ) -> Result<(Vec<OutputEntry>, bool), QueueError> {
        let after_cursor = after.unwrap_or(-1);
        let mut lines = Vec::new();
        if let Some(marker) = dropped_marker(state, after_cursor) {
            lines.push(marker);
        }
        let mut from_chunk = (after_cursor.max(0)) >> INDEX_BITS;
        loop {
            let rows: Vec<ChunkRow> = sqlx::query_as(sql::OUTPUT_PAGE)
                .bind(order_id)
                .bind(from_chunk)
                .bind(attempt)
                .bind(CHUNKS_PER_READ)
                .fetch_all(&self.pool)
                .await?;
            let full = rows.len() as i64 == CHUNKS_PER_READ;
            for row in rows {
                from_chunk = row.id + 1;
                for entry in row.into_entries() {
                    if entry.cursor <= after_cursor {
                        continue;
                    }
                    if lines.len() == limit {
                        return Ok((lines, true));
                    }
                    lines.push(entry);
                }
            }
            if !full {
                return Ok((lines, false));
            }
        }
    }

    /// The last `n` lines (gap markers count), oldest first, of every attempt or of `attempt`
    /// only; a `dropped` marker first when they reach back to output the cap dropped.
    pub async fn tail_output(
        &self,
        order_id: Uuid,
        state: &OutputState,
        attempt: Option<i32>,
        n: usize,
    ) -> Result<Vec<OutputEntry>, QueueError> {
        let rows: Vec<ChunkRow> = sqlx::query_as(sql::OUTPUT_TAIL)
            .bind(order_id)
            .bind(attempt)
            .bind(n as i64)
            .fetch_all(&self.pool)
            .await?;
        let reaches_first = rows.first().map(|r| r.id) == state.first_chunk;
        let mut lines: Vec<OutputEntry> =
            rows.into_iter().flat_map(ChunkRow::into_entries).collect();
        let cut = lines.len().saturating_sub(n);
        lines.drain(..cut);
        if cut == 0
            && reaches_first
            && n > lines.len()
            && let Some(marker) = dropped_marker(state, -1)
        {
            lines.insert(0, marker);
        }
        Ok(lines)
    }
}

/// The text of a gap marker: how many bytes, and why when the agent said.
fn gap_text(bytes: i64, reason: Option<&str>) -> String {
    match reason.and_then(DroppedReason::parse) {
        Some(r) => format!(
            "[pullman: {bytes} bytes of output were lost here: the agent could not deliver them: {}]",
            r.explained()
        ),
        None => {
            format!(
                "[pullman: {bytes} bytes of output were lost here: the agent could not deliver them]"
            )
        }
    }
}

/// The marker of output dropped by the cap, for a reader positioned at `after`: only when bytes
/// were dropped and the reader has not yet read past where they were.
fn dropped_marker(state: &OutputState, after: i64) -> Option<OutputEntry> {
    let first = state.first_chunk?;
    let at = cursor(first, 0) - 1;
    (state.dropped_bytes > 0 && after < at).then(|| OutputEntry {
        cursor: at,
        claim_id: None,
        attempt: None,
        seq: None,
        stream: MARKER_STREAM.into(),
        text: format!(
            "[pullman: {} bytes of older output were dropped here: the order's output is kept up to its cap]",
            state.dropped_bytes
        ),
        at: state.first_received_at.unwrap_or_default(),
        marker: Some("dropped".into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(stream: &str, text: &str) -> OutputLine {
        OutputLine {
            stream: stream.into(),
            text: text.into(),
            at: Utc::now(),
        }
    }

    #[test]
    fn a_gap_marker_names_the_cause_the_agent_gave() {
        assert_eq!(
            gap_text(120, Some("server_busy")),
            "[pullman: 120 bytes of output were lost here: the agent could not deliver them: \
             its buffer was full while the server refused output with 429 (too many writes)]"
        );
        assert!(gap_text(5, Some("server_unreachable")).ends_with("server was unreachable]"));
        for r in [
            DroppedReason::ServerUnreachable,
            DroppedReason::ServerBusy,
            DroppedReason::ServerUnavailable,
            DroppedReason::ChunkRefused,
        ] {
            assert_eq!(DroppedReason::parse(r.as_str()), Some(r));
            let sent = serde_json::to_value(r).unwrap();
            assert_eq!(sent, r.as_str());
        }
        assert_eq!(
            gap_text(7, None),
            "[pullman: 7 bytes of output were lost here: the agent could not deliver them]"
        );
    }

    #[test]
    fn nul_is_replaced_and_bytes_counted() {
        let c = prepare_chunk(OutputChunk::of_lines(vec![
            line("std\0out", "a\0b"),
            line("stderr", "é"),
        ]))
        .unwrap();
        assert_eq!(c.texts, vec!["a\u{FFFD}b".to_string(), "é".to_string()]);
        assert_eq!(c.streams[0], "std\u{FFFD}out");
        let stored = "a\u{FFFD}b".len() + "std\u{FFFD}out".len() + "é".len() + "stderr".len();
        assert_eq!(c.bytes, stored as i64 + 2 * STORED_LINE_OVERHEAD_BYTES);
    }

    #[test]
    fn bad_fields_are_named() {
        let long = "x".repeat(MAX_STREAM_CHARS + 1);
        let e = prepare_chunk(OutputChunk::of_lines(vec![
            line("stdout", "a"),
            line(&long, "b"),
        ]))
        .unwrap_err();
        assert!(
            matches!(e, QueueError::Invalid { ref field, .. } if field == "lines[1].stream"),
            "{e}"
        );
        assert!(
            prepare_chunk(OutputChunk::of_lines(vec![line(
                &"é".repeat(MAX_STREAM_CHARS),
                "b"
            )]))
            .is_ok()
        );
        let mut c = OutputChunk::of_lines(vec![]);
        c.seq = -1;
        assert!(
            matches!(prepare_chunk(c).unwrap_err(), QueueError::Invalid { ref field, .. } if field == "seq")
        );
        let mut c = OutputChunk::of_lines(vec![]);
        c.dropped_bytes = Some(-5);
        assert!(
            matches!(prepare_chunk(c).unwrap_err(), QueueError::Invalid { ref field, .. } if field == "dropped_bytes")
        );
    }

    #[test]
    fn cursors_order_markers_before_lines() {
        // The `dropped` marker in front of chunk 7 (see `dropped_marker`).
        let dropped = cursor(7, 0) - 1;
        // After the last line chunk 6 can hold (fails if a chunk could fill all 16 bits).
        assert!(cursor(6, MAX_CHUNK_LINES as u32) < dropped);
        // A reader resuming after the marker starts its scan before chunk 7, so reads it whole.
        assert_eq!(dropped >> INDEX_BITS, 6);
        assert_eq!(cursor(7, 3) >> INDEX_BITS, 7);
    }
}
