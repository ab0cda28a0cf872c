//! `pullman work-orders logs` and `create --wait --logs` (docs/design.md §9, issue #24) as a user runs
//! them, against a real API server and PostgreSQL.

use crate::support;

use std::io::Read;
use std::process::Stdio;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use support::agent::Agent;
use support::cli::{assert_printed, cli, cli_command, create_args, text};
use support::{TestServer, configmap_order};

/// What `logs` prints of the two attempts of the test below, and of the second alone (its
/// boundary line first).
const BOTH_ATTEMPTS: &str = "one\n--- attempt 2 (attempt 1 retry_scheduled: disk full) ---\ntwo\n";
const SECOND_ATTEMPT: &str = "--- attempt 2 (attempt 1 retry_scheduled: disk full) ---\ntwo\n";

/// Claims the agent's next order: (order id, claim id).
async fn claim(agent: &Agent<'_>) -> (String, String) {
    let (st, v) = agent.claim_next(20).await;
    assert_eq!(st, 200, "{v}");
    (
        v["id"].as_str().unwrap().to_string(),
        v["claim_id"].as_str().unwrap().to_string(),
    )
}

/// Sends `texts` on `stream` as output chunk `seq` of `agent`'s claim `claim` on `order`.
async fn send(
    agent: &Agent<'_>,
    order: &str,
    claim: &str,
    seq: i64,
    stream: &str,
    texts: &[String],
) {
    let lines: Vec<Value> = texts
        .iter()
        .map(|t| json!({"stream": stream, "text": t, "at": "2026-12-02T10:00:00.250Z"}))
        .collect();
    let body = json!({"agent_id": agent.id, "claim_id": claim, "seq": seq, "lines": lines});
    let path = format!("/api/v1/work-orders/{order}/output");
    let (st, v) = agent
        .api
        .call(Method::POST, &path, Some(&agent.token), Some(body))
        .await;
    assert_eq!(st, 200, "{v}");
}

/// Completes `agent`'s claim `claim` on `order`, succeeded or not, not to be retried.
async fn finish(agent: &Agent<'_>, order: &str, claim: &str, ok: bool) {
    let body = json!({"claim_id": claim, "success": ok, "retryable": false});
    let (st, v) = agent.complete(order, body).await;
    assert_eq!(st, 200, "{v}");
}

