//! Claim-next with long-poll (docs/design.md §5 `max_wait_seconds`): try to claim, and when
//! nothing was claimed sleep until woken for an order this agent may take (`wake`'s wait list,
//! fed by `notify`'s listener) or the deadline, then try again. Each try is `claim_next_as`
//! (`claims`).

use std::time::Duration;

use super::{ClaimRequest, Notifications, Queue, QueueError, WorkOrder, WorkType};

impl Queue {
    /// Claim-next with long-poll (docs/design.md §5 `max_wait_seconds`): claims the oldest eligible
    /// orders (up to `max_orders`, at least 1), or waits up to `wait` for one to become claimable
    /// and claims what there is then; it does not wait for more once it has one. Empty when the
    /// wait passed with nothing claimed. The caller bounds `wait` (the API caps it at 30 s) and
    /// `max_orders`.
    pub async fn claim_next_waiting(
        &self,
        req: &ClaimRequest,
        work_types: &[WorkType],
        max_orders: usize,
        wait: Duration,
        notifications: &Notifications,
    ) -> Result<Vec<WorkOrder>, QueueError> {
        if wait.is_zero() {
            return self.claim_next_many(req, work_types, max_orders).await;
        }
        let deadline = tokio::time::Instant::now() + wait;
        let mut waiter = notifications.waits().join();
        loop {
            let woke_by = waiter.take_inbox();
            let (orders, claimer) = match self.claim_next_as(req, work_types, max_orders).await {
                Ok(attempt) => attempt,
                Err(error) => {
                    waiter.settle(woke_by, None);
                    return Err(error);
                }
            };
            waiter.set_filter(claimer.wake_filter(work_types));
            // A notice for an order this claim took is settled; others are passed on.
            waiter.settle_many(woke_by, &orders.iter().map(|o| o.id).collect::<Vec<_>>());
            let stopping = notifications.draining();
            if !orders.is_empty()
                || tokio::time::Instant::now() >= deadline
                || stopping.is_cancelled()
            {
                return Ok(orders);
            }
            tokio::select! {
                _ = waiter.wait() => {}
                _ = tokio::time::sleep_until(deadline) => {}
                _ = stopping.cancelled() => {}
            }
        }
    }
}
