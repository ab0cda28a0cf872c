//! Targeted wake-ups for long-polling claimers (docs/design.md §5 claim-next `max_wait_seconds`):
//! the wait list they sleep on. The long-poll itself is `queue::long_poll`.
//!
//! Waking every long-poll on every new order makes all of them race for it: with 64 waiters one
//! insert cost 64 claim transactions and a p99 wake-up of 70 ms on two cores (issue #7). Instead
//! each `pullman_claimable` notification, which carries the order's eligibility facts, is handed
//! to **one** waiter that may take it: the longest-waiting idle one, else a busy one (it will look
//! again after its current attempt).
//!
//! A waiter that was woken for an order and did not get it (someone else claimed it, the agent is
//! at `max_concurrency`, or it took an older order) passes the notice on to the next eligible
//! waiter it has not yet visited, so no order waits for a poll to time out while an eligible
//! claimer sleeps. Each waiter sees a notice at most once, so passing ends.
//! When notifications may have been lost (listener reconnected) or a notice lacks the facts
//! (payload over PostgreSQL's limit), every waiter is woken, as before.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use tokio::sync::{Notify, watch};
use uuid::Uuid;

use super::eligibility::{self, AgentProfile, OrderProfile};
use super::{Targeting, WorkType};

/// What a `pullman_claimable` notification says about the order that became claimable.
#[derive(Debug, Clone)]
pub(crate) struct Notice {
    id: Uuid,
    work_type: WorkType,
    tenant: Option<String>,
    targeting: Targeting,
}

/// The payload as the trigger writes it (migration `20261201000001`).
#[derive(Deserialize)]
struct Payload {
    id: Uuid,
    work_type: String,
    #[serde(default)]
    tenant: Option<String>,
    /// Absent when the trigger cut the payload to fit PostgreSQL's 8000-byte limit.
    #[serde(flatten)]
    targeting: Option<PayloadTargeting>,
}

#[derive(Deserialize)]
struct PayloadTargeting {
    agent_ids: Vec<Uuid>,
    agent_names: Vec<String>,
    labels: Vec<String>,
    annotations: BTreeMap<String, String>,
}

impl Notice {
    /// The order that became claimable.
    pub(crate) fn id(&self) -> Uuid {
        self.id
    }

    /// Parses a payload; `None` when it lacks the targeting or is anything else (then every
    /// waiter is woken).
    pub(crate) fn parse(payload: &str) -> Option<Notice> {
        let p: Payload = serde_json::from_str(payload).ok()?;
        let t = p.targeting?;
        Some(Notice {
            id: p.id,
            work_type: WorkType::parse(&p.work_type)?,
            tenant: p.tenant,
            targeting: Targeting {
                agent_ids: t.agent_ids,
                agent_names: t.agent_names,
                labels: t.labels,
                annotations: t.annotations,
            },
        })
    }
}

/// Which orders a waiter may take: its agent and the work types of this claim (empty = all).
#[derive(Debug, Clone)]
pub(crate) struct WakeFilter {
    pub(crate) agent: AgentProfile,
    pub(crate) types: Vec<WorkType>,
}

impl WakeFilter {
    /// Whether this waiter may take the order of `notice` (the Rust side of
    /// `queue::eligibility`, docs/design.md §3 rules 1–3, narrowed to the claim's work types).
    pub(crate) fn admits(&self, notice: &Notice) -> bool {
        eligibility::agent_may_see(
            &self.agent,
            &OrderProfile {
                work_type: notice.work_type,
                tenant: notice.tenant.as_deref(),
                targeting: &notice.targeting,
            },
        ) && eligibility::narrowed_to(&self.types, notice.work_type)
    }
}

/// A notice on its way through the waiters, with those who already tried it.
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    notice: Arc<Notice>,
    visited: Vec<u64>,
}

impl Delivery {
    pub(crate) fn order_id(&self) -> Uuid {
        self.notice.id()
    }
}

struct Slot {
    /// `None` until the waiter's first attempt told us its agent: admits everything meanwhile.
    filter: Option<Arc<WakeFilter>>,
    idle: bool,
    inbox: Vec<Delivery>,
    bell: Arc<Notify>,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    /// By join order, so the longest-waiting claimer is served first.
    slots: BTreeMap<u64, Slot>,
}

/// The long-polling claimers of this process. Cheap to share (`Arc`).
pub(crate) struct WaitList {
    inner: Mutex<Inner>,
    /// Bumped to wake every waiter.
    everyone: watch::Sender<u64>,
}

impl WaitList {
    pub(crate) fn new() -> Self {
        WaitList {
            inner: Mutex::default(),
            everyone: watch::channel(0).0,
        }
    }

