//! The wire shapes of order output (docs/design.md §9): the chunk an agent sends and the answer
//! it gets, why it lost output, a stored line as read back, and a page of them. Plain data:
//! `queue::output` stores and reads them, `wire` re-exports them for clients.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

/// One stored line as read back (docs/design.md §9). Marker lines (`marker` set) are written by the
/// server: `gap` for output the agent could not deliver, `dropped` for older output removed by
/// the per-order cap; the text says how many bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct OutputEntry {
    /// Pass as `after` to read the lines after this one.
    pub cursor: i64,
    /// The claim (attempt) that sent the line; absent only on a `dropped` marker.
    #[schema(required = true)]
    pub claim_id: Option<Uuid>,
    /// The attempt number: 1 for the order's first claim, 2 for the second, …; absent only on a
    /// `dropped` marker.
    #[schema(required = true)]
    pub attempt: Option<i32>,
    /// The chunk's `seq` within its claim; absent only on a `dropped` marker.
    #[schema(required = true)]
    pub seq: Option<i64>,
    /// `stdout`/`stderr`, `<pod>/<container>`, or `pullman` on a marker.
    pub stream: String,
    pub text: String,
    /// When the agent read the line. A `gap` marker: when its chunk was stored; a `dropped`
    /// marker: when the oldest chunk still kept was stored (both by the database's clock, so the
    /// same at every read).
    pub at: DateTime<Utc>,
    /// `gap` or `dropped` on a line the server wrote; absent on the agent's lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub marker: Option<String>,
}

/// A page of an order's output (`GET /work-orders/{id}/output` without `follow`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct OutputPage {
    /// Lines, oldest first.
    pub lines: Vec<OutputEntry>,
    /// The cursor of the last line returned (or the `after` asked, when none): pass it as
    /// `after` for the next page. Absent when nothing was read and no `after` was given.
    #[schema(required = true)]
    pub next_cursor: Option<i64>,
    /// True when the page was cut at `limit`: more lines are stored after `next_cursor`.
    pub more: bool,
    /// True when the order has finished: once `more` is false, no line will be added.
    pub finished: bool,
}

/// Body of `POST /work-orders/{id}/output` (docs/design.md §9): one ordered chunk of the output of the
/// claim `claim_id`, sent by the agent holding it. At most 1 MiB as sent (`413` above).
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputChunk {
    pub agent_id: Uuid,
    /// The claim's fencing token: a chunk of any other claim is `409` as for complete.
    pub claim_id: Uuid,
    /// The chunk's number within its claim: 0, 1, 2, … A chunk whose `seq` is already stored is
    /// answered as the first time and stored once, so an agent may resend after a timeout.
    #[schema(minimum = 0)]
    pub seq: i64,
    /// Bytes of output the agent could not deliver before this chunk (its buffer overflowed while
    /// the server was away or refusing); stored as a gap marker ahead of `lines`. Absent or 0 =
    /// none lost.
    #[serde(default)]
    #[schema(minimum = 0)]
    pub dropped_bytes: Option<i64>,
    /// Why those bytes were lost, named in the gap marker. Absent: not said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped_reason: Option<DroppedReason>,
    /// The lines, oldest first; may be empty when the chunk only reports a gap.
    pub lines: Vec<OutputLine>,
}

#[cfg(test)]
impl OutputChunk {
    /// Chunk 0 of `lines`, of the nil agent and claim, reporting no gap: for tests of what a
    /// chunk's lines become.
    pub(crate) fn of_lines(lines: Vec<OutputLine>) -> Self {
        OutputChunk {
            agent_id: Uuid::nil(),
            claim_id: Uuid::nil(),
            seq: 0,
            dropped_bytes: None,
            dropped_reason: None,
            lines,
        }
    }
}

/// Why an agent lost output (docs/design.md §9): its buffer was full while the server could not
/// take chunks, or the server refused a chunk it cannot store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DroppedReason {
    /// The buffer was full while the server did not answer (down, unreachable, timing out, 5xx).
    ServerUnreachable,
    /// The buffer was full while the server answered `429` (too many output writes).
    ServerBusy,
    /// The buffer was full while the server answered `503` (database unavailable, stopping).
    ServerUnavailable,
    /// The server refused a chunk as invalid or too large (`400`, `413`).
    ChunkRefused,
}

