//! Output of running orders over HTTP (docs/design.md §9): `POST /work-orders/{id}/output` (the claim
//! holder appends a chunk) and `GET /work-orders/{id}/output` (a page, the last lines, or a
//! newline-delimited JSON stream that follows the order until it finishes).

use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::sync::{OwnedSemaphorePermit, broadcast};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::error::{ApiPath, ApiQuery, from_json_object};
use super::{ApiError, AppState, Caller, ErrorBody};
use crate::auth::Principal;
use crate::queue::output::{MAX_CHUNK_BYTES, OutputEntry, OutputPage, OutputState, prepare_chunk};
use crate::queue::{Queue, QueueError};
use crate::telemetry::Metrics;
use crate::wire::{OutputAccepted, OutputChunk, OutputQuery};

use crate::queue::limits::{
    MAX_OUTPUT_PAGE_LINES as MAX_PAGE_LINES, MAX_OUTPUT_TAIL as MAX_TAIL,
    OUTPUT_PAGE_LINES_DEFAULT as DEFAULT_PAGE_LINES,
};

/// How long a chunk's body may take to arrive once its write permit is taken.
const BODY_READ_LIMIT: Duration = Duration::from_secs(30);
/// `Retry-After` of a follow refused for `serve --max-output-followers`, seconds.
const FOLLOWERS_RETRY_AFTER_SECONDS: u64 = 5;
/// A follower reads again at least this often even without a notification. Stored chunks and the
/// finish of a followed order notify it, and a listener that reconnects wakes every follower, so
/// this is only the safety net: 1,000 idle followers cost about 2 statements a minute each.
const FOLLOW_POLL: Duration = Duration::from_secs(60);

/// One follower's wait for its safety re-read: a random 80–100 % of [`FOLLOW_POLL`], drawn anew
/// each time. Followers that connected together (all of them, after a restart or a listener's
/// reconnect) would otherwise re-read together every minute, a burst of 2 statements per
/// follower at once; never above `FOLLOW_POLL`, so a minute still holds every follower's re-read
/// (what bench/output.rs (e) counts).
fn follow_poll() -> Duration {
    FOLLOW_POLL.mul_f64(rand::random_range(0.8..=1.0))
}

/// Append one chunk of the claim's output (agent scope: the agent holding the live claim).
#[utoipa::path(post, path = "/api/v1/work-orders/{id}/output", tag = "output",
    params(("id" = Uuid, Path, description = "Work order id")), request_body = OutputChunk,
    responses(
        (status = 200, description = "Stored (or stored before under this `seq`: the same answer)", body = OutputAccepted),
        (status = 409, description = "`cancelled`, `reclaimed` or `not_claim_holder`: the claim is not the live one; stop sending", body = ErrorBody),
        (status = 413, description = "`payload_too_large`: the chunk is over 1 MiB as sent", body = ErrorBody),
        (status = 429, description = "`too_many_output_writes`: retry after `Retry-After` seconds", body = ErrorBody),
        (status = 503, description = "`database_unavailable`: retry after `Retry-After` seconds", body = ErrorBody),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn append(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<Uuid>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<OutputAccepted>, ApiError> {
    // The permit is held until the chunk is stored.
    let (bytes, _permit) = read_chunk_body(&state, &headers, body).await?;
    // Invalid UTF-8 is replaced (U+FFFD), never refused: output is whatever a program printed.
    let text = String::from_utf8_lossy(&bytes);
    let chunk = parse_chunk(&text)?;
    caller.require_agent(chunk.agent_id)?;
    let chunk = prepare_chunk(chunk)?;
    let cap = i64::try_from(state.output.cap_bytes).unwrap_or(i64::MAX);
    let appended = state.queue.append_output(id, &chunk, cap).await?;
    if appended.new {
        state.metrics.output_bytes.inc_by(chunk.bytes as u64);
        state.metrics.output_lines.inc_by(appended.lines as u64);
        state.metrics.count_output_dropped("gap", chunk.gap_bytes);
        state
            .metrics
            .count_output_dropped("cap", appended.dropped_by_cap);
    }
    Ok(Json(OutputAccepted {
        seq: chunk.seq,
        lines: appended.lines,
    }))
}

/// The body of an output chunk, within the guards that keep a server's memory bounded
/// (docs/design.md §9): a declared length over [`MAX_CHUNK_BYTES`] is refused (`413`) before a
/// byte is read; one of `serve --max-output-writes` permits (`429` when none is free) is taken
/// before reading, so the bound holds bodies being read and parsed too, and returned to be held
/// until the chunk is stored; the read stops at the limit (`413`) and after [`BODY_READ_LIMIT`]
/// (`408`), so a stalled upload never keeps its permit.
async fn read_chunk_body(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Bytes, OwnedSemaphorePermit), ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!(
                "an output chunk is at most {MAX_CHUNK_BYTES} bytes (1 MiB) as sent; send smaller chunks"
            ),
        )
    };
    // Refused before a byte of the body is read when its length is declared.
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_CHUNK_BYTES as u64) {
        return Err(too_large());
    }
    let Ok(permit) = state.output_writes.clone().try_acquire_owned() else {
        let mut e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_output_writes",
            "the server is storing its maximum of output chunks at once; send this one again shortly",
        );
        e.retry_after = Some(1);
        return Err(e);
    };
    // Bounded in time too: a stalled upload must not hold its permit for good.
    let bytes =
        match tokio::time::timeout(BODY_READ_LIMIT, axum::body::to_bytes(body, MAX_CHUNK_BYTES))
            .await
        {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(e)) if is_length_limit(&e) => return Err(too_large()),
            Ok(Err(e)) => {
                return Err(ApiError::bad_request(
                    "malformed_body",
                    format!("the request body could not be read: {e}"),
                ));
            }
            Err(_) => {
                return Err(ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "body_timeout",
                    format!(
                        "the chunk's body did not arrive within {} s; send it again",
                        BODY_READ_LIMIT.as_secs()
                    ),
                ));
            }
        };
    Ok((bytes, permit))
}

