//! A container's log under the faults a busy cluster produces, with a scripted log source: each
//! open serves the kubelet's log from `sinceTime` (to the second, as the API server does), cut
//! short or broken where the script says.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use futures::TryStreamExt;

use super::*;

/// The kubelet's whole log of one run: `<RFC 3339 nanos> text\n` per line.
fn kubelet_log(lines: &[(DateTime<Utc>, &[u8])]) -> Vec<u8> {
    let mut log = Vec::new();
    for (at, text) in lines {
        log.extend_from_slice(
            at.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
                .as_bytes(),
        );
        log.push(b' ');
        log.extend_from_slice(text);
        log.push(b'\n');
    }
    log
}

fn t(micros: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(1_800_000_000_000_000 + micros).unwrap()
}

enum Open {
    Fail(OpenError),
    /// The first `bytes` of the log from `since` (all of it: `None`), then the end, or a break.
    Give {
        bytes: Option<usize>,
        breaks: bool,
    },
}

struct Script {
    log: Vec<u8>,
    opens: Mutex<VecDeque<Open>>,
    /// Answers to `state`, in order; the last one repeats.
    states: Mutex<VecDeque<RunState>>,
    /// Each open: its `since` and whether it asked for the previous run.
    opened: Mutex<Vec<(Option<DateTime<Utc>>, bool)>>,
}

impl Script {
    fn new(log: Vec<u8>, opens: Vec<Open>, states: Vec<RunState>) -> Self {
        Script {
            log,
            opens: Mutex::new(opens.into()),
            states: Mutex::new(states.into()),
            opened: Mutex::new(Vec::new()),
        }
    }

    fn sinces(&self) -> Vec<Option<DateTime<Utc>>> {
        self.opened.lock().unwrap().iter().map(|o| o.0).collect()
    }

    /// The log from `since`, to the second: the lines stamped at or after it.
    fn from(&self, since: Option<DateTime<Utc>>) -> Vec<u8> {
        let since = since.map(|s| s.trunc_subsecs(0));
        let mut out = Vec::new();
        for line in self.log.split_inclusive(|&b| b == b'\n') {
            let stamp = std::str::from_utf8(&line[..30]).unwrap();
            let at: DateTime<Utc> = stamp.parse().unwrap();
            if since.is_none_or(|s| at >= s) {
                out.extend_from_slice(line);
            }
        }
        out
    }
}

impl LogSource for Script {
    type Reader = std::pin::Pin<Box<dyn AsyncBufRead + Send>>;

    async fn open(
        &self,
        since: Option<DateTime<Utc>>,
        previous: bool,
    ) -> Result<Self::Reader, OpenError> {
        self.opened.lock().unwrap().push((since, previous));
        let open = self.opens.lock().unwrap().pop_front();
        let (bytes, breaks) = match open {
            Some(Open::Fail(e)) => return Err(e),
            Some(Open::Give { bytes, breaks }) => (bytes, breaks),
            None => (None, false),
        };
        let mut log = self.from(since);
        log.truncate(bytes.unwrap_or(log.len()));
        // Served in small reads, so lines and characters are split across them.
        let read = if log.len() > 1 << 20 { 64 << 10 } else { 7 };
        let mut reads: Vec<std::io::Result<Vec<u8>>> =
            log.chunks(read).map(|c| Ok(c.to_vec())).collect();
        if breaks {
            reads.push(Err(std::io::Error::other("connection reset")));
        }
        Ok(Box::pin(futures::stream::iter(reads).into_async_read()))
    }

    async fn state(&self) -> RunState {
        let mut r = self.states.lock().unwrap();
        if r.len() > 1 {
            r.pop_front().unwrap()
        } else {
            r.front().copied().unwrap_or(RunState::Ended)
        }
    }
}

#[derive(Default)]
struct Sink(Mutex<Vec<(String, DateTime<Utc>)>>);

impl LineSink for Sink {
    async fn line(&self, text: String, at: DateTime<Utc>) {
        self.0.lock().unwrap().push((text, at));
    }
}

impl Sink {
    fn texts(&self) -> Vec<String> {
        self.0.lock().unwrap().iter().map(|l| l.0.clone()).collect()
    }
}

