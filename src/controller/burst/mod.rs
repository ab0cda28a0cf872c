//! What keeps a burst of WorkOrders cheap for the API server: everything the WorkOrder reconcile
//! does only because many orders change at once, behind one type ([`Burst`]) so that the
//! reconcile itself reads as look up → queue → status → write → wake (`super::workorders`).
//!
//! Four measures, each correct to leave out and each bought with figures kept in
//! `bench/README.md` ("Operator scale", `cargo bench --bench k8s_scale`):
//!
//! - **Change window** ([`queue_changes`], [`CHANGE_WINDOW`]): queue changes are gathered for a
//!   moment and asked as one reconcile per WorkOrder, so an order claimed and finished within it
//!   is one status write and one Event, not two of each.
//! - **Claim hold** ([`Burst::hold`]): a claim younger than the window is not written on its own
//!   when the reconcile was started by something else; its end usually follows within the window.
//! - **Read your writes** ([`written`]): the cache lags behind the controller's own status writes;
//!   the last status written stands in for it until it catches up, so nothing is written twice.
//! - **Payloads set aside** ([`super::cache::Payloads`]): the watch keeps a new WorkOrder's
//!   `yamlContent` until it is queued, which saves one read of each new object.

mod changes;
mod written;

pub use changes::queue_changes;

use std::time::Duration;

use uuid::Uuid;

use super::cache::Payloads;
use crate::crd::{WorkOrderPhase, WorkOrderStatus};
use crate::queue::{Lookup, OrderStatus};
use written::Written;

/// How long queue changes are gathered before their reconciles are requested, and so the most a
/// queue change waits for one; also how long a young claim's status is held back
/// ([`Burst::hold`]). A ConfigMap order is claimed and finished well within it.
pub const CHANGE_WINDOW: Duration = Duration::from_millis(100);

/// The burst measures of one WorkOrder watch (module docs). Every method is a shortcut or a
/// deferral: with all of them answering "nothing", the reconcile is still correct, only dearer.
pub struct Burst {
    written: Written,
    payloads: Payloads,
}

impl Burst {
    /// Measures over the payloads `payloads` the watch sets aside (`super::cache::watch`).
    pub fn new(payloads: Payloads) -> Self {
        Self {
            written: Written::default(),
            payloads,
        }
    }

    /// The status a reconcile of WorkOrder `id` compares its new status against: the one last
    /// written while the cache (`cached`) does not show it yet, else `cached`.
    pub fn previous(&self, id: Uuid, cached: Option<&WorkOrderStatus>) -> Option<WorkOrderStatus> {
        self.written.previous(id, cached)
    }

