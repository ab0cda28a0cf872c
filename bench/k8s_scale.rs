//! Operator scale on the test control plane (issue #16): `pullman serve` (the controller) and
//! `pullman executor` against a real kube-apiserver, kwok playing the kubelet.
//!
//! Scenarios (pick with positional names; all by default):
//! - `payload`: serve RSS with M WorkOrders of P KiB `yamlContent` queued (no executor), per
//!   WorkOrder, and the same with 1 KiB each in the same run: the controller's cache must not
//!   grow with the payload (target +≤ 10 KiB each).
//! - `configmap`: N small ConfigMap orders applied at once, one executor at each `--concurrency`;
//!   apply → `Succeeded` latency p50/p99, orders/s, serve and executor RSS (peak), the executor's
//!   established connections to the API server (peak), API server requests per order (delta of
//!   `apiserver_request_total` over the run, divided by N). Each figure also as the ratio of the
//!   largest size to the smallest.
//! - `job`: the same with Jobs whose pods run a few seconds (kwok's
//!   `pullman.dev/kwok-run-duration` annotation, e2e/testenv/kwok/pod-complete.yaml).
//!
//! Needs `KUBECONFIG` (e.g. `eval "$(e2e/testenv/up.sh)"`) and the release binary
//! (`PULLMAN_BIN`, default `target/release/pullman`). Each run uses its own namespace and its own
//! `pullman serve` with an embedded PostgreSQL (or `DATABASE_URL` when set: it must be empty).
//! Flags: `--quick` (sizes 200,1000; jobs 50,200; payload 20 × 900 KiB), `--sizes=1000,10000`,
//! `--job-sizes=100,1000`, `--concurrency=10,100`, `--job-seconds=3`, `--payload=100x900`,
//! `--rate=50` (creates per second; default all at once, 32 in flight).
//!
//! Latency counts from the moment the API server accepted each WorkOrder (its create answered).
//! All at once measures throughput: the backlog the API server accepts faster than the whole
//! pipeline (about ten requests per order) can serve is queueing, not the operator's latency;
//! `--rate` below that throughput measures the latency of one order through the operator.

#[path = "k8s_scale/procs.rs"]
mod procs;
#[path = "k8s_scale/run.rs"]
mod run;
#[path = "k8s_scale/stages.rs"]
mod stages;

use std::time::Duration;

/// Options from the command line.
#[derive(Debug, Clone)]
pub struct Opts {
    pub scenarios: Vec<String>,
    pub sizes: Vec<usize>,
    pub job_sizes: Vec<usize>,
    pub concurrency: Vec<usize>,
    pub job_seconds: u64,
    /// (WorkOrders, KiB of yamlContent each) for `payload`.
    pub payload: (usize, usize),
    /// Creates per second for `configmap` and `job` (`None`: all at once, 32 in flight).
    pub rate: Option<f64>,
}

fn list(v: &str) -> Vec<usize> {
    v.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.trim().parse().expect("a comma-separated list of numbers"))
        .collect()
}

fn opts() -> Opts {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let mut o = if quick {
        Opts {
            scenarios: vec![],
            sizes: vec![200, 1000],
            job_sizes: vec![50, 200],
            concurrency: vec![10, 100],
            job_seconds: 3,
            payload: (20, 900),
            rate: None,
        }
    } else {
        Opts {
            scenarios: vec![],
            sizes: vec![1000, 10000],
            job_sizes: vec![100, 1000],
            concurrency: vec![10, 100],
            job_seconds: 3,
            payload: (100, 900),
            rate: None,
        }
    };
    for a in &args {
        if let Some(v) = a.strip_prefix("--sizes=") {
            o.sizes = list(v);
        } else if let Some(v) = a.strip_prefix("--job-sizes=") {
            o.job_sizes = list(v);
        } else if let Some(v) = a.strip_prefix("--concurrency=") {
            o.concurrency = list(v);
        } else if let Some(v) = a.strip_prefix("--job-seconds=") {
            o.job_seconds = v.parse().expect("--job-seconds=<seconds>");
        } else if let Some(v) = a.strip_prefix("--payload=") {
            let (n, kib) = v.split_once('x').expect("--payload=<count>x<KiB>");
            o.payload = (n.parse().unwrap(), kib.parse().unwrap());
        } else if let Some(v) = a.strip_prefix("--rate=") {
            o.rate = Some(v.parse().expect("--rate=<creates per second>"));
        } else if !a.starts_with("--") {
            o.scenarios.push(a.clone());
        }
    }
    if o.scenarios.is_empty() {
        o.scenarios = vec!["payload".into(), "configmap".into(), "job".into()];
    }
    o
}

fn main() {
    // `cargo test --all-targets` runs this binary too, without `--bench`: it only says how to run
    // it (a scale run takes minutes and needs a release build of pullman).
    if !std::env::args().any(|a| a == "--bench") {
        println!("a benchmark: cargo build --release && cargo bench --bench k8s_scale");
        return;
    }
    let o = opts();
    if std::env::var_os("KUBECONFIG").is_none() {
        eprintln!("k8s_scale needs a cluster: eval \"$(e2e/testenv/up.sh)\" first");
        std::process::exit(2);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let k = run::setup().await;
        println!("k8s_scale: {o:?}");
        println!("| scenario | N | executor --concurrency | figures |");
        println!("|---|---|---|---|");
        if o.scenarios.iter().any(|s| s == "payload") {
            // The same count of 1 KiB WorkOrders first: what a WorkOrder costs whatever its
            // payload, so the difference is what the payload adds.
            let small = run::payload(&k, o.payload.0, 1).await;
            let large = run::payload(&k, o.payload.0, o.payload.1).await;
            println!(
                "| payload: {} KiB against 1 KiB, next {} WorkOrders | – | – | {:+.1} KiB each ({large:+.1} against {small:+.1}) |",
                o.payload.1,
                o.payload.0,
                large - small
            );
        }
        for (kind, sizes) in [("configmap", &o.sizes), ("job", &o.job_sizes)] {
            if !o.scenarios.iter().any(|s| s == kind) {
                continue;
            }
            // Sizes outside, concurrencies inside: the runs of one size see the control plane in
            // the same state (a 10k run leaves etcd and the API server slower for a while after
            // its namespace is gone), and the ratio rows follow once every size has run.
            let mut results: Vec<(usize, run::Result)> = Vec::new();
            for &n in sizes.iter() {
                for &c in &o.concurrency {
                    let r = run::orders(&k, kind, n, c, Duration::from_secs(o.job_seconds), o.rate)
                        .await;
                    println!("{}", r.row(kind, c));
                    results.push((c, r));
                }
            }
            for &c in &o.concurrency {
                let of_c: Vec<&run::Result> = results
                    .iter()
                    .filter(|(rc, _)| *rc == c)
                    .map(|(_, r)| r)
                    .collect();
                if let (Some(first), Some(last)) = (of_c.first(), of_c.last())
                    && of_c.len() > 1
                {
                    println!("{}", last.ratio_row(first, kind, c));
                }
            }
        }
    });
}