impl DroppedReason {
    /// The name sent and stored (`server_unreachable`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            DroppedReason::ServerUnreachable => "server_unreachable",
            DroppedReason::ServerBusy => "server_busy",
            DroppedReason::ServerUnavailable => "server_unavailable",
            DroppedReason::ChunkRefused => "chunk_refused",
        }
    }

    /// How a gap marker says it, after "the agent could not deliver them: ".
    pub fn explained(self) -> &'static str {
        match self {
            DroppedReason::ServerUnreachable => {
                "its buffer was full while the server was unreachable"
            }
            DroppedReason::ServerBusy => {
                "its buffer was full while the server refused output with 429 (too many writes)"
            }
            DroppedReason::ServerUnavailable => {
                "its buffer was full while the server refused output with 503 (unavailable)"
            }
            DroppedReason::ChunkRefused => "the server refused them as invalid or too large",
        }
    }

    /// The reason stored as [`DroppedReason::as_str`], if known.
    pub fn parse(stored: &str) -> Option<Self> {
        [
            DroppedReason::ServerUnreachable,
            DroppedReason::ServerBusy,
            DroppedReason::ServerUnavailable,
            DroppedReason::ChunkRefused,
        ]
        .into_iter()
        .find(|r| r.as_str() == stored)
    }
}

/// One line of output (docs/design.md §9), without its line ending.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputLine {
    /// `stdout` or `stderr` for a worker; `<pod>/<container>` for the executor (at most 253
    /// characters).
    #[schema(min_length = 1, max_length = 253)]
    pub stream: String,
    /// The text; U+0000 is replaced by the server, never refused.
    pub text: String,
    /// When the agent read the line.
    pub at: DateTime<Utc>,
}

/// Answer to `POST /work-orders/{id}/output`: the same for a first and a repeated `seq`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, ToSchema)]
pub struct OutputAccepted {
    pub seq: i64,
    /// Lines of the chunk as stored.
    pub lines: i64,
}

/// Query of `GET /work-orders/{id}/output` (docs/design.md §9), as the server reads it and as
/// clients send it ([`OutputQuery::to_query_string`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct OutputQuery {
    /// Only lines after this cursor (a line's `cursor`, or a page's `next_cursor`).
    #[param(minimum = 0)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<i64>,
    /// Only the last N lines (1–10000); not with `after`.
    #[param(minimum = 1, maximum = 10000)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<i64>,
    /// Only the lines of this attempt (1 = the order's first claim).
    #[param(minimum = 1)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<i32>,
    /// `true`: answer `application/x-ndjson`, one line object per line, streaming new lines as
    /// they are stored, ending when the order has finished and its last lines were sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow: Option<bool>,
    /// Most lines of a page, 1–10000 (default 1000); not with `follow`.
    #[param(minimum = 1, maximum = 10000)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<i64>,
}

impl OutputQuery {
    /// The query string (without `?`) that asks for this.
    pub fn to_query_string(&self) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        let mut pair = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                q.append_pair(k, &v);
            }
        };
        pair("after", self.after.map(|v| v.to_string()));
        pair("tail", self.tail.map(|v| v.to_string()));
        pair("attempt", self.attempt.map(|v| v.to_string()));
        pair("follow", self.follow.map(|v| v.to_string()));
        pair("limit", self.limit.map(|v| v.to_string()));
        q.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_string_reads_back_as_the_query_it_was_made_from() {
        let queries = [
            OutputQuery::default(),
            OutputQuery {
                after: Some(65_537),
                attempt: Some(2),
                limit: Some(1000),
                ..OutputQuery::default()
            },
            OutputQuery {
                tail: Some(20),
                follow: Some(true),
                ..OutputQuery::default()
            },
        ];
        for q in queries {
            let uri: axum::http::Uri = format!("/x?{}", q.to_query_string()).parse().unwrap();
            let axum::extract::Query(back) =
                axum::extract::Query::<OutputQuery>::try_from_uri(&uri).unwrap();
            assert_eq!(back, q);
        }
    }
}
