//! One run of one container's log, read to its end (docs/design.md §9).
//!
//! The log is read as bytes and cut by [`LineCutter`], as the worker cuts a command's output:
//! redacted before any cut, invalid UTF-8 as U+FFFD (a line of garbage never ends the stream), a
//! long line sent in pieces as it is read (never held whole). Each line carries the kubelet's
//! timestamp; the pieces of a long line share their line's.
//!
//! A stream that ends while its container still runs, or breaks (API server or kubelet restart,
//! network), is opened again from the last line sent ([`ResumePoint`]: `sinceTime` to the
//! second, then the lines already sent at that time skipped), after a capped backoff. Only
//! refusals that a retry cannot change end it at once: `401`/`403` (the Role lacks `pods/log`),
//! `404` (the pod is gone), `400` (no such container). A `401`/`403` on a log already read is
//! retried instead: the right worked a moment ago, and an API server that was just restarted
//! refuses until its authorizer has read the Roles again (`RBAC: role … not found`); a right
//! really taken away ends at the verdict's last try, said as below. Nothing is lost in silence:
//! - an open that fails before any line was read says so at once, as one line (`[pullman] no logs
//!   from this container: …`; a kwok node, which has no kubelet, always answers so), and is then
//!   retried quietly;
//! - lines that still cannot be read when the order's verdict is in (one last try) get one line
//!   saying from when on they are missing.

use std::future::Future;

use chrono::{DateTime, SubsecRound, Utc};
use futures::{AsyncBufRead, AsyncBufReadExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::LogParams;
use tokio_util::sync::CancellationToken;

use super::pods::container_statuses;
use crate::pull::Backoff;
use crate::pull::lines::LineCutter;
use crate::pull::output::{MAX_LINE_BYTES, OutputHandle, Redactor};

/// Where one container's stream stopped on the server: the time of its last stored line and how
/// many stored lines carry exactly that time (PostgreSQL keeps microseconds, and lines printed
/// within one microsecond, or the pieces of one long line, share it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResumePoint {
    /// The time of the stream's last stored line (microseconds, as stored).
    pub at: DateTime<Utc>,
    /// How many stored lines of the stream carry exactly `at`.
    pub lines_at: usize,
}

impl ResumePoint {
    /// Adds one stored line of the stream.
    pub fn see(point: &mut Option<ResumePoint>, at: DateTime<Utc>) {
        match point {
            Some(p) if at < p.at => {}
            Some(p) if at == p.at => p.lines_at += 1,
            _ => *point = Some(ResumePoint { at, lines_at: 1 }),
        }
    }
}

/// Decides, line by line, which lines of a container's log the server has already: those before
/// the resume point, and the first `lines_at` at its exact time.
#[derive(Debug)]
pub struct Resume {
    point: Option<ResumePoint>,
    skipped_at: usize,
}

impl Resume {
    /// Skips what the server has up to `point` (nothing when `None`).
    pub fn new(point: Option<ResumePoint>) -> Self {
        Resume {
            point,
            skipped_at: 0,
        }
    }

    /// Whether the line stamped `at` (already cut to microseconds) was sent before.
    pub fn sent_before(&mut self, at: DateTime<Utc>) -> bool {
        let Some(p) = self.point else { return false };
        if at < p.at {
            return true;
        }
        if at == p.at && self.skipped_at < p.lines_at {
            self.skipped_at += 1;
            return true;
        }
        false
    }
}

/// How the executor's own lines on a container's stream begin (a log it cannot read, lines
/// missing): they are not the container's, so they never count as where its log stands.
pub const NOTICE_PREFIX: &str = "[pullman] ";

/// Which run of a container to read.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Run {
    /// The one running (or ended and not yet restarted), followed to its end.
    Current,
    /// The one before it, ended: its log as the kubelet kept it.
    Previous,
}

/// Why a log could not be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenError {
    /// A retry cannot change the answer.
    Final(String),
    /// `401`/`403`: final for a log never read; for one read before, retried (see the module
    /// documentation).
    Refused(String),
    /// The API server or the kubelet may answer later.
    Transient(String),
}

/// Where the run being read stands, as its pod's status says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunState {
    /// It runs (also when the status cannot be read): its log may go on.
    Running,
    /// It ended and was not replaced: its log is whole, as the current run's.
    Ended,
    /// It ended and the container restarted once since: its log is the previous run's.
    Replaced,
    /// Restarted more than once since, or the pod is gone: the kubelet no longer has its log.
    Gone,
}

/// Where a container's log comes from: the API server's `pods/log`, or a test's script.
pub trait LogSource: Sync {
    /// The log as it is read.
    type Reader: AsyncBufRead + Unpin + Send;
    /// Opens the log at `since` (whole seconds; `None`: from its beginning), of the container's
    /// current run, or of the run before it (`previous`).
    fn open(
        &self,
        since: Option<DateTime<Utc>>,
        previous: bool,
    ) -> impl Future<Output = Result<Self::Reader, OpenError>> + Send;
    /// Where the run read stands now.
    fn state(&self) -> impl Future<Output = RunState> + Send;
}

