//! (6) Footprint: `pullman serve` RSS idle and with 1,000 agents long-polling (target ≤ 100 MiB),
//! and `pullman executor` RSS idle (target ≤ 40 MiB). Runs the release binary (`PULLMAN_BIN`,
//! default `target/release/pullman`); the executor needs a reachable cluster (`KUBECONFIG`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::json;

use super::{ADMIN, Bench, rss_kib};

/// Kills the child when dropped, so a panic mid-scenario leaves no process behind.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

pub async fn run(b: &Bench) {
    let exe = std::env::var_os("PULLMAN_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/pullman"));
    if !exe.exists() {
        println!(
            "| 6. Footprint | skipped: build target/release/pullman first (cargo build --release) or set PULLMAN_BIN | |"
        );
        return;
    }
    let db = b.fresh_pool(1).await;
    let (dbname,): (String,) = sqlx::query_as("SELECT current_database()")
        .fetch_one(&db)
        .await
        .unwrap();
    let (base_url, _) = pullman::testing::server_url().rsplit_once('/').unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let serve = Reaped(
        Command::new(&exe)
            .args([
                "serve",
                "--controller",
                "off",
                "--listen",
                &format!("127.0.0.1:{port}"),
            ])
            .env("DATABASE_URL", format!("{base_url}/{dbname}"))
            .env("PULLMAN_ADMIN_TOKEN", ADMIN)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = rss_kib(serve.0.id());
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(1100)
        .build()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let (id, token) = Bench::agent(&http, &base, "fp").await;
    let mut polls = tokio::task::JoinSet::new();
    for _ in 0..1000 {
        let (http, base, id, token) = (http.clone(), base.clone(), id.clone(), token.clone());
        polls.spawn(async move {
            let _ = http
                .post(format!("{base}/api/v1/agents/{id}/claim"))
                .bearer_auth(&token)
                .json(&json!({"max_wait_seconds": 20}))
                .send()
                .await;
        });
    }
    tokio::time::sleep(Duration::from_secs(8)).await;
    let busy = rss_kib(serve.0.id());
    println!(
        "| 6. Footprint: pullman serve RSS | idle {}; 1,000 long-polls {} | target ≤ 100 MiB |",
        mib(idle),
        mib(busy)
    );
    polls.abort_all();

    match executor(&exe, &http, &base).await {
        Ok((idle, after)) => println!(
            "| 6. Footprint: pullman executor RSS | idle {} (long-polling, no work yet); {} after carrying out one order (a ConfigMap applied, API discovery cached) | target ≤ 40 MiB |",
            mib(idle),
            mib(after)
        ),
        Err(why) => println!("| 6. Footprint: pullman executor RSS | skipped: {why} | |"),
    }
    drop(serve);
}

/// RSS of an executor long-polling an empty queue, and again after it carried out one order.
async fn executor(exe: &Path, http: &reqwest::Client, base: &str) -> Result<(u64, u64), String> {
    if std::env::var_os("KUBECONFIG").is_none() {
        return Err(
            "needs a cluster: set KUBECONFIG (here: PULLMAN_TESTENV_STATE=/tmp/pt e2e/testenv/up.sh)"
                .into(),
        );
    }
    let (agent_id, token) = Bench::agent(http, base, "fp-executor").await;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, token).map_err(|e| e.to_string())?;
    let mut executor = Reaped(
        Command::new(exe)
            .args(["executor", "--server", base, "--token-file"])
            .arg(&token_file)
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?,
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    if let Ok(Some(status)) = executor.0.try_wait() {
        return Err(format!("the executor exited ({status})"));
    }
    let idle = rss_kib(executor.0.id());

    let name = format!("pullman-footprint-{}", &agent_id[..8]);
    let order: serde_json::Value = http
        .post(format!("{base}/api/v1/work-orders"))
        .bearer_auth(ADMIN)
        .json(&json!({
            "work_type": "custom",
            "yaml_content": format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: default\ndata:\n  a: b\n"
            ),
            "targeting": {"agent_ids": [agent_id]}
        }))
        .send()
        .await
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())?;
    let id = order["id"].as_str().ok_or("creating the order failed")?;
    let finished = async {
        loop {
            let r = http
                .get(format!("{base}/api/v1/work-order-log/{id}"))
                .bearer_auth(ADMIN)
                .send()
                .await;
            if let Ok(r) = r
                && r.status().is_success()
            {
                let entry: serde_json::Value = r.json().await.unwrap_or_default();
                return entry["outcome"].as_str().unwrap_or("?").to_string();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let outcome = tokio::time::timeout(Duration::from_secs(60), finished)
        .await
        .map_err(
            |_| "the executor did not finish its order within 60 s; is the cluster reachable?",
        )?;
    if outcome != "succeeded" {
        return Err(format!("the executor's order ended {outcome}"));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_kib(executor.0.id());
    let _ = Command::new("kubectl")
        .args([
            "delete",
            "configmap",
            "-n",
            "default",
            &name,
            "--ignore-not-found",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    Ok((idle, after))
}