async fn run(script: &Script, start: Option<ResumePoint>, stop: &CancellationToken) -> Sink {
    let sink = Sink::default();
    tokio::time::timeout(
        Duration::from_secs(30),
        follow(
            script,
            Run::Current,
            &sink,
            &Redactor::default(),
            start,
            stop,
        ),
    )
    .await
    .expect("the follower ends");
    sink
}

fn numbered(n: usize) -> Vec<(DateTime<Utc>, Vec<u8>)> {
    // Two lines per second, and two lines sharing each microsecond.
    (0..n)
        .map(|i| {
            (
                t((i as i64 / 2) * 500_000),
                format!("line {i}").into_bytes(),
            )
        })
        .collect()
}

/// `n` numbered lines whose first stream breaks halfway through the log; later opens do what
/// `after` says (then give the rest), and the run is in `state` whenever asked.
fn broken_halfway(n: usize, after: impl IntoIterator<Item = Open>, state: RunState) -> Script {
    let log = log_of(&numbered(n));
    let half = log.len() / 2;
    let opens = std::iter::once(Open::Give {
        bytes: Some(half),
        breaks: true,
    })
    .chain(after)
    .collect();
    Script::new(log, opens, vec![state])
}

fn log_of(lines: &[(DateTime<Utc>, Vec<u8>)]) -> Vec<u8> {
    let refs: Vec<(DateTime<Utc>, &[u8])> = lines.iter().map(|(a, b)| (*a, b.as_slice())).collect();
    kubelet_log(&refs)
}

#[tokio::test]
async fn a_stream_that_breaks_while_its_container_runs_is_reopened_without_loss_or_repeat() {
    let lines = numbered(12);
    let log = log_of(&lines);
    let mid = log.len() / 2 + 3; // inside a line
    let script = Script::new(
        log,
        vec![
            Open::Give {
                bytes: Some(mid),
                breaks: true,
            },
            Open::Fail(OpenError::Transient("API server restarting".into())),
            Open::Give {
                bytes: Some(40),
                breaks: false,
            },
            Open::Give {
                bytes: None,
                breaks: false,
            },
        ],
        // After the break: still running; after the clean but early end: still running;
        // after the last: ended.
        vec![RunState::Running, RunState::Running, RunState::Ended],
    );
    let sink = run(&script, None, &CancellationToken::new()).await;
    let want: Vec<String> = (0..12).map(|i| format!("line {i}")).collect();
    assert_eq!(sink.texts(), want);
    let opened = script.sinces();
    assert_eq!(opened.len(), 4, "{opened:?}");
    assert_eq!(opened[0], None);
    assert!(opened[1].is_some(), "reopened from the last line sent");
}

#[tokio::test]
async fn invalid_utf8_and_a_huge_line_do_not_end_the_stream() {
    let huge = vec![b'a'; 10 << 20];
    let log = kubelet_log(&[
        (t(1), b"bad \xff\xfe bytes"),
        (t(2), &huge),
        (t(3), b"after"),
    ]);
    let script = Script::new(log, vec![], vec![RunState::Ended]);
    let sink = run(&script, None, &CancellationToken::new()).await;
    let got = sink.0.lock().unwrap();
    assert_eq!(got[0].0, "bad \u{fffd}\u{fffd} bytes");
    let pieces = &got[1..got.len() - 1];
    assert!(
        pieces
            .iter()
            .all(|p| p.0.len() <= MAX_LINE_BYTES && p.1 == t(2))
    );
    assert_eq!(pieces.iter().map(|p| p.0.len()).sum::<usize>(), 10 << 20);
    assert_eq!(got.last().unwrap(), &("after".to_string(), t(3)));
}