/// Where the lines go: one stream of the order's output.
pub trait LineSink: Sync {
    /// Sends one line, already redacted, stamped `at`.
    fn line(&self, text: String, at: DateTime<Utc>) -> impl Future<Output = ()> + Send;
}

/// One stream (`<pod>/<container>`) of an order's output.
pub struct StreamSink {
    /// The order's output.
    pub out: OutputHandle,
    /// `<pod>/<container>`.
    pub stream: String,
}

impl LineSink for StreamSink {
    async fn line(&self, text: String, at: DateTime<Utc>) {
        self.out.push_redacted(&self.stream, text, at).await;
    }
}

/// A run of a container in a pod, read through the API server.
pub struct KubeLog {
    /// Pods of the namespace.
    pub pods: Api<Pod>,
    /// The pod's name.
    pub pod: String,
    /// The container's name.
    pub container: String,
    /// The run's `restartCount`: a higher one means this run ended and was replaced.
    pub restart_count: i32,
}

impl LogSource for KubeLog {
    type Reader = std::pin::Pin<Box<dyn AsyncBufRead + Send>>;

    async fn open(
        &self,
        since: Option<DateTime<Utc>>,
        previous: bool,
    ) -> Result<Self::Reader, OpenError> {
        let params = LogParams {
            container: Some(self.container.clone()),
            follow: !previous,
            previous,
            timestamps: true,
            since_time: since
                .and_then(|at| k8s_openapi::jiff::Timestamp::from_second(at.timestamp()).ok()),
            ..LogParams::default()
        };
        match self.pods.log_stream(&self.pod, &params).await {
            Ok(reader) => Ok(Box::pin(reader)),
            Err(kube::Error::Api(status)) if [401, 403].contains(&status.code) => {
                Err(OpenError::Refused(kube::Error::Api(status).to_string()))
            }
            Err(kube::Error::Api(status)) if [400, 404].contains(&status.code) => {
                Err(OpenError::Final(kube::Error::Api(status).to_string()))
            }
            Err(error) => Err(OpenError::Transient(error.to_string())),
        }
    }

    async fn state(&self) -> RunState {
        let pod = match self.pods.get_opt(&self.pod).await {
            Ok(Some(pod)) => pod,
            Ok(None) => return RunState::Gone,
            Err(_) => return RunState::Running,
        };
        let Some(c) = container_statuses(&pod).find(|c| c.name == self.container) else {
            return RunState::Running;
        };
        match c.restart_count - self.restart_count {
            0 if c.state.as_ref().is_some_and(|s| s.running.is_some()) => RunState::Running,
            0 => RunState::Ended,
            1 => RunState::Replaced,
            _ => RunState::Gone,
        }
    }
}

/// Reads one run of a container's log to its end into `sink`, from just after `start` (what the
/// server has of the stream already), opening it again while it breaks off before the run ends
/// (see the module documentation). `stop`: the order's verdict is in; a stream that cannot be
/// opened gets one last try instead of more backoff.
pub async fn follow(
    source: &impl LogSource,
    run: Run,
    sink: &impl LineSink,
    redactor: &Redactor,
    start: Option<ResumePoint>,
    stop: &CancellationToken,
) {
    let mut f = Following {
        previous: run == Run::Previous,
        sent: start,
        read_any: false,
        said: false,
        backoff: Backoff::default(),
    };
    loop {
        let last_try = stop.is_cancelled();
        let step = match source.open(f.sent.map(|p| p.at), f.previous).await {
            Ok(reader) => f.read(source, reader, sink, redactor, last_try).await,
            Err(error) => f.unopened(sink, error).await,
        };
        let Step::Again(broke) = step else {
            return;
        };
        if last_try {
            // The verdict is in and the run is over: what is not read now will not be.
            f.say_lost_once(sink, &broke).await;
            return;
        }
        let wait = f.backoff.failed();
        tracing::debug!(%broke, ?wait, "container log broke off; opening it again");
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.cancelled() => {}
        }
    }
}

/// What one opening of the log came to.
enum Step {
    /// The run's log is read to its end, or said lost: follow no more.
    Done,
    /// It broke off (why): open it again after a backoff, unless this was the last try.
    Again(String),
}

/// Where the following of one run stands between openings of its log.
struct Following {
    /// Which log holds the run: the current one, or (once it was replaced) the previous.
    previous: bool,
    /// Where the server's copy of the stream stands.
    sent: Option<ResumePoint>,
    read_any: bool,
    /// The current outage has been said on the stream already.
    said: bool,
    backoff: Backoff,
}