/// The chunk in `text`. An agent's chunk is parsed straight into [`OutputChunk`] (no JSON tree of
/// a megabyte of lines in between); anything else goes the way every body goes, whose errors
/// say what is wrong (and which takes `1.0` for an integer, as every route does).
fn parse_chunk(text: &str) -> Result<OutputChunk, ApiError> {
    // Only an object: serde would also take an array of the fields in order.
    if text.trim_start().starts_with('{')
        && let Ok(chunk) = serde_json::from_str(text)
    {
        return Ok(chunk);
    }
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        ApiError::bad_request(
            "malformed_json",
            format!("request body is not valid JSON: {e}"),
        )
    })?;
    from_json_object(value)
}

/// Whether reading a body failed because it passed its length limit (not a broken connection).
fn is_length_limit(e: &axum::Error) -> bool {
    let mut source: Option<&dyn std::error::Error> = Some(e);
    while let Some(err) = source {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = err.source();
    }
    false
}

/// Read an order's output (admin, or the agent holding its live claim): a page from the start or
/// after a cursor, the last lines, or (`follow=true`) a stream until the order finishes. Page on
/// by passing `next_cursor` as `after` while `more` is true; a finished order with `more` false
/// has no further lines.
#[utoipa::path(get, path = "/api/v1/work-orders/{id}/output", tag = "output",
    params(("id" = Uuid, Path, description = "Work order id (active or finished)"), OutputQuery),
    responses(
        (status = 200, description = "A page (JSON); with `follow=true` a stream of line objects, one per line (`application/x-ndjson`)",
            content(
                (OutputPage = "application/json"),
                (OutputEntry = "application/x-ndjson"))),
        (status = 404, description = "No such order, active or finished", body = ErrorBody),
        (status = 400, body = ErrorBody),
        (status = 503, description = "`too_many_followers` (`follow=true` past `serve --max-output-followers`) or `database_unavailable`: retry after `Retry-After` seconds", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn read(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<Uuid>,
    ApiQuery(q): ApiQuery<OutputQuery>,
) -> Result<Response, ApiError> {
    let asked = Read::of(&q)?;
    // A follow past the limit is refused before it costs a database read.
    let permit = match asked {
        Read::Follow { .. } => Some(follower_permit(&state)?),
        _ => None,
    };
    may_read(&state.queue, &caller, id).await?;
    let order_state = known(&state.queue, id).await?;
    let queue = &state.queue;
    match asked {
        Read::Page { after, limit } => {
            let (lines, more) = queue
                .read_output(id, &order_state, after, q.attempt, limit)
                .await?;
            let next_cursor = lines.last().map(|l| l.cursor).or(after);
            Ok(page(lines, next_cursor, more, &order_state))
        }
        Read::Tail(n) => {
            let lines = queue.tail_output(id, &order_state, q.attempt, n).await?;
            let next_cursor = lines.last().map(|l| l.cursor);
            Ok(page(lines, next_cursor, false, &order_state))
        }
        Read::Follow { tail, after } => {
            let first = match tail {
                Some(n) => queue.tail_output(id, &order_state, q.attempt, n).await?,
                None => Vec::new(),
            };
            let permit = permit.expect("taken for a follow");
            Ok(follow(&state, id, first, after, q.attempt, permit))
        }
    }
}

/// What a read asks for, its query checked (`400 invalid_query` naming the parameter).
enum Read {
    /// Up to `limit` lines after `after` (from the start when absent).
    Page { after: Option<i64>, limit: usize },
    /// The last N lines.
    Tail(usize),
    /// The last `tail` lines (or from after `after`, or from the start), then every new line.
    Follow {
        tail: Option<usize>,
        after: Option<i64>,
    },
}

impl Read {
    fn of(q: &OutputQuery) -> Result<Read, ApiError> {
        let bad = |m: String| ApiError::bad_request("invalid_query", m);
        if let Some(after) = q.after
            && after < 0
        {
            return Err(bad(format!("after must be 0 or more, got {after}")));
        }
        if let Some(tail) = q.tail {
            if !(1..=MAX_TAIL).contains(&tail) {
                return Err(bad(format!(
                    "tail must be between 1 and {MAX_TAIL}, got {tail}"
                )));
            }
            if q.after.is_some() {
                return Err(bad("tail and after exclude each other".into()));
            }
        }
        if let Some(attempt) = q.attempt
            && attempt < 1
        {
            return Err(bad(format!("attempt must be 1 or more, got {attempt}")));
        }
        let tail = q.tail.map(|n| n as usize);
        if q.follow.unwrap_or(false) {
            if q.limit.is_some() {
                return Err(bad("limit applies to pages, not to follow".into()));
            }
            return Ok(Read::Follow {
                tail,
                after: q.after,
            });
        }
        // Checked even where `tail` makes it moot: a bad value is an error wherever it is.
        let limit = match q.limit {
            Some(l) if !(1..=MAX_PAGE_LINES).contains(&l) => {
                return Err(bad(format!(
                    "limit must be between 1 and {MAX_PAGE_LINES}, got {l}"
                )));
            }
            Some(l) => l as usize,
            None => DEFAULT_PAGE_LINES as usize,
        };
        if let Some(n) = tail {
            return Ok(Read::Tail(n));
        }
        Ok(Read::Page {
            after: q.after,
            limit,
        })
    }
}

/// The admin reads any order's output; an agent only that of an order it holds the live claim
/// on (an executor restarted mid-order reads back what it sent).
async fn may_read(queue: &Queue, caller: &Principal, id: Uuid) -> Result<(), ApiError> {
    match caller {
        Principal::Admin => Ok(()),
        Principal::Agent(agent) if queue.holds_live_claim(id, *agent).await? => Ok(()),
        Principal::Agent(agent) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "agent {agent} may read the output only of an order it holds the live claim on; work order {id} is not one"
            ),
        )),
    }
}