    /// Registers a waiter. Register *before* the first claim attempt, so an order that appears
    /// during it is not missed.
    pub(crate) fn join(self: &Arc<Self>) -> Waiter {
        let bell = Arc::new(Notify::new());
        let mut everyone = self.everyone.subscribe();
        everyone.borrow_and_update();
        let mut inner = self.inner.lock().expect("wait list lock");
        let id = inner.next_id;
        inner.next_id += 1;
        inner.slots.insert(
            id,
            Slot {
                filter: None,
                idle: false,
                inbox: Vec::new(),
                bell: bell.clone(),
            },
        );
        Waiter {
            list: self.clone(),
            id,
            bell,
            everyone,
        }
    }

    /// Hands a fresh notice to one waiter.
    pub(crate) fn notify(&self, notice: Notice) {
        self.deliver(Delivery {
            notice: Arc::new(notice),
            visited: Vec::new(),
        });
    }

    /// Wakes every waiter (notifications may have been lost).
    pub(crate) fn wake_everyone(&self) {
        self.everyone.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Number of registered waiters.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().expect("wait list lock").slots.len()
    }

    fn deliver(&self, delivery: Delivery) {
        let mut inner = self.inner.lock().expect("wait list lock");
        let admits = |(id, slot): &(&u64, &Slot)| {
            !delivery.visited.contains(id)
                && slot
                    .filter
                    .as_ref()
                    .is_none_or(|f| f.admits(&delivery.notice))
        };
        let chosen = inner
            .slots
            .iter()
            .filter(|e| e.1.idle)
            .find(admits)
            .or_else(|| inner.slots.iter().filter(|e| !e.1.idle).find(admits))
            .map(|(id, _)| *id);
        // Nobody here may take it: a claimer that arrives later finds it with its first attempt.
        if let Some(slot) = chosen.and_then(|id| inner.slots.get_mut(&id)) {
            slot.idle = false;
            slot.inbox.push(delivery);
            slot.bell.notify_one();
        }
    }
}

/// One long-poll's place in the [`WaitList`]; leaving (drop) passes on undelivered notices.
pub(crate) struct Waiter {
    list: Arc<WaitList>,
    id: u64,
    bell: Arc<Notify>,
    everyone: watch::Receiver<u64>,
}

impl Waiter {
    /// Tells the list which orders this waiter may take (learned from its claim attempt).
    pub(crate) fn set_filter(&self, filter: WakeFilter) {
        let mut inner = self.list.inner.lock().expect("wait list lock");
        if let Some(slot) = inner.slots.get_mut(&self.id) {
            slot.filter = Some(Arc::new(filter));
        }
    }

    /// Takes the notices delivered so far; call before a claim attempt, then [`Self::settle`].
    pub(crate) fn take_inbox(&self) -> Vec<Delivery> {
        let mut inner = self.list.inner.lock().expect("wait list lock");
        inner
            .slots
            .get_mut(&self.id)
            .map(|s| std::mem::take(&mut s.inbox))
            .unwrap_or_default()
    }

    /// After a claim attempt: notices for orders this waiter did not get go to the next waiter.
    pub(crate) fn settle(&self, taken: Vec<Delivery>, claimed: Option<Uuid>) {
        self.settle_many(taken, claimed.as_slice());
    }

    /// [`Self::settle`] after a multi-claim that took the orders `claimed`.
    pub(crate) fn settle_many(&self, taken: Vec<Delivery>, claimed: &[Uuid]) {
        for mut delivery in taken {
            if !claimed.contains(&delivery.order_id()) {
                delivery.visited.push(self.id);
                self.list.deliver(delivery);
            }
        }
    }