impl Following {
    /// Reads the opened log until it ends or breaks, then asks where the run stands: a log that
    /// ended once the run is over (or the verdict is in) is whole; a run replaced is read on from
    /// the previous log; a run gone is said lost.
    async fn read(
        &mut self,
        source: &impl LogSource,
        reader: impl AsyncBufRead + Unpin,
        sink: &impl LineSink,
        redactor: &Redactor,
        last_try: bool,
    ) -> Step {
        let mut reading = Reading::new(redactor, self.sent);
        let ended = reading.pump(reader, sink).await;
        if reading.delivered {
            self.read_any = true;
            self.said = false;
            self.backoff.succeeded();
        }
        let state = source.state().await;
        if ended.is_ok() && (last_try || state != RunState::Running) {
            reading.finish(sink).await;
            return Step::Done;
        }
        self.sent = reading.sent;
        match state {
            RunState::Replaced => self.previous = true,
            RunState::Gone => {
                let why = "the container restarted again, or its pod is gone";
                self.say_lost_once(sink, why).await;
                return Step::Done;
            }
            RunState::Running | RunState::Ended => {}
        }
        Step::Again(match ended {
            Ok(()) => "the log ended while the container runs".to_string(),
            Err(error) => error.to_string(),
        })
    }

    /// A log that could not be opened: refused after a read a moment ago is retried quietly,
    /// like a break; refused or final otherwise is said lost; transient is said at once when
    /// nothing was read yet (a node without a kubelet never gives logs, and a user watching the
    /// order should know why it is silent), then retried quietly.
    async fn unopened(&mut self, sink: &impl LineSink, error: OpenError) -> Step {
        match error {
            OpenError::Refused(error) if self.read_any => Step::Again(error),
            OpenError::Final(error) | OpenError::Refused(error) => {
                self.say_lost_once(sink, &error).await;
                Step::Done
            }
            OpenError::Transient(error) => {
                if !self.read_any {
                    self.say_lost_once(sink, &error).await;
                }
                Step::Again(error)
            }
        }
    }

    /// [`say_lost`], unless the current outage was said already.
    async fn say_lost_once(&mut self, sink: &impl LineSink, error: &str) {
        if !self.said {
            say_lost(sink, self.sent, error).await;
            self.said = true;
        }
    }
}

/// One line on the stream saying its lines are missing, and from when.
async fn say_lost(sink: &impl LineSink, sent: Option<ResumePoint>, error: &str) {
    let (text, at) = match sent {
        Some(p) => (
            format!(
                "{NOTICE_PREFIX}lines of this container after {} could not be read: {error}",
                p.at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
            ),
            p.at.max(Utc::now()),
        ),
        None => (
            format!("{NOTICE_PREFIX}no logs from this container: {error}"),
            Utc::now(),
        ),
    };
    sink.line(text, at).await;
}

/// One open stream of a container's log being cut into lines.
struct Reading {
    cutter: LineCutter,
    resume: Resume,
    /// The time of the line being read (its later pieces share it).
    at: DateTime<Utc>,
    /// Where the server's copy of the stream stands, this stream's lines included.
    sent: Option<ResumePoint>,
    delivered: bool,
}

impl Reading {
    fn new(redactor: &Redactor, sent: Option<ResumePoint>) -> Self {
        Reading {
            cutter: LineCutter::new(redactor.clone(), MAX_LINE_BYTES),
            resume: Resume::new(sent),
            at: Utc::now(),
            sent,
            delivered: false,
        }
    }

    /// Reads until the stream ends (`Ok`) or breaks; a line still unfinished is kept for
    /// [`Reading::finish`], which is only right once the run is over (else it is read again
    /// whole).
    async fn pump(
        &mut self,
        mut reader: impl AsyncBufRead + Unpin,
        sink: &impl LineSink,
    ) -> std::io::Result<()> {
        loop {
            let buf = reader.fill_buf().await?;
            if buf.is_empty() {
                return Ok(());
            }
            let pieces = self.cutter.feed(buf);
            let n = buf.len();
            reader.consume_unpin(n);
            self.send(pieces, sink).await;
        }
    }

    async fn finish(&mut self, sink: &impl LineSink) {
        let pieces = self.cutter.finish();
        self.send(pieces, sink).await;
    }

    async fn send(&mut self, pieces: Vec<crate::pull::lines::Piece>, sink: &impl LineSink) {
        for piece in pieces {
            let mut text = piece.text;
            if piece.starts_line {
                let (at, rest) = split_timestamp(&text);
                // Cut to what the server stores, so a resumed stream compares like with like.
                self.at = at.unwrap_or_else(Utc::now).trunc_subsecs(6);
                text = rest.to_string();
            }
            if self.resume.sent_before(self.at) {
                continue;
            }
            ResumePoint::see(&mut self.sent, self.at);
            self.delivered = true;
            sink.line(text, self.at).await;
        }
    }
}

/// `2026-01-02T03:04:05.123456789Z text` → the time and the text. A line without a timestamp
/// (should not happen with `timestamps`) is kept whole.
pub fn split_timestamp(line: &str) -> (Option<DateTime<Utc>>, &str) {
    if let Some((ts, text)) = line.split_once(' ')
        && let Ok(at) = DateTime::parse_from_rfc3339(ts)
    {
        return (Some(at.with_timezone(&Utc)), text);
    }
    (None, line)
}

#[cfg(test)]
#[path = "container_log_tests.rs"]
mod tests;