fn page(
    lines: Vec<OutputEntry>,
    next_cursor: Option<i64>,
    more: bool,
    order: &OutputState,
) -> Response {
    Json(OutputPage {
        lines,
        next_cursor,
        more,
        finished: order.finished,
    })
    .into_response()
}

/// The NDJSON stream of `follow=true`: `first` (the `tail` lines), then every line stored after
/// them (or after `after`) until the order finishes; `permit` is held as long as it is open.
fn follow(
    state: &AppState,
    id: Uuid,
    first: Vec<OutputEntry>,
    after: Option<i64>,
    attempt: Option<i32>,
    permit: OwnedSemaphorePermit,
) -> Response {
    let follower = Follower {
        queue: state.queue.clone(),
        stored: state.notifications.output_stored(),
        draining: state.notifications.draining().clone(),
        order: id,
        after: first.last().map(|l| l.cursor).or(after),
        attempt,
        first: (!first.is_empty()).then(|| ndjson(&first)),
        followed: None,
        _gauge: FollowerGauge::enter(&state.metrics),
        _permit: permit,
    };
    let stream = futures::stream::unfold(follower, |mut f| async move {
        f.next_batch().await.map(|item| (item, f))
    });
    (
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

/// One of `serve --max-output-followers`; `503 too_many_followers` with `Retry-After` past it.
fn follower_permit(state: &AppState) -> Result<OwnedSemaphorePermit, ApiError> {
    state
        .output_followers
        .clone()
        .try_acquire_owned()
        .map_err(|_| {
            let mut e = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "too_many_followers",
                "this server follows its maximum of output streams (serve --max-output-followers); \
                 follow again shortly, or read pages",
            );
            e.retry_after = Some(FOLLOWERS_RETRY_AFTER_SECONDS);
            e
        })
}

/// The order's output state; `404` when the order is neither active nor finished.
async fn known(queue: &Queue, id: Uuid) -> Result<OutputState, ApiError> {
    let s = queue.output_state(id).await?;
    if !s.active && !s.finished {
        return Err(QueueError::NotFound {
            what: "work order",
            id: id.to_string(),
        }
        .into());
    }
    Ok(s)
}

fn ndjson(lines: &[OutputEntry]) -> Bytes {
    let mut out = Vec::with_capacity(lines.len() * 96);
    for line in lines {
        // Serializing these plain shapes cannot fail.
        let _ = serde_json::to_writer(&mut out, line);
        out.push(b'\n');
    }
    Bytes::from(out)
}

/// One `follow=true` reader. It reads the database only when the client takes the previous
/// batch (the body stream is polled as the connection drains), so a slow reader never holds up
/// a writer or buffers output in the server; dropped with the connection, it frees everything.
struct Follower {
    queue: Queue,
    stored: broadcast::Receiver<Option<Uuid>>,
    draining: CancellationToken,
    order: Uuid,
    after: Option<i64>,
    attempt: Option<i32>,
    /// The `tail` lines, sent first.
    first: Option<Bytes>,
    /// This stream's row in `output_followers` (its order's finish notifies it), once written.
    followed: Option<Uuid>,
    _gauge: FollowerGauge,
    /// One of `serve --max-output-followers`, given back when the stream ends.
    _permit: OwnedSemaphorePermit,
}

impl Follower {
    /// The next lines as NDJSON; `None` once the order has finished and every line was sent
    /// (or the server stops). A database failure ends the stream with an error, so the client
    /// sees a cut connection, not a clean end, and can resume from its last cursor.
    async fn next_batch(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        if let Some(first) = self.first.take() {
            return Some(Ok(first));
        }
        if self.followed.is_none() {
            // Before the first read: a finish after it notifies; one before it is read.
            let follower = Uuid::new_v4();
            if let Err(e) = self.queue.register_follower(self.order, follower).await {
                return Some(Err(std::io::Error::other(e.to_string())));
            }
            self.followed = Some(follower);
        }
        loop {
            let read = async {
                // The state first: when it says finished, every chunk committed before it (a
                // chunk holds the claim row that finishing deletes), so the read finds them all.
                let s = self.queue.output_state(self.order).await?;
                let (lines, more) = self
                    .queue
                    .read_output(
                        self.order,
                        &s,
                        self.after,
                        self.attempt,
                        DEFAULT_PAGE_LINES as usize,
                    )
                    .await?;
                Ok::<_, QueueError>((s, lines, more))
            };
            let (s, lines, more) = match read.await {
                Ok(r) => r,
                Err(e) => {
                    if matches!(e, QueueError::Unavailable(_)) {
                        self.queue.note_database_unavailable();
                    }
                    return Some(Err(std::io::Error::other(e.to_string())));
                }
            };
            if let Some(last) = lines.last() {
                self.after = Some(last.cursor);
                return Some(Ok(ndjson(&lines)));
            }
            if !more && (s.finished || !s.active) {
                return None;
            }
            if !self.wait().await {
                return None;
            }
        }
    }

    /// Waits for output of this order, the fallback poll, or the server stopping (false).
    async fn wait(&mut self) -> bool {
        let stored = async {
            loop {
                match self.stored.recv().await {
                    Ok(Some(id)) if id != self.order => continue,
                    Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
                    _ => return,
                }
            }
        };
        tokio::select! {
            _ = self.draining.cancelled() => false,
            _ = stored => true,
            _ = tokio::time::sleep(follow_poll()) => true,
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        if let Some(follower) = self.followed.take() {
            let (queue, order) = (self.queue.clone(), self.order);
            // Not awaited: the connection is gone. A row left behind (a server stopping) costs
            // one NOTIFY when the order finishes, and maintenance deletes it after a day.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    if let Err(e) = queue.unregister_follower(order, follower).await {
                        tracing::debug!(error = %e, %order, "could not drop a follower's row");
                    }
                });
            }
        }
    }
}

/// Keeps `pullman_output_followers` in step with the streams open, also when a client leaves.
struct FollowerGauge(std::sync::Arc<Metrics>);

impl FollowerGauge {
    fn enter(metrics: &std::sync::Arc<Metrics>) -> Self {
        metrics.output_followers.inc();
        FollowerGauge(metrics.clone())
    }
}

impl Drop for FollowerGauge {
    fn drop(&mut self) {
        self.0.output_followers.dec();
    }
}
