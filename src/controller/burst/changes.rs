//! The change window (see the parent module): queue changes (LISTEN/NOTIFY) gathered into one
//! reconcile request per WorkOrder.

use std::collections::HashSet;

use futures::StreamExt;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::broadcast::{self, error::RecvError};
use uuid::Uuid;

use super::CHANGE_WINDOW;
use crate::controller::cache;
use crate::crd::WorkOrderResource;

/// The WorkOrders to reconcile for queue changes (LISTEN/NOTIFY), gathered over
/// [`CHANGE_WINDOW`]: each changed id mapped to its resource through the uid index (O(1)), each
/// resource once per window; a lost notification stream (`None`, or this receiver lagging)
/// resyncs everything in the cache.
pub fn queue_changes(
    rx: broadcast::Receiver<Option<Uuid>>,
    store: Store<WorkOrderResource>,
    index: cache::UidIndex,
) -> impl futures::Stream<Item = ObjectRef<WorkOrderResource>> {
    futures::stream::unfold(rx, move |mut rx| {
        let store = store.clone();
        let index = index.clone();
        async move {
            let mut ids: HashSet<Uuid> = HashSet::new();
            let mut everything = false;
            let mut next = rx.recv().await;
            let window_ends = tokio::time::Instant::now() + CHANGE_WINDOW;
            loop {
                match next {
                    Ok(Some(id)) => {
                        ids.insert(id);
                    }
                    Ok(None) | Err(RecvError::Lagged(_)) => everything = true,
                    Err(RecvError::Closed) if ids.is_empty() && !everything => return None,
                    Err(RecvError::Closed) => break,
                }
                match tokio::time::timeout_at(window_ends, rx.recv()).await {
                    Ok(received) => next = received,
                    Err(_) => break,
                }
            }
            let refs: Vec<ObjectRef<WorkOrderResource>> = if everything {
                store
                    .state()
                    .iter()
                    .map(|o| ObjectRef::from_obj(o.as_ref()))
                    .collect()
            } else {
                ids.into_iter().filter_map(|id| index.get(id)).collect()
            };
            Some((futures::stream::iter(refs), rx))
        }
    })
    .flatten()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher;

    use super::*;
    use crate::controller::cache::tests::resource;

    #[tokio::test]
    async fn changes_within_the_window_are_one_request_per_workorder() {
        let mut writer = Writer::<WorkOrderResource>::default();
        let index = cache::UidIndex::default();
        let ids = [1, 2, 3].map(Uuid::from_u128);
        for (name, id) in ["a", "b", "c"].into_iter().zip(ids) {
            let event = watcher::Event::Apply(resource(name, id));
            writer.apply_watcher_event(&event);
            index.observe(&event);
        }
        let (tx, rx) = broadcast::channel(16);
        let changes = queue_changes(rx, writer.as_reader(), index);
        tokio::pin!(changes);
        let quiet = Duration::from_millis(300);

        for id in [ids[0], ids[1], ids[0], ids[0], Uuid::from_u128(99)] {
            tx.send(Some(id)).unwrap();
        }
        let mut got = vec![
            changes.next().await.unwrap().name,
            changes.next().await.unwrap().name,
        ];
        got.sort();
        assert_eq!(got, ["a", "b"], "an unknown id asks for nothing");
        assert!(
            tokio::time::timeout(quiet, changes.next()).await.is_err(),
            "a, changed three times, is asked once"
        );

        // A lost change (`None`) asks for every WorkOrder in the cache.
        tx.send(None).unwrap();
        let mut all = Vec::new();
        for _ in 0..3 {
            all.push(changes.next().await.unwrap().name);
        }
        all.sort();
        assert_eq!(all, ["a", "b", "c"]);
        assert!(tokio::time::timeout(quiet, changes.next()).await.is_err());

        // The notifications closed: the stream ends.
        drop(tx);
        assert!(changes.next().await.is_none());
    }
}
