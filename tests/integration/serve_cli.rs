//! `pullman serve` on the embedded PostgreSQL (start, stop, restart, nothing lost, no stray
//! process) and the admin CLI against a running server.

use crate::support;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use support::cli::json_of;
use support::serve::{
    postgres_processes_for, sigterm_and_wait, start_serve, start_serve_logging, wait_ready,
};
use support::{free_port, pullman_bin};

fn cli(port: u16, token_file: &Path, args: &[&str]) -> Output {
    Command::new(pullman_bin())
        .args(args)
        .args([
            "--server",
            &format!("http://127.0.0.1:{port}"),
            "--token-file",
        ])
        .arg(token_file)
        .env_remove("PULLMAN_ADMIN_TOKEN")
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_keeps_its_data_across_restarts_and_cli_works_against_it() {
    let dir = tempfile::tempdir().unwrap();
    {
        // The embedded PostgreSQL may run as an unprivileged user, who must reach the data dir.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let data = dir.path().join("data");
    let port = free_port();
    let serve = start_serve(&data, port);
    wait_ready(port).await;
    let token_file = data.join("admin-token");
    let mode = std::fs::metadata(&token_file).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );

    // Admin CLI: create an agent and a work order, list, get.
    let agent = json_of(&cli(
        port,
        &token_file,
        &[
            "agents",
            "create",
            "--name",
            "cli-agent",
            "--label",
            "c",
            "-o",
            "json",
        ],
    ));
    assert_eq!(agent["agent"]["name"], "cli-agent");
    assert!(agent["token"].as_str().unwrap().starts_with("pullman_"));
    let manifest = dir.path().join("cm.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kept\n",
    )
    .unwrap();
    let order = json_of(&cli(
        port,
        &token_file,
        &[
            "work-orders",
            "create",
            "-f",
            manifest.to_str().unwrap(),
            "--label",
            "c",
            "-o",
            "json",
        ],
    ));
    let id = order["id"].as_str().unwrap().to_string();
    let list = json_of(&cli(
        port,
        &token_file,
        &["work-orders", "list", "-o", "json"],
    ));
    assert_eq!(list[0]["id"], id.as_str());
    let table = cli(port, &token_file, &["work-orders", "list"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.starts_with("ID") && text.contains(&id) && text.contains("PENDING"),
        "{text}"
    );
    let agents =
        String::from_utf8_lossy(&cli(port, &token_file, &["agents", "list"]).stdout).to_string();
    assert!(
        agents.contains("cli-agent") && agents.contains("never_seen"),
        "{agents}"
    );

    // Clear errors for a wrong token and a wrong URL.
    let bad_token = dir.path().join("bad-token");
    std::fs::write(&bad_token, "not-the-token").unwrap();
    let out = cli(port, &bad_token, &["work-orders", "list"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("401") && err.contains("token"), "{err}");
    let out = cli(free_port(), &token_file, &["agents", "list"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach the Pullman server"), "{err}");

    // Stop with SIGTERM: clean exit, no stray postgres.
    let status = sigterm_and_wait(serve);
    assert!(status.success(), "serve exit status {status}");
    assert!(
        postgres_processes_for(&data).is_empty(),
        "stray postgres: {:?}",
        postgres_processes_for(&data)
    );

    // Start again: the order is still there; cancel it through the CLI.
    let port = free_port();
    let serve = start_serve(&data, port);
    wait_ready(port).await;
    let got = json_of(&cli(
        port,
        &token_file,
        &["work-orders", "get", &id, "-o", "json"],
    ));
    assert_eq!(got["status"], "PENDING");
    assert!(got["yaml_content"].as_str().unwrap().contains("kept"));
    let cancelled = json_of(&cli(
        port,
        &token_file,
        &["work-orders", "cancel", &id, "-o", "json"],
    ));
    assert_eq!(cancelled["outcome"], "cancelled");
    let log = json_of(&cli(port, &token_file, &["log", "get", &id, "-o", "json"]));
    assert_eq!(log["outcome"], "cancelled");
    let status = sigterm_and_wait(serve);
    assert!(status.success());
    assert!(postgres_processes_for(&data).is_empty());
}

#[test]
fn serve_without_postgres_binaries_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(pullman_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .env_remove("DATABASE_URL")
        .env("PATH", "/nonexistent")
        .env("PULLMAN_POSTGRES_BIN_DIR", "/nonexistent")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no PostgreSQL server binaries found") && err.contains("DATABASE_URL"),
        "{err}"
    );
}

/// `--controller auto` with a kubeconfig whose API server is gone: serve runs without the
/// controller and stops promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_an_unreachable_kubernetes_api_runs_without_the_controller_and_stops() {
    let db = support::fresh_database_url().await;
    // A kubeconfig pointing at a port nobody listens on.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let api = listener.local_addr().unwrap();
    drop(listener);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: 'http://{api}'}}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\nusers:\n- name: u\n  user: {{token: x}}\n"
        ),
    )
    .unwrap();
    let port = free_port();
    let child = Command::new(pullman_bin())
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--controller",
            "auto",
        ])
        .env("DATABASE_URL", &db)
        .env("KUBECONFIG", &kubeconfig)
        .env("PULLMAN_ADMIN_TOKEN", support::ADMIN_TOKEN)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_ready(port).await;
    let started = std::time::Instant::now();
    let status = sigterm_and_wait(child);
    assert!(status.success(), "{status}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "stopped in {:?}",
        started.elapsed()
    );
}

