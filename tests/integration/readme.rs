//! The README's walk-through, run as written by bash against a real `pullman serve` (issue #36):
//! every command of it works, and the order step 7 follows is slow enough for `logs -f` to show
//! its lines arriving.

use crate::support;

use std::process::Stdio;
use std::time::Duration;

use chrono::{DateTime, Utc};
use support::serve::Serve;

/// The first `sh` block after the walk-through's heading.
fn walk_through() -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let from = readme
        .find("## Walk-through")
        .expect("a walk-through section");
    let block = &readme[from..];
    let start = block.find("```sh\n").expect("an sh block") + "```sh\n".len();
    let end = start + block[start..].find("\n```").expect("the block's end");
    block[start..end].to_string()
}

/// The lines `logs -f --timestamps` printed for step 7's order: (time, `step N of M`).
fn timed_steps(stdout: &str) -> Vec<(DateTime<Utc>, String)> {
    stdout
        .lines()
        .filter_map(|l| {
            let (at, text) = l.split_once(' ')?;
            let at = DateTime::parse_from_rfc3339(at).ok()?.with_timezone(&Utc);
            text.starts_with("step ").then(|| (at, text.to_string()))
        })
        .collect()
}

#[tokio::test]
async fn the_walk_through_runs_as_written_and_its_slow_order_is_slow() {
    let dir = tempfile::tempdir().unwrap();
    // As a new user starts it: no admin token given, so serve writes one to ./.pullman.
    let serve = Serve::start(dir.path(), &[], &[], Stdio::null()).await;
    // The README's server is on port 8080; this one is on a free port. The admin commands
    // default to 8080, so they are told the port with PULLMAN_SERVER and are otherwise as written.
    let script = walk_through().replace("http://127.0.0.1:8080", &serve.url(""));
    assert!(
        script.contains("logs \"${SLOW:0:8}\" -f"),
        "step 7 follows $SLOW: {script}"
    );
    let bin_dir = std::path::Path::new(support::pullman_bin())
        .parent()
        .unwrap()
        .to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let child = tokio::process::Command::new("bash")
        .args(["-e", "-o", "pipefail", "-c", &script])
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", path)
        .env("HOME", dir.path())
        .env("NO_COLOR", "1")
        .env("PULLMAN_SERVER", serve.url(""))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group: the background worker of step 3 is ended with the script.
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .expect("bash");
    let group = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    let out = tokio::time::timeout(Duration::from_secs(180), child.wait_with_output()).await;
    // The worker drains on `kill %1`; give it a moment, then end whatever of the script is left.
    for _ in 0..100 {
        if nix::sys::signal::killpg(group, None).is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    let out = out
        .expect("the walk-through still running after 180 s")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the walk-through failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    // Steps 4 and 6 print the worker's result for the quick orders.
    assert!(
        stdout.matches("handled ").count() >= 2,
        "--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );

    // Step 7: `logs -f --timestamps` showed each of the slow order's lines, read by the worker
    // over several seconds, not all at once.
    let steps = timed_steps(&stdout);
    let texts: Vec<&str> = steps.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(
        texts,
        (1..=8)
            .map(|i| format!("step {i} of 8"))
            .collect::<Vec<_>>(),
        "--- stdout\n{stdout}"
    );
    let spread = steps.last().unwrap().0 - steps.first().unwrap().0;
    assert!(
        spread >= chrono::Duration::seconds(5),
        "the slow order printed its lines within {spread}: {steps:?}"
    );
    for pair in steps.windows(2) {
        assert!(pair[1].0 > pair[0].0, "lines read at once: {steps:?}");
    }
    // And `--tail 3` later: the last two steps and the result line.
    let tail: Vec<&str> = stdout.lines().rev().take(3).collect();
    assert_eq!(tail[2], "step 7 of 8", "--- stdout\n{stdout}");
    assert_eq!(tail[1], "step 8 of 8", "--- stdout\n{stdout}");
    assert!(tail[0].starts_with("handled "), "--- stdout\n{stdout}");
}