#[tokio::test]
async fn logs_prints_by_id_prefix_with_tail_and_timestamps_and_survives_a_closed_pipe() {
    let s = TestServer::start().await;
    let agent = Agent::register(&s, json!({"name": "cli-logs", "labels": ["cl"]})).await;
    let order = s.order(configmap_order("cl")).await;
    let (_, claim_id) = claim(&agent).await;
    let lines: Vec<String> = (1..=3000).map(|i| format!("line {i}")).collect();
    for (seq, part) in lines.chunks(500).enumerate() {
        send(&agent, &order, &claim_id, seq as i64, "stdout", part).await;
    }
    send(
        &agent,
        &order,
        &claim_id,
        9,
        "job-x-abc/main",
        &["from a pod".to_string()],
    )
    .await;
    let prefix = &order[..8];
    let out = cli(&s.base, &["work-orders", "logs", prefix]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed = text(&out.stdout);
    let mut want = lines.join("\n");
    want.push_str("\n[job-x-abc/main] from a pod\n");
    assert_eq!(printed, want, "every line once, in order, across pages");
    let out = cli(
        &s.base,
        &["work-orders", "logs", prefix, "--tail", "2", "--timestamps"],
    )
    .await;
    assert_eq!(
        text(&out.stdout),
        "2026-12-02T10:00:00.250Z line 3000\n2026-12-02T10:00:00.250Z [job-x-abc/main] from a pod\n"
    );
    // A reader that stops early (| head -1): no panic, quiet end.
    let mut child = cli_command(&s.base, &["work-orders", "logs", prefix])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read off the runtime: the server answering the CLI runs on it.
    let out = tokio::task::spawn_blocking(move || {
        let mut first = [0u8; 6];
        child
            .stdout
            .as_mut()
            .unwrap()
            .read_exact(&mut first)
            .unwrap();
        assert_eq!(&first, b"line 1");
        drop(child.stdout.take());
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        !text(&out.stderr).contains("panicked"),
        "{}",
        text(&out.stderr)
    );
    // Unknown id: exit 1 with a message.
    let out = cli(&s.base, &["work-orders", "logs", "ffffffff"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
}

#[tokio::test]
async fn logs_follow_prints_lines_as_they_come_and_exits_with_the_outcome() {
    let s = TestServer::start().await;
    let agent = Agent::register(&s, json!({"name": "cli-follow", "labels": ["cf"]})).await;
    let order = s.order(configmap_order("cf")).await;
    let (_, claim_id) = claim(&agent).await;
    send(
        &agent,
        &order,
        &claim_id,
        0,
        "stdout",
        &["early".to_string()],
    )
    .await;
    let cmd = cli_command(&s.base, &["work-orders", "logs", &order, "-f"]);
    let run = tokio::task::spawn_blocking(move || {
        let mut cmd = cmd;
        cmd.output().unwrap()
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    let mut want = vec!["early".to_string()];
    for seq in 1..=20 {
        let batch = vec![format!("late {seq}")];
        want.extend(batch.clone());
        send(&agent, &order, &claim_id, seq, "stderr", &batch).await;
    }
    finish(&agent, &order, &claim_id, false).await;
    let out = tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("logs -f ends once the order finished")
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "failed → 3: {}",
        text(&out.stderr)
    );
    assert_eq!(text(&out.stdout), want.join("\n") + "\n");
    assert_printed(&out.stderr, "failed");
}

#[tokio::test]
async fn create_wait_logs_follows_while_it_waits() {
    let s = TestServer::start().await;
    let agent = Agent::register(&s, json!({"name": "cli-create", "labels": ["cc"]})).await;
    let (_dir, file) = support::cli::yaml_file(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: demo\ndata:\n  a: b\n",
    );
    let cmd = cli_command(
        &s.base,
        &create_args(file.to_str().unwrap(), "cc", &["--wait", "--logs"]),
    );
    let run = tokio::task::spawn_blocking(move || {
        let mut cmd = cmd;
        cmd.output().unwrap()
    });
    let (order, claim_id) = claim(&agent).await;
    for seq in 0..5 {
        send(
            &agent,
            &order,
            &claim_id,
            seq,
            "stdout",
            &[format!("step {seq}")],
        )
        .await;
    }
    finish(&agent, &order, &claim_id, true).await;
    let out = tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("create --wait --logs ends")
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "step 0\nstep 1\nstep 2\nstep 3\nstep 4\n"
    );
    // --logs without --wait is a usage error.
    let out = cli(
        &s.base,
        &create_args(file.to_str().unwrap(), "cc", &["--logs"]),
    )
    .await;
    assert_eq!(out.status.code(), Some(2));
}

/// An order's second attempt starts with a boundary line saying how the first ended; `-o json`
/// prints each line as the API's object (stream, attempt, time); `--attempt` past the attempts
/// a finished order had is an error, and `--tail` past the server's bound still prints the last
/// lines (issue #36, points 8 and 10).
#[tokio::test]
async fn logs_mark_each_attempt_print_json_lines_and_refuse_an_attempt_never_made() {
    let s = TestServer::start().await;
    let agent = Agent::register(&s, json!({"name": "cli-tries", "labels": ["ct"]})).await;
    let mut body = configmap_order("ct");
    body["max_retries"] = json!(1);
    body["backoff_seconds"] = json!(1);
    let order = s.order(body).await;
    let (_, first) = claim(&agent).await;
    send(&agent, &order, &first, 0, "stdout", &["one".to_string()]).await;
    let (st, v) = agent
        .complete(
            &order,
            json!({"claim_id": first, "success": false, "retryable": true, "message": "disk full"}),
        )
        .await;
    assert_eq!(st, 202, "a retry is scheduled: {v}");
    let (_, second) = claim(&agent).await;
    send(&agent, &order, &second, 0, "stdout", &["two".to_string()]).await;
    finish(&agent, &order, &second, true).await;

    let out = cli(&s.base, &["work-orders", "logs", &order]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), BOTH_ATTEMPTS);
    // Only the second attempt, from its start: its boundary says what came before.
    let out = cli(&s.base, &["work-orders", "logs", &order, "--attempt", "2"]).await;
    assert_eq!(text(&out.stdout), SECOND_ATTEMPT);

    let out = cli(&s.base, &["work-orders", "logs", &order, "-o", "json"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    let seen: Vec<(Value, Value, Value)> = lines
        .iter()
        .map(|l| (l["text"].clone(), l["attempt"].clone(), l["stream"].clone()))
        .collect();
    assert_eq!(
        seen,
        vec![
            (json!("one"), json!(1), json!("stdout")),
            (json!("two"), json!(2), json!("stdout")),
        ]
    );
    assert!(lines.iter().all(|l| l["at"].is_string()), "{lines:?}");

    let out = cli(&s.base, &["work-orders", "logs", &order, "--attempt", "3"]).await;
    assert!(!out.status.success(), "attempt 3 was never made");
    assert!(
        text(&out.stderr).contains("--attempt 3")
            && text(&out.stderr).contains("finished after 2 attempts"),
        "{}",
        text(&out.stderr)
    );
    let out = cli(&s.base, &["work-orders", "logs", &order, "-o", "yaml"]).await;
    assert!(!out.status.success());
    assert_printed(&out.stderr, "-o json");

    let out = cli(&s.base, &["work-orders", "logs", &order, "--tail", "10001"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), BOTH_ATTEMPTS);
    let out = cli(&s.base, &["work-orders", "logs", &order, "--tail", "1"]).await;
    assert_eq!(
        text(&out.stdout),
        SECOND_ATTEMPT,
        "a tail that starts in a later attempt says which"
    );
}