    /// How long to put off writing the status of an order that `found` shows claimed less than
    /// [`CHANGE_WINDOW`] ago (by `now`), so that its end, likely within the window, is written
    /// with it: one status write and one Event instead of two. `None`: write now.
    ///
    /// Never held: the first status (`prev` is `None`: a WorkOrder gets a status on its first
    /// reconcile, docs/design.md §6), a claim already written, an order not claimed.
    /// `claimed_at` is the database's clock and `now` this process's: only an age in
    /// `[0, window)` is held, so every hold of one claim ends within one window of this clock,
    /// and a claim that looks younger than zero (the database's clock ahead) is written at once.
    pub fn hold(
        &self,
        found: &Lookup,
        prev: Option<&WorkOrderStatus>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Option<Duration> {
        claim_hold(found, prev, now)
    }

    /// The `yamlContent` of WorkOrder `id` if the watch set it aside (taken: asked once);
    /// `None`: read the object.
    pub fn payload(&self, id: Uuid) -> Option<String> {
        self.payloads.take(id)
    }

    /// Records that `status` was written for WorkOrder `id`.
    pub fn wrote(&self, id: Uuid, status: WorkOrderStatus) {
        self.written.record(id, status);
    }

    /// When to reconcile WorkOrder `id` again: `after` (the reconcile's own answer, `None` = on
    /// its next change), or sooner if this reconcile took a written status over `cached`: once
    /// that stand-in expires, so that a status someone else wrote meanwhile is not overlooked.
    pub fn wake(
        &self,
        id: Uuid,
        cached: Option<&WorkOrderStatus>,
        after: Option<Duration>,
    ) -> Option<Duration> {
        match (after, self.written.recheck_in(id, cached)) {
            (Some(after), Some(recheck)) => Some(after.min(recheck)),
            (after, recheck) => after.or(recheck),
        }
    }

    /// Forgets WorkOrder `id` (deleted).
    pub fn forget(&self, id: Uuid) {
        self.written.forget(id);
    }
}

fn claim_hold(
    found: &Lookup,
    prev: Option<&WorkOrderStatus>,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<Duration> {
    let Lookup::Active(order) = found else {
        return None;
    };
    let claimed_at = order
        .claimed_at
        .filter(|_| order.status == OrderStatus::Claimed)?;
    if prev?.phase == Some(WorkOrderPhase::Claimed) {
        return None;
    }
    let age = (now - claimed_at).to_std().ok()?;
    CHANGE_WINDOW
        .checked_sub(age)
        .filter(|left| !left.is_zero())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::status;

    fn burst() -> Burst {
        Burst::new(Payloads::default())
    }

    fn order(status: OrderStatus, claimed_ms_ago: Option<i64>) -> Lookup {
        let mut o = status::tests::active(status);
        o.claimed_at =
            claimed_ms_ago.map(|ms| chrono::Utc::now() - chrono::Duration::milliseconds(ms));
        Lookup::Active(Box::new(o))
    }

    fn phase(p: WorkOrderPhase) -> WorkOrderStatus {
        WorkOrderStatus {
            phase: Some(p),
            ..Default::default()
        }
    }

    #[test]
    fn a_young_claim_waits_out_the_window_once_a_status_exists() {
        let b = burst();
        let pending = phase(WorkOrderPhase::Pending);
        let now = chrono::Utc::now();
        let young = order(OrderStatus::Claimed, Some(10));
        let hold = b.hold(&young, Some(&pending), now).expect("held back");
        assert!(hold > Duration::ZERO && hold <= CHANGE_WINDOW, "{hold:?}");
        // The first reconcile writes a status whatever the queue says.
        assert_eq!(b.hold(&young, None, now), None);
        // Claimed already written: nothing to fold.
        let claimed = phase(WorkOrderPhase::Claimed);
        assert_eq!(b.hold(&young, Some(&claimed), now), None);
        // Older than the window: written now.
        let old = order(OrderStatus::Claimed, Some(250));
        assert_eq!(b.hold(&old, Some(&pending), now), None);
        // A claimed_at ahead of this clock is not held at all: holding it would start the
        // window anew on every reconcile until this clock caught up.
        let ahead = order(OrderStatus::Claimed, Some(-5_000));
        assert_eq!(b.hold(&ahead, Some(&pending), now), None);
        // Not a claim: nothing held.
        let waiting = order(OrderStatus::Pending, None);
        assert_eq!(b.hold(&waiting, Some(&pending), now), None);
        assert_eq!(b.hold(&Lookup::Unknown, Some(&pending), now), None);
    }

    #[test]
    fn a_written_status_stands_in_and_brings_the_next_wake_forward() {
        let b = burst();
        let id = Uuid::from_u128(1);
        let (pending, succeeded) = (
            phase(WorkOrderPhase::Pending),
            phase(WorkOrderPhase::Succeeded),
        );
        let resync = Some(Duration::from_secs(300));
        // Nothing written: the cache is the previous status, and the wake is the reconcile's.
        assert_eq!(b.previous(id, Some(&pending)), Some(pending.clone()));
        assert_eq!(b.wake(id, Some(&pending), resync), resync);
        assert_eq!(b.wake(id, Some(&pending), None), None);

        b.wrote(id, succeeded.clone());
        // The cache lags: the write stands in, and the reconcile looks again when it expires,
        // whether it asked to wake later or never.
        assert_eq!(b.previous(id, Some(&pending)), Some(succeeded.clone()));
        let recheck = b.wake(id, Some(&pending), None).expect("a recheck");
        assert!(recheck <= written::READ_YOUR_WRITES + Duration::from_secs(1));
        let sooner = b.wake(id, Some(&pending), resync).expect("a wake");
        assert!(sooner <= recheck, "the recheck, not the resync: {sooner:?}");
        // A sooner wake of its own stands.
        let soon = Some(Duration::from_secs(2));
        assert_eq!(b.wake(id, Some(&pending), soon), soon);
        // The cache caught up: no recheck.
        assert_eq!(b.wake(id, Some(&succeeded), resync), resync);

        b.wrote(id, succeeded.clone());
        b.forget(id);
        assert_eq!(b.previous(id, Some(&pending)), Some(pending));
    }
}
