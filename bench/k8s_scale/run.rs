//! One run of a scenario: a fresh namespace, `pullman serve` (and an executor), N WorkOrders
//! applied, watched to their final phase.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use pullman::crd::{WorkOrderPhase, WorkOrderResource};
use serde_json::json;

use super::procs::{self, Reaped};
use super::stages;

/// A client for `KUBECONFIG`, with the CRDs installed.
pub async fn setup() -> Client {
    let k = Client::try_default().await.expect("client from KUBECONFIG");
    let api: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(k.clone());
    for crd in pullman::crd::crds() {
        let name = crd.metadata.name.clone().unwrap();
        api.patch(
            &name,
            &PatchParams::apply("pullman-bench").force(),
            &Patch::Apply(&crd),
        )
        .await
        .expect("installing the CRDs");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    k
}

async fn namespace(k: &Client, prefix: &str) -> String {
    let name = format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(k.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    name
}

/// Deletes `ns` and waits until it is gone, while its serve still runs: each WorkOrder carries
/// the `pullman.dev/cancel` finalizer, which only serve's controller removes, so a namespace
/// deleted after serve stopped would stay Terminating and its namespace controller would keep
/// retrying through the next runs, loading the API server they measure.
async fn drop_namespace(k: &Client, ns: &str) {
    let namespaces = Api::<Namespace>::all(k.clone());
    let _ = namespaces.delete(ns, &DeleteParams::background()).await;
    let deadline = Instant::now() + Duration::from_secs(900);
    while Instant::now() < deadline {
        if matches!(namespaces.get_opt(ns).await, Ok(None)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("namespace {ns} still there after 15 min; later runs may be slower");
}

/// Waits (at most 3 min) until the API server serves fewer than [`IDLE_REQUESTS_PER_S`]: after
/// a namespace of 10k objects is gone, the garbage collector and the namespace controller go on
/// for a while, and a run started then measures them too.
async fn settle(k: &Client) {
    let total = |m: HashMap<String, f64>| m.values().sum::<f64>();
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut last = total(procs::apiserver_requests(k).await);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let now = total(procs::apiserver_requests(k).await);
        if (now - last) / 5.0 < IDLE_REQUESTS_PER_S {
            return;
        }
        last = now;
    }
    eprintln!("the API server did not settle within 3 min; the next run may be slower");
}

/// Requests per second of an idle test control plane and more: leases, node heartbeats, the
/// controller manager's resyncs and this bench's own polling, all well under it.
const IDLE_REQUESTS_PER_S: f64 = 20.0;

/// `pullman serve` for `ns`, once it answers.
async fn start_serve(ns: &str, dir: &std::path::Path) -> (Reaped, String) {
    let port = procs::free_port();
    let serve = procs::serve(ns, port, dir);
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    for _ in 0..600 {
        if http
            .get(format!("{url}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return (serve, url);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("pullman serve did not become ready within 60 s");
}

/// When each WorkOrder was first seen in a phase of interest, and which, by name.
type Seen = Arc<Mutex<HashMap<String, (Instant, WorkOrderPhase)>>>;

/// When each WorkOrder of `ns` was first seen in a phase `done` accepts, by name.
fn watch_phases(
    k: &Client,
    ns: &str,
    done: fn(WorkOrderPhase) -> bool,
) -> (Seen, tokio::task::JoinHandle<()>) {
    let seen: Seen = Arc::default();
    let api: Api<WorkOrderResource> = Api::namespaced(k.clone(), ns);
    let record = seen.clone();
    let task = tokio::spawn(async move {
        let mut objects = watcher(api, watcher::Config::default().page_size(100))
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Ok(Some(wo)) = objects.try_next().await {
            let Some(phase) = wo.status.as_ref().and_then(|s| s.phase) else {
                continue;
            };
            if done(phase) {
                let name = wo.metadata.name.clone().unwrap_or_default();
                record
                    .lock()
                    .unwrap()
                    .entry(name)
                    .or_insert((Instant::now(), phase));
            }
        }
    });
    (seen, task)
}

async fn wait_for(
    seen: &Mutex<HashMap<String, (Instant, WorkOrderPhase)>>,
    n: usize,
    limit: Duration,
) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if seen.lock().unwrap().len() >= n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

fn work_order(name: &str, yaml: String) -> WorkOrderResource {
    serde_json::from_value(json!({
        "apiVersion": "pullman.dev/v1alpha1",
        "kind": "WorkOrder",
        "metadata": {"name": name},
        "spec": {
            "workType": "custom",
            "yamlContent": yaml,
            "maxRetries": 0,
            "targeting": {"labels": ["bench"]},
        },
    }))
    .unwrap()
}

/// Creates every order (32 at a time; with `rate`, starting one every 1/`rate` s), returning
/// when the API server accepted each (its create answered) and its uid, by name: latencies count from
/// there, so the time a create waits for the API server is not the operator's.
async fn apply_all(
    api: &Api<WorkOrderResource>,
    orders: Vec<(String, String)>,
    rate: Option<f64>,
) -> HashMap<String, (Instant, uuid::Uuid)> {
    let t0 = tokio::time::Instant::now();
    futures::stream::iter(orders.into_iter().enumerate())
        .map(|(i, (name, yaml))| async move {
            if let Some(rate) = rate {
                tokio::time::sleep_until(t0 + Duration::from_secs_f64(i as f64 / rate)).await;
            }
            let wo = work_order(&name, yaml);
            let made = api
                .create(&PostParams::default(), &wo)
                .await
                .expect("creating a WorkOrder");
            let uid = made.metadata.uid.as_deref().and_then(|u| u.parse().ok());
            (
                name,
                (Instant::now(), uid.expect("a created WorkOrder's uid")),
            )
        })
        .buffer_unordered(32)
        .collect()
        .await
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// `payload`: serve RSS before, after `m` WorkOrders of `kib` KiB each are queued, and after `m`
/// more. The first batch also grows what every process keeps once it has carried large objects
/// (connection buffers, allocator arenas); the second shows what each more WorkOrder costs.
/// Returns that cost, KiB per WorkOrder of the second batch.
pub async fn payload(k: &Client, m: usize, kib: usize) -> f64 {
    let ns = namespace(k, "scale-payload").await;
    let dir = tempfile::tempdir().unwrap();
    let (serve, _) = start_serve(&ns, dir.path()).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = procs::rss_kib(serve.pid());
    let (seen, watch) = watch_phases(k, &ns, |p| p == WorkOrderPhase::Pending);
    let api: Api<WorkOrderResource> = Api::namespaced(k.clone(), &ns);
    let filler = "x".repeat(kib * 1024);
    let batch = |from: usize| -> Vec<(String, String)> {
        (from..from + m)
            .map(|i| {
                let yaml = format!(
                    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big-{i}\ndata:\n  filler: {filler}\n"
                );
                (format!("big-{i}"), yaml)
            })
            .collect()
    };
    apply_all(&api, batch(0), None).await;
    let mut all = wait_for(&seen, m, Duration::from_secs(300)).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let middle = procs::rss_kib(serve.pid());
    apply_all(&api, batch(m), None).await;
    all &= wait_for(&seen, 2 * m, Duration::from_secs(300)).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = procs::rss_kib(serve.pid());
    watch.abort();
    let per = |from: u64, to: u64| (to as f64 - from as f64) / m as f64;
    println!(
        "| payload: 2 × {m} WorkOrders × {kib} KiB yamlContent, queued (Pending) | {} | – | serve RSS {:.1} → {:.1} → {:.1} MiB: first {m} {:+.1} KiB each, next {m} {:+.1} KiB each{} |",
        2 * m,
        mib(before),
        mib(middle),
        mib(after),
        per(before, middle),
        per(middle, after),
        if all {
            ""
        } else {
            " (NOT all reached Pending)"
        }
    );
    drop_namespace(k, &ns).await;
    drop(serve);
    settle(k).await;
    per(middle, after)
}

/// Figures of one `orders` run.
pub struct Result {
    pub n: usize,
    /// Creates per second offered (`--rate`); `None`: all at once.
    pub rate: Option<f64>,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub per_s: f64,
    pub serve_kib: u64,
    pub executor_kib: u64,
    pub connections: usize,
    pub requests_per_order: f64,
    /// Requests per order by `resource[/subresource] VERB`, most first.
    pub requests: Vec<(String, f64)>,
    pub failed: usize,
    pub missing: usize,
    pub stages: stages::Stages,
}

impl Result {
    pub fn row(&self, kind: &str, c: usize) -> String {
        format!(
            "| {kind}{} | {} | {c} | apply→Succeeded p50 {:.0} ms p99 {:.0} ms; {:.1} orders/s; serve RSS {:.1} MiB; executor RSS {:.1} MiB; executor→API server connections {}; API server requests/order {:.2} ({}); {}{} |",
            match self.rate {
                Some(rate) => format!(" at {rate}/s"),
                None => String::new(),
            },
            self.n,
            self.p50_ms,
            self.p99_ms,
            self.per_s,
            mib(self.serve_kib),
            mib(self.executor_kib),
            self.connections,
            self.requests_per_order,
            self.requests
                .iter()
                .filter(|(_, per)| *per >= 0.05)
                .take(10)
                .map(|(what, per)| format!("{what} {per:.2}"))
                .collect::<Vec<_>>()
                .join(", "),
            self.stages.summary(percentile),
            if self.failed + self.missing > 0 {
                format!("; {} failed, {} not finished", self.failed, self.missing)
            } else {
                String::new()
            }
        )
    }

    pub fn ratio_row(&self, base: &Result, kind: &str, c: usize) -> String {
        let r = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        format!(
            "| {kind} ratio {}/{} | – | {c} | p50 {:.2}× p99 {:.2}×; orders/s {:.2}×; serve RSS {:.2}×; executor RSS {:.2}×; connections {:.2}×; requests/order {:.2}× |",
            self.n,
            base.n,
            r(self.p50_ms, base.p50_ms),
            r(self.p99_ms, base.p99_ms),
            r(self.per_s, base.per_s),
            r(self.serve_kib as f64, base.serve_kib as f64),
            r(self.executor_kib as f64, base.executor_kib as f64),
            r(self.connections as f64, base.connections as f64),
            r(self.requests_per_order, base.requests_per_order),
        )
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn yaml(kind: &str, i: usize, run: Duration) -> String {
    match kind {
        "job" => format!(
            "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: job-{i}\nspec:\n  backoffLimit: 0\n  template:\n    metadata:\n      annotations:\n        pullman.dev/kwok-run-duration: {}s\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: c\n        image: busybox\n",
            run.as_secs()
        ),
        _ => format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-{i}\ndata:\n  i: \"{i}\"\n"
        ),
    }
}

/// `configmap` / `job`: `n` orders through serve and one executor at `--concurrency c`.
pub async fn orders(
    k: &Client,
    kind: &str,
    n: usize,
    c: usize,
    run: Duration,
    rate: Option<f64>,
) -> Result {
    let ns = namespace(k, &format!("scale-{kind}")).await;
    let dir = tempfile::tempdir().unwrap();
    let (serve, url) = start_serve(&ns, dir.path()).await;
    let executors: Api<pullman::crd::Executor> = Api::namespaced(k.clone(), &ns);
    let ex: pullman::crd::Executor = serde_json::from_value(json!({
        "apiVersion": "pullman.dev/v1alpha1", "kind": "Executor",
        "metadata": {"name": "bench"},
        "spec": {"labels": ["bench"], "leaseSeconds": 30},
    }))
    .unwrap();
    executors.create(&PostParams::default(), &ex).await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(k.clone(), &ns);
    let mut token = None;
    for _ in 0..600 {
        if let Ok(Some(s)) = secrets.get_opt("bench-agent-token").await
            && let Some(t) = s.data.and_then(|d| d.get("token").cloned())
        {
            token = Some(String::from_utf8(t.0).unwrap());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, token.expect("the executor's token Secret")).unwrap();
    let executor = procs::executor(&url, &ns, &token_file, c);
    tokio::time::sleep(Duration::from_secs(2)).await;

    let port = procs::apiserver_port(k);
    let (serve_pid, exec_pid) = (serve.pid(), executor.pid());
    let peaks = Arc::new(Mutex::new((0u64, 0u64, 0usize)));
    let sampling = {
        let peaks = peaks.clone();
        tokio::spawn(async move {
            loop {
                let (s, e, c) = (
                    procs::rss_kib(serve_pid),
                    procs::rss_kib(exec_pid),
                    procs::connections_to(exec_pid, port),
                );
                {
                    let mut p = peaks.lock().unwrap();
                    *p = (p.0.max(s), p.1.max(e), p.2.max(c));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let (seen, watch) = watch_phases(k, &ns, |p| {
        matches!(
            p,
            WorkOrderPhase::Succeeded | WorkOrderPhase::Failed | WorkOrderPhase::Cancelled
        )
    });
    let requests_before = procs::apiserver_requests(k).await;
    let api: Api<WorkOrderResource> = Api::namespaced(k.clone(), &ns);
    let orders = (0..n)
        .map(|i| (format!("{kind}-{i}"), yaml(kind, i, run)))
        .collect();
    let t0 = Instant::now();
    let started = apply_all(&api, orders, rate).await;
    let limit = Duration::from_secs(120 + (n as u64) / 5 + run.as_secs() * (n / c.max(1)) as u64);
    wait_for(&seen, n, limit).await;
    let requests_after = procs::apiserver_requests(k).await;
    let mut requests: Vec<(String, f64)> = requests_after
        .iter()
        .map(|(what, after)| {
            let before = requests_before.get(what).copied().unwrap_or(0.0);
            (what.clone(), (after - before) / n as f64)
        })
        .filter(|(_, per)| *per > 0.0)
        .collect();
    requests.sort_by(|a, b| b.1.total_cmp(&a.1));
    sampling.abort();
    watch.abort();
    let seen = seen.lock().unwrap().clone();
    let mut latencies: Vec<f64> = Vec::new();
    let mut failed = 0;
    let mut last = t0;
    for (name, (at, phase)) in &seen {
        if *phase != WorkOrderPhase::Succeeded {
            failed += 1;
            continue;
        }
        last = last.max(*at);
        if let Some((start, _)) = started.get(name) {
            latencies.push(at.duration_since(*start).as_secs_f64() * 1000.0);
        }
    }
    latencies.sort_by(|a, b| a.total_cmp(b));
    let finished: HashMap<String, Instant> = seen
        .iter()
        .filter(|(_, (_, phase))| *phase == WorkOrderPhase::Succeeded)
        .map(|(name, (at, _))| (name.clone(), *at))
        .collect();
    let stages = stages::measure(&url, &started, &finished).await;
    let (serve_kib, executor_kib, connections) = *peaks.lock().unwrap();
    let result = Result {
        n,
        rate,
        p50_ms: percentile(&latencies, 0.5),
        p99_ms: percentile(&latencies, 0.99),
        per_s: latencies.len() as f64 / last.duration_since(t0).as_secs_f64().max(0.001),
        serve_kib,
        executor_kib,
        connections,
        requests_per_order: requests.iter().map(|(_, per)| per).sum(),
        requests,
        failed,
        missing: n - seen.len(),
        stages,
    };
    drop(executor);
    drop_namespace(k, &ns).await;
    drop(serve);
    settle(k).await;
    result
}
