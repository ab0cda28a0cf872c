//! The output sender's buffer and chunks: back-pressure, drops counted as gaps, chunks sized
//! by their JSON, and a `413` answered by splitting the chunk.

use super::send::take_chunk;
use super::*;
use crate::wire::{DroppedReason, OutputChunk};

fn shared(server: ServerState) -> Arc<Shared> {
    let buffer = Buffer {
        server,
        ..Buffer::default()
    };
    Arc::new(Shared {
        buffer: Mutex::new(buffer),
        wake: Notify::new(),
        room: Notify::new(),
        limit: CHUNK_BUDGET_BYTES,
        redactor: Redactor::default(),
    })
}

#[tokio::test]
async fn while_the_server_is_away_the_buffer_drops_the_oldest_and_counts_them() {
    let h = OutputHandle {
        shared: shared(ServerState::Away),
    };
    let line = "x".repeat(1000);
    let n = 2 * CHUNK_BUDGET_BYTES / 1000;
    for _ in 0..n {
        h.push("stdout", &line, Utc::now()).await;
    }
    let mut b = h.shared.buffer();
    assert!(b.held <= CHUNK_BUDGET_BYTES);
    let kept = b.lines.len();
    assert_eq!(b.dropped, ((n - kept) * 1000) as u64);
    let (lines, dropped, cause) = take_chunk(&mut b, CHUNK_BUDGET_BYTES);
    assert!(
        lines.len() < kept,
        "a chunk also counts the JSON around each line"
    );
    assert_eq!(dropped, ((n - kept) * 1000) as u64);
    assert_eq!(cause, Some(ServerState::Away));
    assert_eq!((b.dropped, b.dropped_while), (0, None));
}

