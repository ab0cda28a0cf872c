//! Taking what waits in a queue as one batch, the way Pullman's batchers form theirs: the
//! server's group commit of completes (`queue::group_commit`), its group claims
//! (`queue::claims::group`) and an agent's reports (`pull::report`). Several tasks share one
//! receiver; each takes a batch, works it, and comes back, so while one batch is in flight the
//! next forms, and nothing waits to fill a batch.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{Mutex, mpsc};

/// Starts `runners` tasks on the current tokio runtime sharing one queue: each takes what waits
/// ([`take_waiting`], at most `most` items, unweighed), awaits `work` on that batch, and comes
/// back, until every sender is dropped and the queue is empty. Returns the queue's sender.
pub(crate) fn spawn_runners<T, F, Fut>(
    runners: usize,
    most: usize,
    work: F,
) -> mpsc::UnboundedSender<T>
where
    T: Send + 'static,
    F: Fn(Vec<T>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let (sender, receiver) = mpsc::unbounded_channel();
    let receiver = Arc::new(Mutex::new(receiver));
    for _ in 0..runners {
        let (receiver, work) = (receiver.clone(), work.clone());
        tokio::spawn(async move {
            while let Some(batch) = take_waiting(&receiver, most, |_| 0, usize::MAX).await {
                work(batch).await;
            }
        });
    }
    sender
}

/// Waits for the first item of `receiver` (`None` once it is closed and empty), yields one turn
/// of the scheduler, then takes every other item waiting while the batch holds fewer than `most`
/// items and their `weight` (say, bytes) sums to less than `most_weight`. The receiver is held
/// until the batch is taken, so the tasks sharing it take turns.
///
/// The turn of the scheduler is what makes batches: items sent together (the orders of an agent
/// that finished at once, several agents' answers read from one poll of the sockets) reach the
/// queue a few microseconds apart. Without it the group commit committed the first of them mostly
/// alone (`bench/queue.rs` 2d: 1,430 of 10,000 completes alone, 710 with it; bench/README.md,
/// issue #34).
pub(crate) async fn take_waiting<T>(
    receiver: &Mutex<mpsc::UnboundedReceiver<T>>,
    most: usize,
    weight: impl Fn(&T) -> usize,
    most_weight: usize,
) -> Option<Vec<T>> {
    let mut receiver = receiver.lock().await;
    let first = receiver.recv().await?;
    tokio::task::yield_now().await;
    let mut weighs = weight(&first);
    let mut batch = vec![first];
    while batch.len() < most && weighs < most_weight {
        match receiver.try_recv() {
            Ok(next) => {
                weighs += weight(&next);
                batch.push(next);
            }
            Err(_) => break,
        }
    }
    Some(batch)
}
