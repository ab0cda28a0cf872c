//! The admin CLI past the happy path (issue #23), the binary against a real server: token files
//! end 0600 whatever was there, `--token-out` into a missing folder registers nothing, no command
//! panics on a closed pipe, a reused agent name means the live agent, and messages speak in
//! flags and say what to do.

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::process::{Output, Stdio};

use serde_json::{Value, json};
use support::cli::{assert_printed, cli, cli_command, create_args, text};
use support::{TestServer, configmap_order, free_port};

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Sets `file`'s mode to `mode_before`, runs `pullman ARGS --token-out FILE` and checks that it
/// succeeded and left the file 0600 whatever its mode was; returns what the file then holds. The
/// create and the rotate of a token go through the same steps.
async fn write_token(
    s: &TestServer,
    args: &[&str],
    file: &std::path::Path,
    mode_before: u32,
) -> String {
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(mode_before)).unwrap();
    let out = cli(
        &s.base,
        &[args, &["--token-out", file.to_str().unwrap()]].concat(),
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(mode(file), 0o600);
    std::fs::read_to_string(file).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_files_end_0600_and_a_missing_folder_registers_nothing() {
    let s = TestServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.token");
    std::fs::write(&file, "old").unwrap();
    let token = write_token(&s, &["agents", "create", "--name", "a"], &file, 0o666).await;
    let (st, _) = s.get_as("/api/v1/whoami", token.trim()).await;
    assert_eq!(st, 200, "the file holds the agent's token");

    let rotated = write_token(&s, &["agents", "rotate-token", "a"], &file, 0o644).await;
    assert_ne!(rotated, token);
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(leftovers.len(), 1, "no temporary file left: {leftovers:?}");

    // Into a folder that does not exist: an error before anything is registered or rotated.
    let missing = dir.path().join("nope").join("b.token");
    for args in [
        vec!["agents", "create", "--name", "b"],
        vec!["agents", "rotate-token", "a"],
    ] {
        let mut args = args.clone();
        args.extend(["--token-out", missing.to_str().unwrap()]);
        let out = cli(&s.base, &args).await;
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_printed(&out.stderr, "does not exist");
    }
    let (_, agents) = s.admin_get("/api/v1/agents").await;
    let names: Vec<_> = agents["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].clone())
        .collect();
    assert_eq!(names, [json!("a")], "b was not registered");
    let still = std::fs::read_to_string(&file).unwrap();
    let (st, _) = s.get_as("/api/v1/whoami", still.trim()).await;
    assert_eq!(st, 200, "a's token was not rotated away");
}

/// Runs the CLI with its stdout a pipe whose reader is already gone.
fn into_closed_pipe(server: &str, args: &[&str]) -> Output {
    let (reader, writer) = nix::unistd::pipe().unwrap();
    drop(reader);
    let mut cmd = cli_command(server, args);
    cmd.stdout(Stdio::from(writer)).stderr(Stdio::piped());
    cmd.output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_command_panics_on_a_closed_pipe() {
    let s = TestServer::start().await;
    let (agent, token) = s.agent(json!({"name": "p", "labels": ["p"]})).await;
    let active = s.order(configmap_order("p")).await;
    let (st, claimed) = s.claim_next(&agent, &token, None).await;
    assert_eq!(st, 200, "{claimed}");
    let (st, _) = s
        .complete(
            &active,
            &token,
            json!({"agent_id": agent, "claim_id": claimed["claim_id"], "success": true}),
        )
        .await;
    assert_eq!(st, 200);
    let finished = active;
    let pending = s.order(configmap_order("p")).await;
    let yaml = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        yaml.path(),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n",
    )
    .unwrap();
    let yaml = yaml.path().to_str().unwrap();
    let mut cases: Vec<Vec<&str>> = vec![
        vec!["completion", "bash"],
        vec!["completion", "zsh"],
        vec!["crdgen"],
        vec!["--help"],
        vec!["work-orders", "--help"],
        vec!["agents", "list"],
        vec!["agents", "get", "p", "-o", "wide"],
        vec!["agents", "create", "--name", "q", "-o", "json"],
        vec!["work-orders", "list", "-o", "wide"],
        vec!["work-orders", "get", &pending],
        vec!["work-orders", "get", &pending, "-o", "yaml"],
        vec![
            "work-orders",
            "create",
            "-f",
            yaml,
            "--label",
            "z",
            "-o",
            "name",
        ],
        vec!["work-orders", "wait", &finished],
        vec!["work-orders", "rerun", &finished],
        vec!["log", "list", "-o", "wide"],
        vec!["log", "get", &finished, "-o", "wide"],
        vec!["log", "get", &finished],
    ];
    for output in ["table", "json", "yaml", "name"] {
        cases.push(vec!["log", "list", "-o", output]);
    }
    let cases: Vec<Vec<String>> = cases
        .into_iter()
        .map(|c| c.into_iter().map(String::from).collect())
        .collect();
    let server = s.base.clone();
    let results = tokio::task::spawn_blocking(move || {
        cases
            .iter()
            .map(|args| {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                (args.join(" "), into_closed_pipe(&server, &args))
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    for (args, out) in results {
        let err = text(&out.stderr);
        assert!(!err.contains("panicked"), "{args}: {err}");
        // As git, gh and kubectl end: by SIGPIPE (a shell shows 141), or 0 (clap's --help).
        let quiet = out.status.signal() == Some(nix::libc::SIGPIPE) || out.status.code() == Some(0);
        assert!(quiet, "{args}: {:?} {err}", out.status);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_name_means_the_live_agent() {
    let s = TestServer::start().await;
    let (old, _) = s.agent(json!({"name": "ow"})).await;
    let out = cli(&s.base, &["agents", "retire", "ow"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (new, _) = s.agent(json!({"name": "ow"})).await;
    assert_ne!(old, new);
    let out = cli(&s.base, &["agents", "get", "ow", "-o", "json"]).await;
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["id"], json!(new), "{got}");
    let out = cli(&s.base, &["agents", "rotate-token", "ow"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = cli(&s.base, &["agents", "retire", "ow"]).await;
    assert_printed(&out.stdout, &new);
    let (_, v) = s.admin_get(&format!("/api/v1/agents/{new}")).await;
    assert_eq!(v["health"], "retired");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_say_what_to_do_in_the_users_words() {
    let s = TestServer::start().await;
    let port = s.base.rsplit(':').next().unwrap().to_string();
    let bare = format!("127.0.0.1:{port}");
    let with_path = format!("{}/api/v1", s.base);
    let tls = format!("https://127.0.0.1:{port}");
    for (server, code, says) in [
        (
            bare.as_str(),
            2,
            "give the scheme too, e.g. http://127.0.0.1:",
        ),
        (with_path.as_str(), 2, "Pullman adds /api/v1 itself"),
        (
            tls.as_str(),
            1,
            "does not answer TLS (https); if it serves plain HTTP, use http://",
        ),
    ] {
        let out = cli(server, &["agents", "list"]).await;
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{server}: {err}");
        assert!(err.contains(says), "{server}: {err}");
    }

    // Errors name the flags the user typed, not the API's fields.
    let yaml = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        yaml.path(),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n",
    )
    .unwrap();
    let file = yaml.path().to_str().unwrap();
    let out = cli(&s.base, &create_args(file, "m", &["--max-retries", "500"])).await;
    let err = text(&out.stderr);
    assert!(
        err.contains("--max-retries") && !err.contains("max_retries"),
        "{err}"
    );
    let empty = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(empty.path(), "---\n").unwrap();
    let out = cli(
        &s.base,
        &create_args(empty.path().to_str().unwrap(), "m", &[]),
    )
    .await;
    let err = text(&out.stderr);
    assert!(
        err.contains("-f FILE") && !err.contains("yaml_content"),
        "{err}"
    );

    // States in any case, as they are shown.
    for args in [
        vec!["work-orders", "list", "--status", "pending"],
        vec!["work-orders", "list", "--status", "retry-pending"],
        vec!["log", "list", "--outcome", "FAILED"],
    ] {
        let out = cli(&s.base, &args).await;
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    }

    // `-o name --wait` prints the id even when the wait times out.
    let out = cli(
        &s.base,
        &create_args(file, "m", &["-o", "name", "--wait", "--timeout", "1"]),
    )
    .await;
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();
    assert!(uuid::Uuid::parse_str(&id).is_ok(), "stdout: {id:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_against_a_server_that_is_not_there_fails_at_once() {
    let nobody = format!("http://127.0.0.1:{}", free_port());
    let started = std::time::Instant::now();
    let out = cli(
        &nobody,
        &["work-orders", "wait", &uuid::Uuid::new_v4().to_string()],
    )
    .await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("cannot reach the Pullman server"));
    assert!(started.elapsed() < std::time::Duration::from_secs(15));
}
