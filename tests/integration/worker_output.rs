//! The worker sends its command's output to the server (docs/design.md §9, issue #24): the `pullman`
//! binary as worker against a real `pullman serve` on real PostgreSQL. Lines arrive in order with
//! their streams while the command runs, the token and `--redact-env` values never leave the
//! agent (a multi-line value whole and line by line), a server that goes away and comes back
//! loses nothing while the command runs on, and a command that prints faster than a healthy
//! server stores is held back rather than losing lines.

use crate::support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::serve::Restartable;
use support::worker::{all_output, run_worker_once};
use support::{ApiClient, TestServer, eventually, pullman_bin};

/// Every stored line of the order, which must fit in one page of 10,000.
async fn one_page(api: &ApiClient, id: &str) -> Vec<Value> {
    let (status, v) = api
        .admin_get(&format!("/api/v1/work-orders/{id}/output?limit=10000"))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["more"], false, "{v}");
    v["lines"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_commands_lines_arrive_in_order_redacted_and_survive_a_server_outage() {
    let mut serve = Restartable::start(&["--maintenance-interval-seconds", "1"]).await;
    let (api, base) = (serve.api.clone(), serve.base.clone());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_, token) = api
        .agent(json!({"name": "talker", "labels": ["talk"]}))
        .await;
    let id = api.order(custom_order("talk")).await;

    // The command prints, then waits for the test at two gates; between them it prints 2,000
    // lines while the server is down and says so in a file (it must never wait on the server).
    let exec = format!(
        r#"echo "line 1"; echo "err 1" >&2; echo "my token is $TOKEN_COPY."; echo "the secret: $HIDE_ME!"
        while [ ! -f {d}/go ]; do sleep 0.05; done
        i=1; while [ $i -le 2000 ]; do echo "during the outage $i"; i=$((i+1)); done
        touch {d}/printed
        while [ ! -f {d}/go2 ]; do sleep 0.05; done
        echo "last line" >&2"#,
        d = d.display()
    );
    let token_file = d.join("token");
    std::fs::write(&token_file, &token).unwrap();
    let mut worker = Command::new(pullman_bin())
        .args(["worker", "--server", &base, "--token-file"])
        .arg(&token_file)
        .args([
            "--lease-seconds",
            "120",
            "--once",
            "--redact-env",
            "HIDE_ME",
        ])
        .args(["--exec", &exec])
        .env("TOKEN_COPY", &token)
        .env("HIDE_ME", "hunter2-very-secret")
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(d.join("worker.log")).unwrap())
        .spawn()
        .unwrap();
    let worker_log = || std::fs::read_to_string(d.join("worker.log")).unwrap_or_default();

    // While the command runs, its first lines are readable within seconds (sent at least once
    // a second).
    let started = Instant::now();
    let first = eventually(30, "the first lines while the command runs", || {
        let (api, id) = (api.clone(), id.clone());
        async move {
            let lines = one_page(&api, &id).await;
            (lines.len() >= 4).then_some(lines)
        }
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    assert!(!d.join("printed").exists());

    // The server goes away; the command prints on and is never held up.
    serve.stop();
    std::fs::write(d.join("go"), "").unwrap();
    eventually(20, "the command to print through the outage", || async {
        d.join("printed").exists().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    serve.start_again().await;
    std::fs::write(d.join("go2"), "").unwrap();
    let entry = api.log_entry(&id, 90).await;
    assert_eq!(entry["outcome"], "succeeded", "{entry}\n{}", worker_log());
    let status = worker.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{}", worker_log());

    let lines = one_page(&api, &id).await;
    let texts = |stream: &str| -> Vec<String> {
        lines
            .iter()
            .filter(|l| l["stream"] == stream)
            .map(|l| l["text"].as_str().unwrap().to_string())
            .collect()
    };
    let mut want = vec![
        "line 1".to_string(),
        "my token is [REDACTED].".into(),
        "the secret: [REDACTED]!".into(),
    ];
    want.extend((1..=2000).map(|i| format!("during the outage {i}")));
    assert_eq!(texts("stdout"), want, "every stdout line once, in order");
    assert_eq!(texts("stderr"), vec!["err 1", "last line"]);
    assert!(
        lines.iter().all(|l| l["marker"].is_null()),
        "nothing was lost, so no gap"
    );
    let all = serde_json::to_string(&lines).unwrap() + &serde_json::to_string(&first).unwrap();
    assert!(!all.contains(&token) && !all.contains("hunter2"), "{all}");
    // One attempt, chunks numbered from 0 without holes.
    let mut seqs: Vec<i64> = lines.iter().map(|l| l["seq"].as_i64().unwrap()).collect();
    seqs.dedup();
    assert_eq!(seqs.first(), Some(&0));
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    // The worker's own log and the result message are redacted too.
    assert!(
        !worker_log().contains("hunter2") && !worker_log().contains(&token),
        "{}",
        worker_log()
    );
    serve.stop();
}

/// A custom order for the agent labelled `label`, not retried.
fn custom_order(label: &str) -> Value {
    json!({
        "work_type": "custom",
        "yaml_content": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n",
        "max_retries": 0,
        "targeting": {"labels": [label]},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_line_secret_is_hidden_whole_and_line_by_line_and_a_short_one_is_refused() {
    let s = TestServer::start().await;
    let (_, token) = s.agent(json!({"name": "keeper", "labels": ["keep"]})).await;
    let id = s.order(custom_order("keep")).await;
    let multi = "line-one-secret\nline-two-secret";
    // PEM-like: the short lines `{` and `}` are not hidden on their own, and said so.
    let jsonish = "{\n  \"key\": \"k3y-material-xyz\"\n}";
    // The value whole, line by line, inside other text, on both streams, and in the result.
    let exec = r#"printf '%s\n' "$MULTI"; echo "whole: $MULTI :end"
        printf '%s\n' "$MULTI" | while read -r l; do echo "line by line: $l"; done
        echo "$MULTI" >&2; echo "$JSONISH"; echo "$JSONISH" | grep key
        printf 'no newline at the end: %s' "$MULTI""#;
    let run = run_worker_once(
        &s.base,
        &token,
        &["--redact-env", "MULTI,JSONISH", "--exec", exec],
        &[("MULTI", multi), ("JSONISH", jsonish)],
        60,
    )
    .await;
    assert_eq!(run.code, Some(0), "{}", run.printed());
    let lines = all_output(&s.base, &id).await;
    let texts: Vec<&str> = lines.iter().map(|l| l["text"].as_str().unwrap()).collect();
    let entry = s.log_entry(&id, 10).await;
    let stored = format!("{}\n{entry}", texts.join("\n"));
    for secret in ["line-one-secret", "line-two-secret", "k3y-material-xyz"] {
        assert!(!stored.contains(secret), "{secret} stored:\n{stored}");
        assert!(
            !run.printed().contains(secret),
            "{secret} printed:\n{}",
            run.printed()
        );
    }
    assert!(texts.contains(&"line by line: [REDACTED]"), "{stored}");
    assert!(
        texts.contains(&"  [REDACTED]"),
        "a line of the value: {stored}"
    );
    assert!(texts.contains(&"whole: [REDACTED] :end"), "{stored}");
    assert!(
        texts.contains(&"no newline at the end: [REDACTED]"),
        "{stored}"
    );
    assert!(
        run.stderr.contains("JSONISH") && run.stderr.contains("not hidden on their own"),
        "a warning names the variable whose short lines are not hidden:\n{}",
        run.stderr
    );

    // Too short to hide without hiding those characters everywhere: refused at start, with the
    // variable named and its value never printed.
    let run = run_worker_once(
        &s.base,
        &token,
        &["--redact-env", "TINY", "--exec", "true"],
        &[("TINY", "q7")],
        30,
    )
    .await;
    assert_eq!(run.code, Some(1), "{}", run.printed());
    assert!(
        run.stderr.contains("--redact-env TINY") && run.stderr.contains("too short"),
        "{}",
        run.stderr
    );
    assert!(!run.printed().contains("q7"), "{}", run.printed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_line_of_a_fast_command_reaches_a_healthy_server_in_order() {
    const LINES: usize = 200_000;
    let s = TestServer::start().await;
    let (_, token) = s.agent(json!({"name": "fast", "labels": ["fast"]})).await;
    let id = s.order(custom_order("fast")).await;
    // About 4.8 MB in 200,000 short lines, as fast as the pipe takes them: more lines than the
    // buffer holds, so the command must be held back, not its lines dropped.
    let exec = format!("seq 1 {LINES} | sed 's/^/a short line, number /'");
    let started = std::time::Instant::now();
    let run = run_worker_once(&s.base, &token, &["--exec", &exec], &[], 120).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let lines = all_output(&s.base, &id).await;
    let markers: Vec<&Value> = lines.iter().filter(|l| !l["marker"].is_null()).collect();
    assert!(markers.is_empty(), "no gap: {markers:?}");
    assert_eq!(lines.len(), LINES, "every line arrives");
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(
            l["text"].as_str().unwrap(),
            format!("a short line, number {}", i + 1),
            "line {} in order",
            i + 1
        );
    }
    assert!(
        !run.stderr.contains("dropping") && !run.stderr.contains("not all delivered"),
        "the worker dropped nothing"
    );
    eprintln!("200,000 lines delivered in {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_dropped_while_the_server_is_away_are_marked_with_that_cause() {
    let mut serve = Restartable::start(&["--maintenance-interval-seconds", "1"]).await;
    let (api, base) = (serve.api.clone(), serve.base.clone());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_, token) = api.agent(json!({"name": "away", "labels": ["away"]})).await;
    let id = api.order(custom_order("away")).await;
    // 3 MB while the server is down, three times the smallest buffer: the command runs on and
    // the oldest of them are dropped.
    let exec = format!(
        r#"echo "before"; while [ ! -f {d}/go ]; do sleep 0.05; done
        seq 1 30000 | sed 's/$/ ......................................................................................../'
        touch {d}/printed; while [ ! -f {d}/go2 ]; do sleep 0.05; done; echo "after""#,
        d = d.display()
    );
    let worker = tokio::spawn({
        let (base, token) = (base.clone(), token.clone());
        async move {
            run_worker_once(
                &base,
                &token,
                &["--output-buffer-bytes", "1048576", "--exec", &exec],
                &[],
                120,
            )
            .await
        }
    });
    eventually(30, "the first line", || async {
        (!one_page(&api, &id).await.is_empty()).then_some(())
    })
    .await;
    serve.stop();
    std::fs::write(d.join("go"), "").unwrap();
    eventually(30, "the command to print through the outage", || async {
        d.join("printed").exists().then_some(())
    })
    .await;
    serve.start_again().await;
    std::fs::write(d.join("go2"), "").unwrap();
    let run = worker.await.unwrap();
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let lines = all_output(&base, &id).await;
    let gaps: Vec<&str> = lines
        .iter()
        .filter(|l| l["marker"] == "gap")
        .map(|l| l["text"].as_str().unwrap())
        .collect();
    assert!(!gaps.is_empty(), "a gap is marked");
    for gap in &gaps {
        assert!(
            gap.ends_with("its buffer was full while the server was unreachable]"),
            "{gap}"
        );
    }
    let last = lines.last().unwrap();
    assert_eq!(last["text"], "after", "the lines after the gap arrive");
    assert!(
        run.stderr.contains("dropping the oldest lines")
            && run.stderr.contains("the server is unreachable"),
        "the worker's log says it drops and why:\n{}",
        run.stderr
            .lines()
            .filter(|l| l.contains("WARN"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    serve.stop();
}
