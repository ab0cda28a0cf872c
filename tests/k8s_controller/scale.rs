//! The WorkOrder controller under load and with specs it must refuse (issues #13, #16): a burst of
//! orders finishing at once reaches every final status with a bounded number of status writes,
//! never more at once than the reconcile concurrency; an `agentIds` entry that is not a UUID is
//! rejected with a message naming the field.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context as TaskContext, Poll};

use futures::StreamExt;
use k8s_openapi::api::events::v1::Event as KubeEvent;
use kube::api::ListParams;
use kube::client::ClientBuilder;
use kube::{Api, Client, ResourceExt};
use pullman::crd::{WorkOrderPhase, WorkOrderResource};
use serde_json::json;

use crate::support::kube::{client, drop_namespace, namespace};
use crate::support::{TestServer, eventually};
use crate::{CM, create_wo, phase_is, start_controllers, work_order};

/// Status writes (PATCH `…/workorders/<name>/status`) a client made: in total and most at once.
#[derive(Default)]
struct StatusWrites {
    total: AtomicUsize,
    in_flight: AtomicUsize,
    most_at_once: AtomicUsize,
}

#[derive(Clone)]
struct Counting<S> {
    inner: S,
    writes: Arc<StatusWrites>,
}

impl<S, B> tower::Service<http::Request<B>> for Counting<S>
where
    S: tower::Service<http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let is_status_write = req.method() == http::Method::PATCH
            && req.uri().path().contains("/workorders/")
            && req.uri().path().ends_with("/status");
        let writes = self.writes.clone();
        if is_status_write {
            writes.total.fetch_add(1, Ordering::SeqCst);
            let now = writes.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            writes.most_at_once.fetch_max(now, Ordering::SeqCst);
        }
        let fut = self.inner.call(req);
        Box::pin(async move {
            let out = fut.await;
            if is_status_write {
                writes.in_flight.fetch_sub(1, Ordering::SeqCst);
            }
            out
        })
    }
}

/// A client for the test control plane that counts the status writes made through it.
async fn counting_client(writes: Arc<StatusWrites>) -> Client {
    let config = kube::Config::infer().await.expect("KUBECONFIG");
    ClientBuilder::try_from(config)
        .expect("client from KUBECONFIG")
        .with_layer(&tower::layer::layer_fn(move |inner| Counting {
            inner,
            writes: writes.clone(),
        }))
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_finishing_orders_reaches_every_final_status_with_bounded_writes() {
    const N: usize = 150;
    let k = client().await;
    let ns = namespace(&k, "burst").await;
    let s = TestServer::start().await;
    let writes = Arc::new(StatusWrites::default());
    let counted = counting_client(writes.clone()).await;
    let stop = start_controllers(&counted, &s, &ns);
    let api: Api<WorkOrderResource> = Api::namespaced(k.clone(), &ns);
    let (agent, tok) = s.agent(json!({"name": "a", "labels": ["burst"]})).await;

    let created: Vec<WorkOrderResource> = futures::stream::iter(0..N)
        .map(|i| create_wo(&api, work_order(&format!("burst-{i}"), "burst", CM)))
        .buffer_unordered(16)
        .collect()
        .await;
    eventually(60, "every WorkOrder Pending", || async {
        let list = api.list(&ListParams::default()).await.ok()?;
        let pending = list
            .items
            .iter()
            .filter(|w| w.status.as_ref().and_then(|s| s.phase) == Some(WorkOrderPhase::Pending))
            .count();
        (pending == N).then_some(())
    })
    .await;

    // Every order claimed and then finished as fast as the API takes it: a burst of queue
    // changes (two per order) the controller must fold into a bounded number of writes.
    let uids: Vec<String> = created.iter().map(|w| w.uid().unwrap()).collect();
    let s = &s;
    let (agent, tok) = (&agent, &tok);
    futures::stream::iter(uids.iter())
        .map(|uid| async move {
            let (code, v) = s.claim(uid, agent, tok).await;
            assert_eq!(code, 200, "{v}");
            let (code, v) = s
                .complete(
                    uid,
                    tok,
                    json!({"agent_id": agent, "success": true, "message": "ok"}),
                )
                .await;
            assert_eq!(code, 200, "{v}");
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;

    eventually(90, "every WorkOrder Succeeded", || async {
        let list = api.list(&ListParams::default()).await.ok()?;
        let done = list
            .items
            .iter()
            .filter(|w| w.status.as_ref().and_then(|s| s.phase) == Some(WorkOrderPhase::Succeeded))
            .count();
        (done == N).then_some(())
    })
    .await;
    // Let any write still queued land before counting.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let total = writes.total.load(Ordering::SeqCst);
    let most = writes.most_at_once.load(Ordering::SeqCst);
    // At most the three states each order is seen in (Pending, Claimed, Succeeded): none
    // written again because the cache had not caught up with the controller's previous write
    // (`controller::burst`; before it, a burst repeated writes that way).
    eprintln!("{total} status writes for {N} WorkOrders");
    assert!(
        total <= 3 * N,
        "{total} status writes for {N} WorkOrders (at most {} expected)",
        3 * N
    );
    assert!(total >= N, "{total} status writes for {N} WorkOrders");
    let bound = usize::from(pullman::controller::RECONCILE_CONCURRENCY);
    assert!(
        most <= bound,
        "{most} status writes at once; the reconcile concurrency is {bound}"
    );
    stop.cancel();
    drop_namespace(&k, &ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_id_that_is_not_a_uuid_is_rejected_naming_the_field() {
    let k = client().await;
    let ns = namespace(&k, "agentids").await;
    let s = TestServer::start().await;
    let stop = start_controllers(&k, &s, &ns);
    let api: Api<WorkOrderResource> = Api::namespaced(k.clone(), &ns);
    let good = uuid::Uuid::new_v4().to_string();
    let mut body = work_order("bad-id", "x", CM);
    body["spec"]["targeting"] = json!({"agentIds": [good, "executor-a"]});
    let wo = create_wo(&api, body).await;
    let uid: uuid::Uuid = wo.uid().unwrap().parse().unwrap();

    let wo = phase_is(&api, "bad-id", WorkOrderPhase::Failed).await;
    let st = wo.status.unwrap();
    let stalled = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Stalled")
        .expect("a Stalled condition");
    assert_eq!(stalled.reason, "Rejected");
    assert!(
        stalled.message.contains("spec.targeting.agentIds[1]")
            && stalled.message.contains("executor-a"),
        "{}",
        stalled.message
    );
    assert!(
        st.message
            .as_deref()
            .is_some_and(|m| m.contains("spec.targeting.agentIds[1]")),
        "{:?}",
        st.message
    );
    assert!(
        matches!(
            s.queue.lookup(uid, false).await.unwrap(),
            pullman::queue::Lookup::Unknown
        ),
        "nothing was queued"
    );
    let events: Api<KubeEvent> = Api::namespaced(k.clone(), &ns);
    eventually(20, "a Rejected event naming the field", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("Rejected")
                    && e.note
                        .as_deref()
                        .is_some_and(|n| n.contains("spec.targeting.agentIds[1]"))
            })
            .then_some(())
    })
    .await;
    stop.cancel();
    drop_namespace(&k, &ns).await;
}
