//! Help that explains (issue #15): every flag and argument of every command has a description,
//! shell completion scripts parse, and `--version` names the commit.

use std::process::Command;

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
