//! The executor sends its pods' logs as the order's output (docs/design.md §9). On kwok nodes the
//! kubelet is fake and has no logs to give: the executor says so once per container, as one
//! line, not per line and not in a loop, and the order still completes.

use std::time::Duration;

use serde_json::{Value, json};

use super::{Executor, job, order, setup};
use crate::support::kube::drop_namespace;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_without_logs_is_said_once_per_container() {
    let t = setup("out").await;
    let (ex, _) = Executor::start_with(&t.s, &t.k, &t.agent, &t.token, &t.ns, 15, 2, true);

    // A Job whose pod has an init container and a main container.
    let yaml = job("talk", json!({})).replace(
        "      containers:\n",
        "      initContainers:\n      - name: setup\n        image: busybox\n        command: [\"echo\", \"init\"]\n      containers:\n",
    );
    let id = t.s.order(order(&t.ns, &yaml, 600)).await;
    let v = t.s.log_entry(&id, 90).await;
    assert_eq!(v["outcome"], "succeeded", "{v}");
    // Nothing more arrives after the order completed: read, wait, read again.
    let read = || async {
        let (status, v) =
            t.s.admin_get(&format!("/api/v1/work-orders/{id}/output"))
                .await;
        assert_eq!(status, 200, "{v}");
        v["lines"].as_array().unwrap().clone()
    };
    let lines = read().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(read().await, lines, "no line after the order completed");
    let streams: Vec<&str> = lines
        .iter()
        .map(|l| l["stream"].as_str().unwrap())
        .collect();
    let pod_streams = |container: &str| {
        streams
            .iter()
            .filter(|s| s.starts_with("talk-") && s.ends_with(&format!("/{container}")))
            .count()
    };
    assert_eq!(pod_streams("main"), 1, "said once for main: {lines:?}");
    assert_eq!(
        pod_streams("setup"),
        1,
        "said once for the init container: {lines:?}"
    );
    for l in &lines {
        let text = l["text"].as_str().unwrap();
        assert!(
            text.starts_with("[pullman] no logs from this container"),
            "{l}"
        );
        assert!(!text.contains(&t.token), "{l}");
        assert_eq!(l["attempt"], Value::from(1), "{l}");
    }

    // An order that runs nothing in a pod has no output, not even a "no logs" line.
    let cm =
        t.s.order(order(
            &t.ns,
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: quiet\ndata: {k: v}\n",
            600,
        ))
        .await;
    let v = t.s.log_entry(&cm, 60).await;
    assert_eq!(v["outcome"], "succeeded", "{v}");
    let (status, v) =
        t.s.admin_get(&format!("/api/v1/work-orders/{cm}/output"))
            .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["lines"], json!([]), "{v}");

    ex.stop().await;
    drop_namespace(&t.k, &t.ns).await;
}
