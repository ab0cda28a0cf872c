//! (8) River as a peer (issue #34): River (Go, in-process workers) works the same backlog with
//! the same 16 workers on the same PostgreSQL, in its own fresh database, in the same run as the
//! SQL ceiling and HTTP end to end. The program is `bench/river/main.go`, built from its pinned Go
//! module by `bench/river/build.sh` (or given as `PULLMAN_RIVER_BIN`); without Go the row says
//! so and the scenario is skipped.
//!
//! River's settings are its defaults (its batch completer sets many jobs `completed` in one
//! statement and one commit; Pullman's ceiling is one claim and one complete per transaction)
//! except FetchCooldown 1 ms and FetchPollInterval 10 ms.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use sqlx::Connection;

use super::AGENTS;

/// The River binary: `PULLMAN_RIVER_BIN`, or what `bench/river/build.sh` prints last.
fn binary() -> Result<String, String> {
    if let Ok(bin) = std::env::var("PULLMAN_RIVER_BIN") {
        return Ok(bin);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/river/build.sh");
    let out = Command::new(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.lines().last() {
        Some(bin) if out.status.success() => Ok(bin.trim().to_string()),
        _ => Err(format!(
            "{} failed ({}); Go is needed, or set PULLMAN_RIVER_BIN",
            script.display(),
            out.status
        )),
    }
}

/// A new, empty database on the bench's PostgreSQL (River migrates it itself); its URL.
async fn fresh_database() -> String {
    let server = pullman::testing::server_url();
    let mut admin = sqlx::PgConnection::connect(server)
        .await
        .expect("connecting to the bench's PostgreSQL");
    let name = format!("river_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await
        .expect("CREATE DATABASE");
    admin.close().await.ok();
    let (base, _) = server.rsplit_once('/').expect("a URL with a database");
    format!("{base}/{name}")
}

/// Runs River over `jobs` jobs; its output line's `key=value` pairs.
fn work(bin: &str, url: &str, jobs: usize) -> Result<HashMap<String, String>, String> {
    let out = Command::new(bin)
        .args(["-url", url, "-jobs", &jobs.to_string()])
        .args(["-workers", &AGENTS.to_string()])
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("{bin}: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("river "))
        .filter(|_| out.status.success())
        .ok_or_else(|| format!("{bin} failed ({})", out.status))?;
    Ok(line
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

/// Scenario 8 measured and printed as its table row, with each of `pullman` (a row's number and
/// its orders/s, measured in the same run) as a ratio to it; returns jobs/s.
pub async fn run(jobs: usize, ceiling: Option<f64>, pullman: &[(&str, f64)]) -> Option<f64> {
    let bin = match tokio::task::spawn_blocking(binary).await.unwrap() {
        Ok(bin) => bin,
        Err(why) => {
            println!("| 8. River (Go, in-process workers, {AGENTS} workers) | skipped: {why} | |");
            return None;
        }
    };
    let url = fresh_database().await;
    let result = tokio::task::spawn_blocking(move || work(&bin, &url, jobs))
        .await
        .unwrap();
    let got = match result {
        Ok(got) => got,
        Err(why) => {
            println!("| 8. River (Go, in-process workers, {AGENTS} workers) | failed: {why} | |");
            return None;
        }
    };
    let field = |k: &str| got.get(k).map(String::as_str).unwrap_or("?");
    let Ok(rate) = field("jobs_per_s").parse::<f64>() else {
        println!("| 8. River | failed: no jobs_per_s in its output ({got:?}) | |");
        return None;
    };
    let mut ratios = Vec::new();
    if let Some(c) = ceiling {
        ratios.push(format!("{:.2} × SQL ceiling", rate / c));
    }
    for (row, h) in pullman {
        ratios.push(format!(
            "Pullman HTTP ({row}) / River = {:.2} (goal ≥ 1.0)",
            h / rate
        ));
    }
    println!(
        "| 8. River {} (Go, in-process workers, {AGENTS} workers), {jobs} backlog | {rate:.0} jobs/s ({} s; last job worked at {} s, the rest is its completer's last batch) | {} |",
        field("version"),
        field("seconds"),
        field("worked_seconds"),
        ratios.join("; ")
    );
    Some(rate)
}
