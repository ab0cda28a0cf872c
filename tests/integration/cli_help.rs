//! Help that explains (issue #15): every flag and argument of every command has a description,
//! shell completion scripts parse, and `--version` names the commit. Flags are offered where
//! they do something (issue #36: `--log-format` only on the commands that log) and the README's
//! table of `serve` flags is the flags `serve` has.

use crate::support;

use std::collections::BTreeSet;
use std::io::Read;
use std::process::{Command, Stdio};

use clap::CommandFactory;

fn undocumented(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if id == "help" || id == "version" {
            continue;
        }
        let text = arg
            .get_help()
            .or(arg.get_long_help())
            .map(|h| h.to_string())
            .unwrap_or_default();
        if text.trim().is_empty() {
            missing.push(format!("{path} {id}"));
        }
    }
    for sub in cmd.get_subcommands() {
        if sub.get_about().is_none() {
            missing.push(format!("{path} {} (no about)", sub.get_name()));
        }
        undocumented(sub, &format!("{path} {}", sub.get_name()), missing);
    }
}

#[test]
fn every_flag_of_every_command_is_described() {
    let mut missing = Vec::new();
    undocumented(&pullman::cli::Cli::command(), "pullman", &mut missing);
    assert!(missing.is_empty(), "flags without help: {missing:#?}");
}

#[test]
fn wait_help_documents_its_exit_codes() {
    let out = Command::new(env!("CARGO_BIN_EXE_pullman"))
        .args(["work-orders", "wait", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for line in [
        "0  the order succeeded",
        "3  the order failed",
        "4  the order was cancelled",
        "5  --timeout passed",
    ] {
        assert!(help.contains(line), "{line:?} missing from:\n{help}");
    }
}

#[test]
fn completion_scripts_are_valid_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(env!("CARGO_BIN_EXE_pullman"))
            .args(["completion", shell])
            .output()
            .unwrap();
        assert!(out.status.success());
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains("work-orders"), "{shell}");
        if shell == "bash" {
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("pullman.bash");
            std::fs::write(&file, script.as_bytes()).unwrap();
            let checked = Command::new("bash").arg("-n").arg(&file).output().unwrap();
            assert!(
                checked.status.success(),
                "bash -n: {}",
                String::from_utf8_lossy(&checked.stderr)
            );
        }
    }
}

#[test]
fn version_names_the_commit() {
    let out = Command::new(env!("CARGO_BIN_EXE_pullman"))
        .arg("--version")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let expected = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    assert_eq!(
        text,
        format!("pullman {} (commit {expected})", env!("CARGO_PKG_VERSION"))
    );
}

/// Every command's path below `pullman` (`[]`, `["agents"]`, `["agents", "create"]`, …).
fn command_paths(cmd: &clap::Command, path: Vec<String>, out: &mut Vec<Vec<String>>) {
    for sub in cmd.get_subcommands() {
        let mut p = path.clone();
        p.push(sub.get_name().to_string());
        command_paths(sub, p.clone(), out);
    }
    out.push(path);
}

/// `pullman <args> --help`, which must succeed.
fn help_of(args: &[&str]) -> String {
    let out = Command::new(support::pullman_bin())
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?} --help");
    String::from_utf8(out.stdout).unwrap()
}

/// The commands whose processes log through `tracing`; only they take `--log-format`.
const LOGGING_COMMANDS: [&str; 4] = ["serve", "migrate", "executor", "worker"];