#[tokio::test]
async fn a_broken_long_line_resumes_after_its_last_piece() {
    // The stream breaks after the first pieces of a long line; the reopened log gives the line
    // whole again, and only its missing pieces are sent.
    let long = vec![b'b'; 3 * MAX_LINE_BYTES + 10];
    let log = kubelet_log(&[(t(1), b"first"), (t(2), &long), (t(3), b"last")]);
    let script = Script::new(
        log,
        vec![Open::Give {
            bytes: Some(2 * MAX_LINE_BYTES + 100),
            breaks: true,
        }],
        vec![RunState::Running, RunState::Ended],
    );
    let sink = run(&script, None, &CancellationToken::new()).await;
    let got = sink.texts();
    assert_eq!(got.first().unwrap(), "first");
    assert_eq!(got.last().unwrap(), "last");
    assert_eq!(
        got[1..got.len() - 1].concat().len(),
        long.len(),
        "{}",
        got.len()
    );
}

#[tokio::test]
async fn a_node_without_logs_is_said_once_and_retried_quietly_until_the_verdict() {
    let script = Script::new(
        kubelet_log(&[(t(1), b"never seen")]),
        (0..100)
            .map(|_| Open::Fail(OpenError::Transient("no kubelet on this node".into())))
            .collect(),
        vec![RunState::Running],
    );
    let stop = CancellationToken::new();
    let stopper = stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1800)).await;
        stopper.cancel();
    });
    let sink = run(&script, None, &stop).await;
    assert_eq!(
        sink.texts(),
        ["[pullman] no logs from this container: no kubelet on this node"]
    );
    let opens = script.opened.lock().unwrap().len();
    assert!(
        (3..=5).contains(&opens),
        "retried with backoff, then a last try: {opens}"
    );
}

/// What is said of a running container's log, never read before, whose one open fails with
/// `error`; it is not opened again.
async fn said_when_the_first_open_fails(error: OpenError) -> Vec<String> {
    let script = Script::new(
        kubelet_log(&[(t(1), b"x")]),
        vec![Open::Fail(error)],
        vec![RunState::Running],
    );
    let sink = run(&script, None, &CancellationToken::new()).await;
    assert_eq!(script.opened.lock().unwrap().len(), 1);
    sink.texts()
}

#[tokio::test]
async fn a_refusal_is_said_once_and_final() {
    assert_eq!(
        said_when_the_first_open_fails(OpenError::Final("pods/log is forbidden".into())).await,
        ["[pullman] no logs from this container: pods/log is forbidden"]
    );
}

#[tokio::test]
async fn a_refusal_is_final_for_a_log_never_read_and_retried_for_one_read_before() {
    let forbidden = || OpenError::Refused("RBAC: role \"executor\" not found".into());
    assert_eq!(
        said_when_the_first_open_fails(forbidden()).await,
        ["[pullman] no logs from this container: RBAC: role \"executor\" not found"]
    );
    // An API server restarted mid-stream refuses until its authorizer has the Roles again.
    let restarted = broken_halfway(
        6,
        [
            Open::Fail(forbidden()),
            Open::Fail(forbidden()),
            Open::Give {
                bytes: None,
                breaks: false,
            },
        ],
        RunState::Ended,
    );
    let sink = run(&restarted, None, &CancellationToken::new()).await;
    let want: Vec<String> = (0..6).map(|i| format!("line {i}")).collect();
    assert_eq!(sink.texts(), want, "every line once, no notice");
}

#[tokio::test]
async fn lines_that_cannot_be_read_by_the_verdict_are_said_missing_from_their_time() {
    let script = broken_halfway(
        6,
        (0..100).map(|_| Open::Fail(OpenError::Transient("kubelet gone".into()))),
        RunState::Running,
    );
    let stop = CancellationToken::new();
    let stopper = stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        stopper.cancel();
    });
    let sink = run(&script, None, &stop).await;
    let texts = sink.texts();
    let last = texts.last().unwrap();
    assert!(
        last.starts_with("[pullman] lines of this container after ")
            && last.ends_with("kubelet gone"),
        "{texts:?}"
    );
    assert!(
        texts.len() >= 2
            && texts[..texts.len() - 1]
                .iter()
                .all(|l| l.starts_with("line "))
    );
}

