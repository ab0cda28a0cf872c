//! Read your writes (see the parent module): the WorkOrder statuses this controller wrote that
//! its cache may not show yet.
//!
//! The cache follows the API server through a watch, which lags behind the controller's own
//! writes, by seconds under a burst. A reconcile that reads a lagging cache sees the status
//! before its own last write (no status yet, or `Pending` when it already wrote `Succeeded`),
//! computes the current status against that, finds it differs, and writes it again, with an
//! Event for a transition that already had one.
//!
//! So a reconcile takes as the previous status the one it last wrote, while the cache has not
//! caught up with it (the cached status differs) and for at most [`READ_YOUR_WRITES`]; once the
//! cache shows it the entry goes. A status someone else wrote within that window is reconciled
//! when the window ends (see [`Written::recheck_in`]). Entries exist only for writes in flight
//! to the cache, so memory follows the burst, not the number of WorkOrders.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::crd::WorkOrderStatus;

/// How long a written status stands in for a cache that does not show it: the longest watch
/// lag worth waiting out before the cache is believed again.
pub const READ_YOUR_WRITES: Duration = Duration::from_secs(30);

/// Entries kept before expired ones are swept (on insert, so the sweep's cost is shared out).
const SWEEP_ABOVE: usize = 1024;

/// Statuses written, by WorkOrder uid (see the module docs).
#[derive(Default)]
pub struct Written {
    inner: Mutex<HashMap<Uuid, (WorkOrderStatus, Instant)>>,
}

impl Written {
    /// The previous status a reconcile of WorkOrder `id` compares against: the one this
    /// controller last wrote, while `cached` does not show it yet and it is younger than
    /// [`READ_YOUR_WRITES`]; else `cached`.
    pub fn previous(&self, id: Uuid, cached: Option<&WorkOrderStatus>) -> Option<WorkOrderStatus> {
        let mut map = self.lock();
        if let Some((status, at)) = map.get(&id) {
            if cached != Some(status) && at.elapsed() < READ_YOUR_WRITES {
                return Some(status.clone());
            }
            map.remove(&id);
        }
        cached.cloned()
    }

    /// When a reconcile that took a written status over the cached one should look again, so
    /// that a status written by someone else meanwhile is not overlooked: once the entry
    /// expires. `None` when the cache shows the written status (or there is none).
    pub fn recheck_in(&self, id: Uuid, cached: Option<&WorkOrderStatus>) -> Option<Duration> {
        let map = self.lock();
        let (status, at) = map.get(&id)?;
        (cached != Some(status))
            .then(|| READ_YOUR_WRITES.saturating_sub(at.elapsed()) + Duration::from_secs(1))
    }

    /// Records that `status` was written for WorkOrder `id`.
    pub fn record(&self, id: Uuid, status: WorkOrderStatus) {
        let mut map = self.lock();
        if map.len() >= SWEEP_ABOVE {
            map.retain(|_, (_, at)| at.elapsed() < READ_YOUR_WRITES);
        }
        map.insert(id, (status, Instant::now()));
    }

    /// Forgets WorkOrder `id` (deleted).
    pub fn forget(&self, id: Uuid) {
        self.lock().remove(&id);
    }

    /// Entries held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, (WorkOrderStatus, Instant)>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::WorkOrderPhase;

    fn status(phase: WorkOrderPhase) -> WorkOrderStatus {
        WorkOrderStatus {
            phase: Some(phase),
            ..Default::default()
        }
    }

    #[test]
    fn a_lagging_cache_is_read_through_the_last_write_until_it_catches_up() {
        let written = Written::default();
        let id = Uuid::from_u128(7);
        let (pending, succeeded) = (
            status(WorkOrderPhase::Pending),
            status(WorkOrderPhase::Succeeded),
        );
        // Nothing written: the cache is the truth.
        assert_eq!(written.previous(id, Some(&pending)), Some(pending.clone()));
        assert_eq!(written.recheck_in(id, Some(&pending)), None);

        written.record(id, pending.clone());
        written.record(id, succeeded.clone());
        // The cache still shows no status, then the first write: the last write stands in.
        assert_eq!(written.previous(id, None), Some(succeeded.clone()));
        assert_eq!(
            written.previous(id, Some(&pending)),
            Some(succeeded.clone())
        );
        let recheck = written.recheck_in(id, Some(&pending)).unwrap();
        assert!(
            recheck > READ_YOUR_WRITES - Duration::from_secs(1),
            "{recheck:?}"
        );
        assert!(
            recheck <= READ_YOUR_WRITES + Duration::from_secs(1),
            "{recheck:?}"
        );

        // The cache shows the last write: the entry goes, and the cache is believed again.
        assert_eq!(
            written.previous(id, Some(&succeeded)),
            Some(succeeded.clone())
        );
        assert_eq!(written.len(), 0);
        assert_eq!(written.previous(id, Some(&pending)), Some(pending));
    }

    #[test]
    fn entries_expire_and_are_swept() {
        let written = Written::default();
        let old = Instant::now() - READ_YOUR_WRITES - Duration::from_secs(1);
        for i in 0..=SWEEP_ABOVE as u128 {
            written
                .lock()
                .insert(Uuid::from_u128(i), (status(WorkOrderPhase::Pending), old));
        }
        // An expired entry no longer stands in for the cache.
        let first = Uuid::from_u128(0);
        assert_eq!(written.previous(first, None), None);
        assert_eq!(written.recheck_in(first, None), None);
        // The next write sweeps the rest.
        written.record(Uuid::from_u128(u128::MAX), status(WorkOrderPhase::Claimed));
        assert_eq!(written.len(), 1);
        written.forget(Uuid::from_u128(u128::MAX));
        assert_eq!(written.len(), 0);
    }
}
