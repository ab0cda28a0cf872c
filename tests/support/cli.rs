//! The admin CLI (`pullman agents|work-orders|log …`) as a user runs it against a test server:
//! the server in `PULLMAN_SERVER`, the admin token in `PULLMAN_ADMIN_TOKEN`, no colours.

use std::process::{Command, Output};

use serde_json::Value;

use super::{ADMIN_TOKEN, pullman_bin};

/// `pullman ARGS` against the server at `base`, not yet started (for stdin, pipes, signals).
pub fn cli_command(base: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(pullman_bin());
    cmd.args(args)
        .env("PULLMAN_SERVER", base)
        .env("PULLMAN_ADMIN_TOKEN", ADMIN_TOKEN)
        .env_remove("PULLMAN_ADMIN_TOKEN_FILE")
        .env("NO_COLOR", "1");
    cmd
}

/// Runs `pullman ARGS` against `base` to its end, off the async runtime's threads.
///
/// # Panics
/// When the binary cannot be started.
pub async fn cli(base: &str, args: &[&str]) -> Output {
    let mut cmd = cli_command(base, args);
    tokio::task::spawn_blocking(move || cmd.output().expect("running pullman"))
        .await
        .expect("the CLI's thread")
}

/// [`cli`] as (success, stdout, stderr).
pub async fn cli_text(base: &str, args: &[&str]) -> (bool, String, String) {
    let out = cli(base, args).await;
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// Bytes a command printed, as text (invalid UTF-8 as U+FFFD).
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Asserts that `printed` (a command's stdout or stderr) contains `needle`, and shows all of it
/// when it does not: the check the CLI tests make of nearly every message.
///
/// # Panics
/// When `needle` is not in `printed`.
#[track_caller]
pub fn assert_printed(printed: &[u8], needle: &str) {
    let printed = text(printed);
    assert!(printed.contains(needle), "{printed}");
}

/// The JSON document a command printed on stdout.
///
/// # Panics
/// When the command failed or printed no JSON (with what it printed).
pub fn json_of(out: &Output) -> Value {
    assert!(out.status.success(), "CLI failed: {}", text(&out.stderr));
    json_of_any(out)
}

/// Runs `pullman ARGS -o json` against `base` and returns the JSON document it printed (the
/// `json_of(&cli(…))` every listing test wrote out).
///
/// # Panics
/// When the command failed or printed no JSON.
pub async fn cli_json(base: &str, args: &[&str]) -> Value {
    let mut args = args.to_vec();
    args.extend(["-o", "json"]);
    json_of(&cli(base, &args).await)
}

/// The JSON document a command printed on stdout, whatever its exit code (for commands that exit
/// non-zero on purpose).
///
/// # Panics
/// When it printed no JSON (with what it printed).
pub fn json_of_any(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", text(&out.stdout), text(&out.stderr)))
}

/// `work-orders create -f FILE --label LABEL EXTRA…`: the create the CLI tests run, with the
/// flags of each case after it.
pub fn create_args<'a>(file: &'a str, label: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    [
        &["work-orders", "create", "-f", file, "--label", label][..],
        extra,
    ]
    .concat()
}

/// A file `cm.yaml` holding `yaml` in a fresh temporary directory (gone when the directory is
/// dropped), for `work-orders create -f`.
pub fn yaml_file(yaml: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("cm.yaml");
    std::fs::write(&file, yaml).expect("writing the manifest");
    (dir, file)
}
