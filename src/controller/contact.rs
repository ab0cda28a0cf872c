//! Follows agents' contact with the server for the Executor controller (docs/design.md §6: `Connected`
//! and `health` "updated within seconds").
//!
//! An agent's health changes without any Kubernetes event (it calls the API, or goes quiet), and
//! the Executor resync is 30 s. Reconciling every Executor every few seconds would cost API calls
//! per Executor; instead one query reads every agent's derived health each [`POLL`], and only the
//! Executors whose published `status.health` differs are reconciled.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::reflector::{ObjectRef, Store};
use uuid::Uuid;

use super::executor_status::health_str;
use crate::crd::Executor;
use crate::queue::limits::PAGE_LIMIT;
use crate::queue::{AgentHealth, Queue, QueueError};

/// How often agents' health is compared with what the Executors show. The queue records contact
/// at most once a second per agent, so a shorter period would gain little.
pub const POLL: Duration = Duration::from_secs(2);

/// Executors whose `status.health` no longer matches their agent's health. Executors without a
/// published health (not registered yet) or being deleted are left to their own reconcile.
pub fn outdated(
    executors: &[Arc<Executor>],
    health: &HashMap<Uuid, AgentHealth>,
) -> Vec<ObjectRef<Executor>> {
    executors
        .iter()
        .filter(|ex| ex.metadata.deletion_timestamp.is_none())
        .filter(|ex| {
            let shown = ex.status.as_ref().and_then(|s| s.health.as_deref());
            let id = ex
                .metadata
                .uid
                .as_deref()
                .and_then(|u| Uuid::parse_str(u).ok());
            match (shown, id.and_then(|id| health.get(&id))) {
                (Some(shown), Some(now)) => shown != health_str(*now),
                _ => false,
            }
        })
        .map(|ex| ObjectRef::from_obj(ex.as_ref()))
        .collect()
}

async fn agents_health(queue: &Queue) -> Result<HashMap<Uuid, AgentHealth>, QueueError> {
    let mut health = HashMap::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = queue.list_agents(PAGE_LIMIT.max, cursor.as_deref()).await?;
        health.extend(page.items.iter().map(|a| (a.id, a.health)));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(health),
        }
    }
}

/// Every [`POLL`], the Executors of `store` whose agent's health changed; feed it to
/// `Controller::reconcile_on`.
pub fn changes(queue: Queue, store: Store<Executor>) -> impl Stream<Item = ObjectRef<Executor>> {
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    futures::stream::unfold(
        (queue, store, tick),
        |(queue, store, mut tick)| async move {
            tick.tick().await;
            let executors = store.state();
            let refs = if executors.is_empty() {
                Vec::new()
            } else {
                match agents_health(&queue).await {
                    Ok(health) => outdated(&executors, &health),
                    Err(error) => {
                        tracing::debug!(%error, "could not read agents' health");
                        Vec::new()
                    }
                }
            };
            Some((futures::stream::iter(refs), (queue, store, tick)))
        },
    )
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::ExecutorStatus;

    fn executor(name: &str, uid: u128, health: Option<&str>) -> Arc<Executor> {
        let mut ex = Executor::new(name, Default::default());
        ex.metadata.namespace = Some("ns".into());
        ex.metadata.uid = Some(Uuid::from_u128(uid).to_string());
        ex.status = health.map(|h| ExecutorStatus {
            health: Some(h.into()),
            ..Default::default()
        });
        Arc::new(ex)
    }

    #[test]
    fn only_executors_whose_agent_changed_are_reconciled() {
        let executors = vec![
            executor("quiet", 1, Some("never_seen")),
            executor("called", 2, Some("never_seen")),
            executor("steady", 3, Some("active")),
            executor("unregistered", 4, None),
            executor("gone-from-queue", 5, Some("active")),
        ];
        let health = HashMap::from([
            (Uuid::from_u128(1), AgentHealth::NeverSeen),
            (Uuid::from_u128(2), AgentHealth::Active),
            (Uuid::from_u128(3), AgentHealth::Active),
            (Uuid::from_u128(4), AgentHealth::Active),
        ]);
        let names: Vec<String> = outdated(&executors, &health)
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(names, vec!["called".to_string()]);
    }
}
