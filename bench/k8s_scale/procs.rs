//! The processes under test and what is read from them: RSS, connections to the API server, and
//! the API server's own request counter.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use kube::Client;

/// Admin token of the `pullman serve` the bench starts.
pub const ADMIN: &str = "k8s-scale-admin-token";

/// Kills the child when dropped, so a panic mid-run leaves no process behind.
pub struct Reaped(pub Child);

impl Reaped {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.0.wait();
    }
}

pub fn exe() -> PathBuf {
    std::env::var_os("PULLMAN_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/pullman"))
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `pullman serve` with the controller on for namespace `ns` only; an embedded PostgreSQL in
/// `data_dir` unless `DATABASE_URL` is set.
pub fn serve(ns: &str, port: u16, data_dir: &Path) -> Reaped {
    let mut cmd = Command::new(exe());
    cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--controller", "on", "--watch-namespace", ns])
        .args(["--leader-election-namespace", ns])
        .env("PULLMAN_ADMIN_TOKEN", ADMIN)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null());
    if std::env::var_os("DATABASE_URL").is_none() {
        cmd.arg("--data-dir").arg(data_dir);
    }
    Reaped(cmd.spawn().expect("starting pullman serve"))
}

/// `pullman executor` at `concurrency`, applying into `ns`.
pub fn executor(server: &str, ns: &str, token_file: &Path, concurrency: usize) -> Reaped {
    Reaped(
        Command::new(exe())
            .args(["executor", "--server", server, "--target-namespace", ns])
            .args(["--concurrency", &concurrency.to_string()])
            .args(["--lease-seconds", "30", "--token-file"])
            .arg(token_file)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("starting pullman executor"),
    )
}

/// Resident set size of `pid`, KiB (0 once it is gone).
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Established TCP connections of process `pid` to remote port `port`: its socket inodes
/// (`/proc/<pid>/fd`) matched against `/proc/<pid>/net/tcp{,6}` (state 01 = ESTABLISHED).
pub fn connections_to(pid: u32, port: u16) -> usize {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| {
                let link = std::fs::read_link(e.ok()?.path()).ok()?;
                let link = link.to_string_lossy();
                Some(
                    link.strip_prefix("socket:[")?
                        .strip_suffix(']')?
                        .to_string(),
                )
            })
            .collect()
        })
        .unwrap_or_default();
    let port_hex = format!(":{port:04X}");
    ["tcp", "tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(format!("/proc/{pid}/net/{f}")).ok())
        .flat_map(|t| t.lines().skip(1).map(str::to_string).collect::<Vec<_>>())
        .filter(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            cols.len() > 9
                && cols[2].ends_with(&port_hex)
                && cols[3] == "01"
                && inodes.contains(cols[9])
        })
        .count()
}

/// Port of the API server in the client's URL.
pub fn apiserver_port(k: &Client) -> u16 {
    let _ = k;
    let config = std::env::var("KUBECONFIG").unwrap();
    let text = std::fs::read_to_string(config).unwrap();
    let server = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server:"))
        .expect("server: in KUBECONFIG")
        .trim()
        .to_string();
    let uri: http::Uri = server.parse().unwrap();
    uri.port_u16().unwrap_or(443)
}

/// `apiserver_request_total` summed by what was asked: `resource[/subresource] VERB` (e.g.
/// `workorders/status PATCH`), over every other label (code, scope, version, client).
pub async fn apiserver_requests(k: &Client) -> HashMap<String, f64> {
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = k.request_text(req).await.expect("GET /metrics");
    let mut by_what: HashMap<String, f64> = HashMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
                .unwrap_or_default()
        };
        let (resource, sub) = (label("resource"), label("subresource"));
        let what = match sub.as_str() {
            "" => format!("{resource} {}", label("verb")),
            _ => format!("{resource}/{sub} {}", label("verb")),
        };
        *by_what.entry(what).or_default() += value;
    }
    by_what
}
