//! Leader election among controller replicas (docs/design.md §7): only the leader reconciles,
//! another takes over when it stops, and replicas that start together never lead at once.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::events::v1::Event as KubeEvent;
use kube::Api;
use kube::api::ListParams;
use pullman::controller;
use pullman::crd::{WorkOrderPhase, WorkOrderResource};
use tokio_util::sync::CancellationToken;

use super::{CM, config, create_wo, phase_is, work_order};
use crate::support::kube::{client, drop_namespace, namespace};
use crate::support::{TestServer, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_reconciles_and_another_takes_over() {
    use k8s_openapi::api::coordination::v1::Lease;
    let k = client().await;
    let ns = namespace(&k, "le").await;
    let s = TestServer::start().await;
    let leases: Api<Lease> = Api::namespaced(k.clone(), &ns);
    let spawn = |identity: &str| {
        let stop = CancellationToken::new();
        let handle = tokio::spawn(controller::run_with_leader_election(
            k.clone(),
            s.queue.clone(),
            s.notifications.clone(),
            config(&ns, identity),
            stop.clone(),
        ));
        (stop, handle)
    };
    let (_stop_a, handle_a) = spawn("replica-a");
    let holder = eventually(30, "a leader", || async {
        leases
            .get_opt("pullman-controller")
            .await
            .ok()??
            .spec?
            .holder_identity
    })
    .await;
    assert_eq!(holder, "replica-a");
    let (stop_b, handle_b) = spawn("replica-b");
    let api: Api<WorkOrderResource> = Api::namespaced(k.clone(), &ns);
    create_wo(&api, work_order("first", "x", CM)).await;
    phase_is(&api, "first", WorkOrderPhase::Pending).await;
    let events: Api<KubeEvent> = Api::namespaced(k.clone(), &ns);
    let instances = |list: Vec<KubeEvent>, name: &str| -> Vec<String> {
        list.into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .filter_map(|e| e.reporting_instance)
            .collect()
    };
    let seen = eventually(10, "the Queued event", || async {
        let i = instances(
            events.list(&ListParams::default()).await.ok()?.items,
            "first",
        );
        (!i.is_empty()).then_some(i)
    })
    .await;
    assert!(
        seen.iter().all(|i| i == "replica-a"),
        "only the leader reconciles: {seen:?}"
    );

    // Kill the leader without releasing the Lease: the other replica takes over once it expires.
    handle_a.abort();
    let holder = eventually(60, "replica-b to lead", || async {
        let h = leases
            .get_opt("pullman-controller")
            .await
            .ok()??
            .spec?
            .holder_identity?;
        (h == "replica-b").then_some(h)
    })
    .await;
    assert_eq!(holder, "replica-b");
    create_wo(&api, work_order("second", "x", CM)).await;
    phase_is(&api, "second", WorkOrderPhase::Pending).await;
    let seen = eventually(10, "the second Queued event", || async {
        let i = instances(
            events.list(&ListParams::default()).await.ok()?.items,
            "second",
        );
        (!i.is_empty()).then_some(i)
    })
    .await;
    assert!(seen.iter().all(|i| i == "replica-b"), "{seen:?}");
    stop_b.cancel();
    let _ = handle_b.await;
    drop_namespace(&k, &ns).await;
}

/// Replicas that start together (a Deployment rolled out, both pods up in the same 20 ms) never
/// lead at once: each takes the Lease under its own field manager, so the second apply conflicts.
/// Each round watches until 2 s after the first replica leads: how soon that is depends on the
/// API server's latency (a CI host running other suites took over 2 s once), which is not what
/// this test is about, so it waits up to 30 s for a first leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_starting_together_never_lead_at_once() {
    let k = client().await;
    let ns = namespace(&k, "lr").await;
    for round in 0..10 {
        let started = std::time::Instant::now();
        let managers = futures::future::join_all((0..8).map(|i| {
            let mut c = config(&ns, &format!("r{round}-{i}"));
            c.lease_name = format!("race-{round}");
            let k = k.clone();
            async move { controller::lease_manager(k, &c).await }
        }))
        .await;
        // (when, replica, leads) as each replica's own channel said it.
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        // When any replica first said it leads: every watcher stops 2 s after that.
        let (first_lead, _) = tokio::sync::watch::channel(None::<tokio::time::Instant>);
        let first_lead = Arc::new(first_lead);
        let mut watching = Vec::new();
        for (i, m) in managers.into_iter().enumerate() {
            let m = m.unwrap_or_else(|e| panic!("round {round}: manager {i}: {e}"));
            let seen = seen.clone();
            let first_lead = first_lead.clone();
            watching.push(tokio::spawn(async move {
                let (mut leading, task) = m.watch().await;
                let mut led = first_lead.subscribe();
                let give_up = tokio::time::Instant::now() + Duration::from_secs(30);
                loop {
                    let leads = *leading.borrow_and_update();
                    seen.lock().unwrap().push((started.elapsed(), i, leads));
                    if leads {
                        first_lead.send_if_modified(|at| {
                            let first = at.is_none();
                            at.get_or_insert_with(tokio::time::Instant::now);
                            first
                        });
                    }
                    let deadline = match *led.borrow_and_update() {
                        Some(at) => at + Duration::from_secs(2),
                        None => give_up,
                    };
                    tokio::select! {
                        _ = tokio::time::sleep_until(deadline) => break,
                        c = leading.changed() => if c.is_err() { break },
                        _ = led.changed() => {}
                    }
                }
                drop(leading);
                let _ = task.await;
            }));
        }
        for w in watching {
            w.await.unwrap();
        }
        let mut seen = seen.lock().unwrap().clone();
        seen.sort_by_key(|(at, _, _)| *at);
        let mut leaders = std::collections::BTreeSet::new();
        let mut ever = 0;
        for (at, i, leads) in &seen {
            if *leads {
                leaders.insert(*i);
                ever += 1;
            } else {
                leaders.remove(i);
            }
            assert!(
                leaders.len() <= 1,
                "round {round}: replicas {leaders:?} lead at once at {at:?}: {seen:?}"
            );
        }
        assert!(ever >= 1, "round {round}: nobody led: {seen:?}");
    }
    drop_namespace(&k, &ns).await;
}
