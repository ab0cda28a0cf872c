//! Reading where an order's streams stopped (`read_resume_points`) against a server whose reads
//! fail part-way (issue #35): a partial read is never used, so no line is sent twice.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::Query;
use axum::http::StatusCode;
use chrono::{DateTime, TimeZone, Utc};

use super::*;

const STREAM: &str = "job-pod/main";

fn at(second: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 5, 10, 0, second).unwrap()
}

fn line(cursor: i64, second: u32) -> serde_json::Value {
    serde_json::json!({"cursor": cursor, "claim_id": Uuid::nil(), "attempt": 1, "seq": 0,
        "stream": STREAM, "text": format!("line {cursor}"), "at": at(second)})
}

/// Serves an order's stored output in two pages (lines at :01 and :02, then :03). The second
/// page answers `500` as long as `failures` says (`usize::MAX`: always). Returns the server's
/// URL and how many times each page was asked for.
async fn two_pages(failures: usize) -> (String, Arc<[AtomicUsize; 2]>) {
    let asked: Arc<[AtomicUsize; 2]> = Arc::default();
    let count = asked.clone();
    let app = axum::Router::new().route(
        "/api/v1/work-orders/{id}/output",
        axum::routing::get(move |Query(q): Query<HashMap<String, String>>| {
            let count = count.clone();
            async move {
                let page = match q.get("after").map(String::as_str) {
                    None => {
                        count[0].fetch_add(1, Ordering::SeqCst);
                        serde_json::json!({"lines": [line(1, 1), line(2, 2)],
                            "next_cursor": 2, "more": true, "finished": false})
                    }
                    Some("2") => {
                        if count[1].fetch_add(1, Ordering::SeqCst) < failures {
                            let e = r#"{"error":{"code":"internal","message":"try again"}}"#;
                            return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
                        }
                        serde_json::json!({"lines": [line(3, 3)], "next_cursor": 3,
                            "more": false, "finished": false})
                    }
                    Some(other) => panic!("no page after {other}"),
                };
                (StatusCode::OK, page.to_string())
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, asked)
}

#[tokio::test]
async fn a_read_that_fails_part_way_is_read_again_from_the_start() {
    let (url, asked) = two_pages(2).await;
    let client = ApiClient::new(&url, "token").unwrap();
    let resumes = read_within(client, Uuid::nil(), at(30), Duration::from_secs(20)).await;
    let asked = asked.each_ref().map(|n| n.load(Ordering::SeqCst));
    assert_eq!(asked, [3, 3], "each attempt reads from the first page");
    let (start, notice) = resumes.start(STREAM);
    assert_eq!(
        start,
        Some(ResumePoint {
            at: at(3),
            lines_at: 1
        }),
        "the stream starts after the last stored line, not where the failed read stopped"
    );
    assert_eq!(notice, None);
}

#[tokio::test]
async fn a_read_that_never_ends_starts_every_stream_at_the_claim_and_says_so() {
    let (url, asked) = two_pages(usize::MAX).await;
    let client = ApiClient::new(&url, "token").unwrap();
    let resumes = read_within(client, Uuid::nil(), at(30), Duration::from_secs(1)).await;
    assert!(
        asked[1].load(Ordering::SeqCst) >= 1,
        "the second page was asked for"
    );
    let (start, notice) = resumes.start(STREAM);
    // Not :02, where the partial read stopped: starting there would send :03 again.
    assert_eq!(
        start,
        Some(ResumePoint {
            at: at(30),
            lines_at: 0
        })
    );
    let notice = notice.expect("a line saying earlier lines may be missing");
    assert!(
        notice.contains("before 2026-12-05T10:00:30Z are not sent again")
            && notice.contains("did not answer in time"),
        "{notice}"
    );
}
