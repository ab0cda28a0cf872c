//! What GitOps tools conclude about a live object: the upstream kstatus library (Flux health
//! checks, Helm 4 `--wait`), the shipped Argo CD Lua scripts run in gopher-lua, and the documented
//! Flux `healthCheckExprs` run by Flux's CEL evaluator, all through
//! the Go helper `e2e/testenv/tools/health` (its path in `PULLMAN_HEALTH_TOOL`, set by
//! e2e/run-tests.sh).

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::support::kube::kubectl;

/// The helper binary; panics with how to build it rather than skipping these checks.
fn tool() -> String {
    std::env::var("PULLMAN_HEALTH_TOOL").unwrap_or_else(|_| {
        panic!(
            "PULLMAN_HEALTH_TOOL is not set: run the Kubernetes tests through e2e/run-tests.sh, or \
             `export PULLMAN_HEALTH_TOOL=$(e2e/testenv/tools/health/build.sh | tail -n1)`"
        )
    })
}

fn run(args: &[&str], obj: &Value) -> (String, String) {
    let mut child = Command::new(tool())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running the health helper");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(obj.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "health {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    (
        v["status"].as_str().unwrap().to_string(),
        v["message"].as_str().unwrap_or_default().to_string(),
    )
}

/// kstatus' verdict: `InProgress`, `Current`, `Failed`, ... and its message.
pub fn kstatus(obj: &Value) -> (String, String) {
    run(&["kstatus"], obj)
}

/// The Argo CD health script for `obj`'s kind: `Progressing`, `Healthy`, `Degraded`, ...
pub fn argocd(obj: &Value) -> (String, String) {
    let script = match obj["kind"].as_str() {
        Some("WorkOrder") => "workorder.lua",
        Some("Executor") => "executor.lua",
        other => panic!("no health script for kind {other:?}"),
    };
    let path = format!("{}/docs/health/argocd/{script}", env!("CARGO_MANIFEST_DIR"));
    run(&["lua", &path], obj)
}

/// Flux's verdict (`InProgress`, `Current`, `Failed`, or `Error` when an expression cannot be
/// evaluated) with the `healthCheckExprs` entry docs/health.md gives for `obj`'s kind, evaluated
/// by Flux's own CEL status evaluator.
pub fn flux(obj: &Value) -> (String, String) {
    let kind = obj["kind"].as_str().expect("object with a kind");
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/health.md")).unwrap();
    let start = doc
        .find("```yaml\napiVersion: kustomize.toolkit.fluxcd.io/v1")
        .expect("docs/health.md has the Flux Kustomization example")
        + "```yaml\n".len();
    let end = start + doc[start..].find("```").unwrap();
    let kustomization: Value = serde_norway::from_str(&doc[start..end]).unwrap();
    let exprs = kustomization["spec"]["healthCheckExprs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == kind)
        .unwrap_or_else(|| panic!("docs/health.md has no healthCheckExprs for {kind}"))
        .clone();
    let path =
        std::env::temp_dir().join(format!("pullman-flux-{kind}-{}.json", std::process::id()));
    std::fs::write(&path, exprs.to_string()).unwrap();
    run(&["flux", path.to_str().unwrap()], obj)
}

/// The live object as `kubectl get -o json` returns it.
pub fn live(ns: &str, kind: &str, name: &str) -> Value {
    let (ok, out, err) = kubectl(&["get", "-n", ns, kind, name, "-o", "json"], None);
    assert!(ok, "kubectl get {kind} {name}: {err}");
    serde_json::from_str(&out).unwrap()
}

/// `type -> (status, reason)` of the object's conditions.
pub fn conditions(obj: &Value) -> BTreeMap<String, (String, String)> {
    obj["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["type"].as_str().unwrap().to_string(),
                (
                    c["status"].as_str().unwrap().to_string(),
                    c["reason"].as_str().unwrap().to_string(),
                ),
            )
        })
        .collect()
}

/// `(type, status, reason)` triples, for compact expectations.
pub fn expect(rows: &[(&str, &str, &str)]) -> BTreeMap<String, (String, String)> {
    rows.iter()
        .map(|(t, s, r)| (t.to_string(), (s.to_string(), r.to_string())))
        .collect()
}

/// Message of condition `type_`.
pub fn message(obj: &Value, type_: &str) -> String {
    obj["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == type_)
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// Asserts what the object's conditions are and what kstatus, Argo CD and Flux's
/// `healthCheckExprs` (which must agree with kstatus) make of them. A WorkOrder's `Schedulable`
/// condition (docs/design.md §10) is compared only when `rows` name it: it follows the agents, not
/// the phase (tests/k8s_controller/schedulable.rs); the verdicts are always of the whole object.
pub fn assert_health(
    obj: &Value,
    what: &str,
    rows: &[(&str, &str, &str)],
    kstatus_says: &str,
    argocd_says: &str,
) {
    let mut seen = conditions(obj);
    if !rows.iter().any(|(t, _, _)| *t == "Schedulable") {
        seen.remove("Schedulable");
    }
    assert_eq!(seen, expect(rows), "{what}: conditions");
    assert_eq!(
        obj["status"]["observedGeneration"], obj["metadata"]["generation"],
        "{what}: observedGeneration"
    );
    let (k, kmsg) = kstatus(obj);
    assert_eq!(k, kstatus_says, "{what}: kstatus ({kmsg})");
    let (a, amsg) = argocd(obj);
    assert_eq!(a, argocd_says, "{what}: Argo CD ({amsg})");
    let (f, fmsg) = flux(obj);
    assert_eq!(f, kstatus_says, "{what}: Flux healthCheckExprs ({fmsg})");
}

/// docs/health.md shows the Argo CD scripts in full in its `argocd-cm` snippet; they must be the
/// shipped files (without their comment header).
#[test]
fn the_documented_argocd_snippet_holds_the_shipped_scripts() {
    let root = env!("CARGO_MANIFEST_DIR");
    let doc = std::fs::read_to_string(format!("{root}/docs/health.md")).unwrap();
    for (key, file) in [
        ("pullman.dev_WorkOrder", "workorder.lua"),
        ("pullman.dev_Executor", "executor.lua"),
    ] {
        let script = std::fs::read_to_string(format!("{root}/docs/health/argocd/{file}")).unwrap();
        let body: String = script
            .lines()
            .filter(|l| !l.starts_with("--"))
            .map(|l| format!("    {l}\n"))
            .collect();
        let header = format!("  resource.customizations.health.{key}: |\n");
        let at = doc
            .find(&header)
            .unwrap_or_else(|| panic!("{header} in docs/health.md"));
        assert!(
            doc[at + header.len()..].starts_with(&body),
            "docs/health.md's {key} differs from docs/health/argocd/{file}"
        );
    }
}