    /// Waits for a notice for this waiter, or for everyone to be woken. Marks the waiter idle
    /// meanwhile, so fresh notices prefer it over claimers busy with an attempt.
    pub(crate) async fn wait(&mut self) {
        {
            let mut inner = self.list.inner.lock().expect("wait list lock");
            if let Some(slot) = inner.slots.get_mut(&self.id) {
                slot.idle = slot.inbox.is_empty();
            }
        }
        tokio::select! {
            _ = self.bell.notified() => {}
            // Err: the list is gone (shutting down); returning lets the caller look once more.
            _ = self.everyone.changed() => {}
        }
        let mut inner = self.list.inner.lock().expect("wait list lock");
        if let Some(slot) = inner.slots.get_mut(&self.id) {
            slot.idle = false;
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let slot = self
            .list
            .inner
            .lock()
            .expect("wait list lock")
            .slots
            .remove(&self.id);
        if let Some(slot) = slot {
            self.settle(slot.inbox, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(name: &str, labels: &[&str]) -> WakeFilter {
        WakeFilter {
            agent: AgentProfile {
                id: Uuid::new_v4(),
                name: name.into(),
                labels: labels.iter().map(|l| l.to_string()).collect(),
                annotations: BTreeMap::new(),
                work_types: vec![],
                tenant: None,
                retired: false,
            },
            types: vec![],
        }
    }

    fn notice(labels: &[&str]) -> Notice {
        Notice::parse(
            &serde_json::json!({
                "id": Uuid::new_v4(), "work_type": "custom", "tenant": null,
                "agent_ids": [], "agent_names": [], "labels": labels, "annotations": {}
            })
            .to_string(),
        )
        .unwrap()
    }

    fn inbox_len(w: &Waiter) -> usize {
        w.list.inner.lock().unwrap().slots[&w.id].inbox.len()
    }

    fn idle(list: &Arc<WaitList>, filter: WakeFilter) -> Waiter {
        let w = list.join();
        w.set_filter(filter);
        list.inner
            .lock()
            .unwrap()
            .slots
            .get_mut(&w.id)
            .unwrap()
            .idle = true;
        w
    }

    #[test]
    fn payloads_without_facts_or_unknown_are_not_notices() {
        assert!(Notice::parse("custom").is_none());
        assert!(
            Notice::parse(r#"{"id":"5b0c3c1e-3f7e-4d8e-9a43-0d6f3f0d3a11","work_type":"custom"}"#)
                .is_none()
        );
        assert_eq!(notice(&["a"]).targeting.labels, vec!["a".to_string()]);
    }

    #[test]
    fn one_notice_wakes_one_eligible_waiter_longest_waiting_first() {
        let list = Arc::new(WaitList::new());
        let blue = idle(&list, agent("blue", &["blue"]));
        let red1 = idle(&list, agent("red1", &["red"]));
        let red2 = idle(&list, agent("red2", &["red"]));
        list.notify(notice(&["red"]));
        assert_eq!(
            (inbox_len(&blue), inbox_len(&red1), inbox_len(&red2)),
            (0, 1, 0)
        );
        // red1 is busy now; the next red order goes to red2.
        list.notify(notice(&["red"]));
        assert_eq!((inbox_len(&red1), inbox_len(&red2)), (1, 1));
        // Nobody idle is eligible: a busy eligible waiter gets it.
        list.notify(notice(&["red"]));
        assert_eq!(inbox_len(&red1) + inbox_len(&red2), 3);
        // Nobody eligible at all: dropped.
        list.notify(notice(&["green"]));
        assert_eq!(inbox_len(&blue) + inbox_len(&red1) + inbox_len(&red2), 3);
    }

    #[test]
    fn a_missed_notice_is_passed_on_once_per_waiter_and_ends() {
        let list = Arc::new(WaitList::new());
        let a = idle(&list, agent("a", &["x"]));
        let b = idle(&list, agent("b", &["x"]));
        list.notify(notice(&["x"]));
        let taken = a.take_inbox();
        assert_eq!(taken.len(), 1);
        a.settle(taken, None);
        assert_eq!((inbox_len(&a), inbox_len(&b)), (0, 1));
        let taken = b.take_inbox();
        b.settle(taken, None);
        // Both have tried: the notice ends instead of bouncing.
        assert_eq!((inbox_len(&a), inbox_len(&b)), (0, 0));
    }

    #[test]
    fn getting_the_noticed_order_ends_it_and_leaving_passes_it_on() {
        let list = Arc::new(WaitList::new());
        let a = idle(&list, agent("a", &["x"]));
        let b = idle(&list, agent("b", &["x"]));
        list.notify(notice(&["x"]));
        let taken = a.take_inbox();
        let id = taken[0].order_id();
        a.settle(taken, Some(id));
        assert_eq!(inbox_len(&b), 0);
        // a is busy after its attempt, b idle: b gets the next one; b leaves, so a gets it.
        list.notify(notice(&["x"]));
        assert_eq!((inbox_len(&a), inbox_len(&b)), (0, 1));
        drop(b);
        assert_eq!(inbox_len(&a), 1);
        drop(a);
        assert_eq!(list.len(), 0);
    }

    #[test]
    fn a_waiter_without_a_filter_yet_admits_everything() {
        let list = Arc::new(WaitList::new());
        let w = list.join();
        list.notify(notice(&["anything"]));
        assert_eq!(inbox_len(&w), 1);
    }

    #[tokio::test]
    async fn wait_returns_on_a_notice_or_when_everyone_is_woken() {
        let list = Arc::new(WaitList::new());
        let mut w = idle(&list, agent("a", &["x"]));
        list.notify(notice(&["x"]));
        tokio::time::timeout(std::time::Duration::from_secs(5), w.wait())
            .await
            .expect("woken by the notice");
        w.take_inbox();
        let l = list.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            l.wake_everyone();
        });
        tokio::time::timeout(std::time::Duration::from_secs(5), w.wait())
            .await
            .expect("woken with everyone");
    }
}