#[test]
fn log_format_is_offered_only_by_the_commands_that_log() {
    assert!(help_of(&["serve"]).contains("--log-format"));
    assert!(help_of(&["serve"]).contains("PULLMAN_LOG_FORMAT"));
    assert!(!help_of(&["work-orders", "get"]).contains("--log-format"));
    let mut paths = Vec::new();
    command_paths(&pullman::cli::Cli::command(), Vec::new(), &mut paths);
    assert!(paths.len() > 20, "{paths:?}");
    for path in &paths {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        let logs = args.first().is_some_and(|c| LOGGING_COMMANDS.contains(c));
        assert_eq!(
            help_of(&args).contains("--log-format"),
            logs,
            "pullman {} --help",
            args.join(" ")
        );
    }
    // Refused where it would do nothing, rather than accepted and ignored.
    let out = Command::new(support::pullman_bin())
        .args(["work-orders", "get", "abc", "--log-format", "json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--log-format"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every line `stderr` holds parses as one JSON log object (`tracing`'s `json()` shape).
fn assert_json_lines(what: &str, stderr: &str) {
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "{what}: no log lines");
    for line in lines {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("{what}: not a JSON line ({e}): {line}"));
        assert!(
            v["level"].is_string() && v["fields"]["message"].is_string(),
            "{what}: {line}"
        );
    }
}

#[tokio::test]
async fn serve_and_migrate_log_json_by_flag_or_environment() {
    let dir = tempfile::tempdir().unwrap();
    for (extra, envs) in [
        (&["--log-format", "json"][..], &[][..]),
        (&[][..], &[("PULLMAN_LOG_FORMAT", "json")][..]),
    ] {
        let mut serve = support::serve::Serve::start(dir.path(), extra, envs, Stdio::piped()).await;
        let mut stderr = serve.child.stderr.take().unwrap();
        assert!(serve.stop().success());
        let mut log = String::new();
        stderr.read_to_string(&mut log).unwrap();
        assert_json_lines(&format!("serve {extra:?} {envs:?}"), &log);
        assert!(log.contains("pullman API listening"), "{log}");
    }

    let db = support::fresh_database_url().await;
    let migrate = |args: &[&str], format: Option<&str>| {
        let mut cmd = Command::new(support::pullman_bin());
        cmd.arg("migrate")
            .args(args)
            .env("DATABASE_URL", &db)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("PULLMAN_LOG_FORMAT");
        if let Some(f) = format {
            cmd.env("PULLMAN_LOG_FORMAT", f);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stderr).unwrap()
    };
    assert_json_lines(
        "migrate --log-format json",
        &migrate(&["--log-format", "json"], None),
    );
    assert_json_lines(
        "PULLMAN_LOG_FORMAT=json migrate",
        &migrate(&[], Some("json")),
    );
    let text = migrate(&[], None);
    assert!(text.contains("migrations applied"), "{text}");
    assert!(serde_json::from_str::<serde_json::Value>(text.lines().next().unwrap()).is_err());
}

/// The `--flags` named in `text`: each `--` followed by a lowercase letter, up to the first
/// character a flag's name cannot hold.
fn flags_in(text: &str) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("--") {
        rest = &rest[at + 2..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
            .collect();
        if name.starts_with(|c: char| c.is_ascii_lowercase()) {
            flags.insert(format!("--{name}"));
        }
    }
    flags
}

/// The README's table of `serve` flags lists each flag `pullman serve --help` shows and no
/// other (issue #36: three were missing from it).
#[test]
fn readme_serve_table_is_the_flags_serve_has() {
    let help = help_of(&["serve"]);
    // A flag's own line is indented 2 (`  -o, --output`) or 6 (`      --listen`) columns; its
    // description, which may name other flags, is indented further.
    let offered: BTreeSet<String> = help
        .lines()
        .filter(|l| {
            let indent = l.len() - l.trim_start().len();
            (indent == 2 || indent == 6) && l.trim_start().starts_with('-')
        })
        .flat_map(|l| {
            flags_in(
                l.split_whitespace()
                    .take(2)
                    .collect::<Vec<_>>()
                    .join(" ")
                    .as_str(),
            )
        })
        .filter(|f| f != "--help")
        .collect();
    assert!(
        offered.contains("--listen") && offered.len() > 20,
        "{offered:?}"
    );

    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let table: Vec<&str> = readme
        .lines()
        .skip_while(|l| !l.starts_with("| `pullman serve` flag |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .collect();
    assert!(
        !table.is_empty(),
        "no `pullman serve` flag table in README.md"
    );
    let listed: BTreeSet<String> = table
        .iter()
        .flat_map(|row| flags_in(row.split(" | ").next().unwrap_or("")))
        .collect();
    let missing: Vec<_> = offered.difference(&listed).collect();
    let unknown: Vec<_> = listed.difference(&offered).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "README serve table lacks {missing:?}; it names {unknown:?}, which serve does not have"
    );
}