#[tokio::test]
async fn while_the_server_accepts_a_full_buffer_holds_the_producer_back() {
    let h = OutputHandle {
        shared: shared(ServerState::Accepting),
    };
    let line = "y".repeat(1000);
    let fits = CHUNK_BUDGET_BYTES / 1000;
    for _ in 0..fits {
        h.push("stdout", &line, Utc::now()).await;
    }
    let producer = {
        let h = h.clone();
        let line = line.clone();
        tokio::spawn(async move { h.push("stdout", &line, Utc::now()).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!producer.is_finished(), "waits for room");
    let (lines, _, _) = take_chunk(&mut h.shared.buffer(), CHUNK_BUDGET_BYTES);
    h.shared.room.notify_waiters();
    producer.await.unwrap();
    {
        let b = h.shared.buffer();
        assert_eq!(lines.len() + b.lines.len(), fits + 1);
        assert_eq!(b.dropped, 0, "nothing dropped");
    }

    // A server that stops accepting lets a waiting producer in, dropping the oldest.
    while h.shared.buffer().held + 1000 <= CHUNK_BUDGET_BYTES {
        h.push("stdout", &line, Utc::now()).await;
    }
    let producer = {
        let h = h.clone();
        tokio::spawn(async move { h.push("stdout", &line, Utc::now()).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!producer.is_finished());
    h.shared.server_is(ServerState::Refusing(429));
    producer.await.unwrap();
    let b = h.shared.buffer();
    assert_eq!(
        (b.dropped, b.dropped_while),
        (1000, Some(ServerState::Refusing(429)))
    );
}

#[test]
fn a_line_costs_what_its_json_takes() {
    for text in [
        "plain",
        "\u{1b}[31mred\u{1b}[0m",
        "q\"b\\n\n\r\t\u{8}\u{c}\u{1}\u{7f}é",
        "",
    ] {
        let escaped = serde_json::to_string(text).unwrap().len() - 2;
        assert_eq!(json_len(text), escaped, "{text:?}");
    }
}

#[tokio::test]
async fn a_chunk_of_colour_codes_stays_under_the_servers_body_limit() {
    let h = OutputHandle {
        shared: shared(ServerState::Away),
    };
    // 60 KiB lines of ANSI colour codes: their JSON is about 2 × their text.
    let line = "\u{1b}[31mred\u{1b}[0m".repeat(60 * 1024 / 12);
    for _ in 0..30 {
        h.push("stdout", &line, Utc::now()).await;
    }
    let (lines, _, _) = take_chunk(&mut h.shared.buffer(), CHUNK_BUDGET_BYTES);
    let chunk = OutputChunk::of_lines(lines);
    let body = serde_json::to_vec(&chunk).unwrap().len();
    assert!(
        body <= crate::queue::output::MAX_CHUNK_BYTES,
        "{body} bytes"
    );
    assert!(
        body > CHUNK_BUDGET_BYTES / 2,
        "the chunk is still well filled: {body}"
    );
}

/// A server of chunks that answers `refuse(body length)` when it says so (a status and an error
/// body), and otherwise stores the chunk and acknowledges it.
async fn chunk_server<F>(refuse: F) -> (String, Arc<Mutex<Vec<OutputChunk>>>)
where
    F: Fn(usize) -> Option<(u16, &'static str)> + Clone + Send + Sync + 'static,
{
    use axum::body::Bytes;
    use axum::http::StatusCode;
    let stored: Arc<Mutex<Vec<OutputChunk>>> = Arc::default();
    let keep = stored.clone();
    let app = axum::Router::new().route(
        "/api/v1/work-orders/{id}/output",
        axum::routing::post(move |body: Bytes| {
            let (keep, refuse) = (keep.clone(), refuse.clone());
            async move {
                if let Some((status, code)) = refuse(body.len()) {
                    let e = format!(r#"{{"error":{{"code":"{code}","message":"{code}"}}}}"#);
                    return (StatusCode::from_u16(status).unwrap(), e);
                }
                let chunk: OutputChunk = serde_json::from_slice(&body).unwrap();
                let answer = format!(r#"{{"seq":{},"lines":{}}}"#, chunk.seq, chunk.lines.len());
                keep.lock().unwrap().push(chunk);
                (StatusCode::OK, answer)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, stored)
}

/// A server that answers `413` to a body over `limit` bytes and stores the rest.
async fn small_server(limit: usize) -> (String, Arc<Mutex<Vec<OutputChunk>>>) {
    chunk_server(move |len| (len > limit).then_some((413, "payload_too_large"))).await
}

#[tokio::test]
async fn a_chunk_the_server_finds_too_large_is_split_and_nothing_is_lost() {
    let (url, stored) = small_server(100_000).await;
    let config = OutputConfig {
        client: Client::new(&url, "token").unwrap(),
        agent_id: Uuid::nil(),
        buffer_bytes: DEFAULT_BUFFER_BYTES,
        redactor: Redactor::default(),
    };
    let sender = OutputSender::start(&config, Uuid::nil(), Uuid::nil(), 0);
    let h = sender.handle();
    let texts: Vec<String> = (0..60)
        .map(|i| format!("{i:04} {}", "z".repeat(10_000)))
        .collect();
    for t in &texts {
        h.push("stdout", t, Utc::now()).await;
    }
    assert!(
        sender.finish(Duration::from_secs(10)).await,
        "all delivered"
    );
    let chunks = stored.lock().unwrap();
    let got: Vec<&str> = chunks
        .iter()
        .flat_map(|c| c.lines.iter().map(|l| l.text.as_str()))
        .collect();
    assert_eq!(got, texts.iter().map(String::as_str).collect::<Vec<_>>());
    let seqs: Vec<i64> = chunks.iter().map(|c| c.seq).collect();
    assert_eq!(
        seqs,
        (0..chunks.len() as i64).collect::<Vec<_>>(),
        "numbered without holes"
    );
    assert!(chunks.iter().all(|c| c.dropped_bytes.is_none()), "no gap");
}

/// A server that answers `503` until `back_after` has passed since it started, then stores
/// every chunk.
async fn late_server(back_after: Duration) -> (String, Arc<Mutex<Vec<OutputChunk>>>) {
    let started = std::time::Instant::now();
    chunk_server(move |_| (started.elapsed() < back_after).then_some((503, "database_unavailable")))
        .await
}

/// The end-of-order flush that runs out gives up the lines it still holds as one gap, sent
/// after the chunk in flight, so the finished order's output says what is missing and why
/// (issue #35) instead of ending early without a word.
#[tokio::test]
async fn lines_unsent_when_the_flush_runs_out_go_out_as_a_gap() {
    let (url, stored) = late_server(Duration::from_millis(1200)).await;
    let config = OutputConfig {
        client: Client::new(&url, "token").unwrap(),
        agent_id: Uuid::nil(),
        buffer_bytes: 4 * CHUNK_BUDGET_BYTES,
        redactor: Redactor::default(),
    };
    let sender = OutputSender::start(&config, Uuid::nil(), Uuid::nil(), 0);
    let h = sender.handle();
    let total = 1000;
    for i in 0..total {
        h.push("stdout", &format!("{i:04}{}", "w".repeat(996)), Utc::now())
            .await;
    }
    assert!(
        !sender.finish(Duration::from_secs(1)).await,
        "not every line was delivered"
    );
    let chunks = stored.lock().unwrap();
    assert_eq!(chunks.len(), 2, "the chunk in flight, then the gap");
    let (sent, gap) = (&chunks[0], &chunks[1]);
    assert!(!sent.lines.is_empty() && sent.dropped_bytes.is_none());
    assert!(gap.lines.is_empty(), "only the marker");
    assert_eq!(gap.seq, sent.seq + 1);
    assert_eq!(
        gap.dropped_bytes,
        Some(((total - sent.lines.len()) * 1001) as i64),
        "every line not sent is in the gap, with its line ending"
    );
    assert_eq!(gap.dropped_reason, Some(DroppedReason::ServerUnavailable));
}