/// Issue #15: a second `serve` on a data dir in use refuses with a clear message (it used to share
/// the first one's embedded PostgreSQL, then stop it); the first keeps serving. A restart that
/// finds the generated token file says it read it, not that it generated one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_serve_on_a_data_dir_in_use_is_refused_and_a_restart_reads_the_token() {
    let dir = tempfile::tempdir().unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let data = dir.path().join("data");
    let first_log = dir.path().join("first.log");
    let port = free_port();
    let first = start_serve_logging(&data, port, std::fs::File::create(&first_log).unwrap());
    wait_ready(port).await;
    let said = std::fs::read_to_string(&first_log).unwrap();
    assert!(said.contains("admin token: generated"), "{said}");

    let second = Command::new(pullman_bin())
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{}", free_port()),
            "--data-dir",
        ])
        .arg(&data)
        .args(["--controller", "off"])
        .env_remove("DATABASE_URL")
        .env_remove("PULLMAN_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        err.contains("is in use by another pullman process")
            && err.contains(&format!("pid {}", first.id())),
        "{err}"
    );
    // `migrate` on the same dir is refused the same way.
    let migrate = Command::new(pullman_bin())
        .args(["migrate", "--data-dir"])
        .arg(&data)
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(!migrate.status.success());
    assert!(String::from_utf8_lossy(&migrate.stderr).contains("in use"));
    // A second serve on the port in use is refused at once, before it starts a database.
    let other = dir.path().join("other");
    let started = std::time::Instant::now();
    let busy = Command::new(pullman_bin())
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
        ])
        .arg(&other)
        .args(["--controller", "off"])
        .env_remove("DATABASE_URL")
        .env_remove("PULLMAN_ADMIN_TOKEN")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&busy.stderr);
    assert_eq!(busy.status.code(), Some(1), "{err}");
    assert!(
        err.contains("the address is in use") && err.contains("--listen"),
        "{err}"
    );
    assert!(!err.contains("WARN"), "nothing else is said first: {err}");
    assert!(!other.join("postgres").exists(), "no database was started");
    assert!(started.elapsed() < Duration::from_secs(5));

    // The first still serves, with its database.
    let token_file = data.join("admin-token");
    let agents = cli(port, &token_file, &["agents", "list", "-o", "json"]);
    assert!(
        agents.status.success(),
        "{}",
        String::from_utf8_lossy(&agents.stderr)
    );
    let status = sigterm_and_wait(first);
    assert!(status.success(), "{status}");
    assert!(postgres_processes_for(&data).is_empty());

    // Restart: the token is read from the file written by the first start.
    let token_before = std::fs::read_to_string(&token_file).unwrap();
    let again_log = dir.path().join("again.log");
    let port = free_port();
    let again = start_serve_logging(&data, port, std::fs::File::create(&again_log).unwrap());
    wait_ready(port).await;
    let said = std::fs::read_to_string(&again_log).unwrap();
    assert!(said.contains("admin token: read from this file"), "{said}");
    assert!(!said.contains("admin token: generated"), "{said}");
    assert_eq!(std::fs::read_to_string(&token_file).unwrap(), token_before);
    assert!(sigterm_and_wait(again).success());
}