#[tokio::test]
async fn a_resumed_run_starts_after_what_the_server_has() {
    let lines = numbered(8);
    let script = Script::new(log_of(&lines), vec![], vec![RunState::Ended]);
    // The server has lines 0..=4: line 4 shares its microsecond with line 5.
    let start = Some(ResumePoint {
        at: lines[4].0,
        lines_at: 1,
    });
    let sink = run(&script, start, &CancellationToken::new()).await;
    assert_eq!(sink.texts(), ["line 5", "line 6", "line 7"]);
}

#[test]
fn kubelet_timestamps_are_split_off_with_their_nanoseconds() {
    let (at, text) = split_timestamp("2026-01-02T03:04:05.123456789Z hello world");
    assert_eq!(text, "hello world");
    let at = at.unwrap();
    assert_eq!(at.timestamp_subsec_nanos(), 123_456_789);
    let (at2, _) = split_timestamp("2026-01-02T03:04:05.123456790Z next");
    assert!(at2.unwrap() > at);
    assert_eq!(split_timestamp("no stamp here"), (None, "no stamp here"));
    assert_eq!(split_timestamp("2026-01-02T03:04:05Z ").1, "");
}

#[test]
fn a_resumed_stream_skips_exactly_the_lines_stored_before() {
    // Stored: lines at 1, 2, 2 (two within one microsecond). The log gives 1, 2, 2, 2, 3.
    let mut point = None;
    for at in [t(1), t(2), t(2)] {
        ResumePoint::see(&mut point, at);
    }
    assert_eq!(
        point,
        Some(ResumePoint {
            at: t(2),
            lines_at: 2
        })
    );
    let mut resume = Resume::new(point);
    let sent: Vec<bool> = [t(1), t(2), t(2), t(2), t(3)]
        .into_iter()
        .map(|at| !resume.sent_before(at))
        .collect();
    assert_eq!(sent, [false, false, false, true, true]);
    let mut fresh = Resume::new(None);
    assert!(!fresh.sent_before(t(0)));
}

#[test]
fn a_kubelet_time_cut_to_microseconds_equals_the_stored_one() {
    let (at, _) = split_timestamp("2026-01-02T03:04:05.123456789Z x");
    let cut = at.unwrap().trunc_subsecs(6);
    assert_eq!(cut.timestamp_subsec_nanos(), 123_456_000);
    let stored: DateTime<Utc> = "2026-01-02T03:04:05.123456Z".parse().unwrap();
    assert_eq!(cut, stored);
}

#[tokio::test]
async fn a_run_replaced_while_its_stream_was_broken_is_read_on_as_the_previous_run() {
    // The stream of run 0 breaks; meanwhile the container restarted (run 1 has its own
    // follower). The rest of run 0 is in the previous run's log, not the current one.
    let script = broken_halfway(8, [], RunState::Replaced);
    let sink = run(&script, None, &CancellationToken::new()).await;
    let want: Vec<String> = (0..8).map(|i| format!("line {i}")).collect();
    assert_eq!(sink.texts(), want);
    let previous: Vec<bool> = script.opened.lock().unwrap().iter().map(|o| o.1).collect();
    assert_eq!(previous, [false, true]);
}

#[tokio::test]
async fn a_run_gone_while_its_stream_was_broken_is_said_lost_once() {
    let script = broken_halfway(8, [], RunState::Gone);
    let sink = run(&script, None, &CancellationToken::new()).await;
    let texts = sink.texts();
    assert!(
        texts.last().unwrap().contains("could not be read"),
        "{texts:?}"
    );
    assert_eq!(script.opened.lock().unwrap().len(), 1, "not reopened");
}

#[tokio::test]
async fn at_the_verdict_a_log_that_ends_cleanly_is_whole_even_if_the_status_lags() {
    // The last line has no newline and the status still says running: after the verdict the
    // clean end is trusted, the last line sent, and nothing said missing.
    let log = kubelet_log(&[(t(1), b"one")]);
    let mut log_no_newline = log.clone();
    log_no_newline.extend_from_slice(b"2027-01-15T08:00:00.000002000Z last");
    let script = Script::new(log_no_newline, vec![], vec![RunState::Running]);
    let stop = CancellationToken::new();
    stop.cancel();
    let sink = run(&script, None, &stop).await;
    assert_eq!(sink.texts(), ["one", "last"]);
}
