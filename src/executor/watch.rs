//! Watching one object to a verdict within a deadline (DESIGN.md §4). Watch errors and re-lists
//! are survived: a dropped watch is resumed by the watcher's backoff, and an object is only
//! taken as deleted when the API server says so (a `Delete` event, or a completed re-list
//! without it).

use std::time::Instant;

use futures::StreamExt;
use kube::Api;
use kube::api::DynamicObject;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio_util::sync::CancellationToken;

use super::verdict::ObjectVerdict;

/// How a watch ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEnd {
    /// The object reached a terminal verdict.
    Verdict(ObjectVerdict),
    /// The object was deleted before a verdict.
    Deleted,
    /// The deadline passed with the object still running.
    DeadlineReached,
    /// The carrier was told to stop.
    Stopped,
}

/// Watches the object `name` through `api` until `judge` gives a terminal verdict, the object is
/// deleted, `deadline` passes, or `stop` fires.
pub async fn watch_object(
    api: Api<DynamicObject>,
    name: &str,
    deadline: Instant,
    stop: &CancellationToken,
    judge: impl Fn(&serde_json::Value) -> ObjectVerdict,
) -> WatchEnd {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    let sleep = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline));
    tokio::pin!(sleep);
    let mut seen_in_relist = false;
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return WatchEnd::Stopped,
            _ = &mut sleep => return WatchEnd::DeadlineReached,
            e = events.next() => e,
        };
        let object = match event {
            None => return WatchEnd::Stopped,
            Some(Err(error)) => {
                // The backoff resumes the watch; a watch error is never a verdict.
                tracing::debug!(%error, object = name, "watch error; resuming");
                continue;
            }
            Some(Ok(Event::Init)) => {
                seen_in_relist = false;
                continue;
            }
            Some(Ok(Event::InitDone)) => {
                if !seen_in_relist {
                    return WatchEnd::Deleted;
                }
                continue;
            }
            Some(Ok(Event::Delete(_))) => return WatchEnd::Deleted,
            Some(Ok(Event::InitApply(o))) => {
                seen_in_relist = true;
                o
            }
            Some(Ok(Event::Apply(o))) => o,
        };
        if object.metadata.deletion_timestamp.is_some() {
            // Being deleted: no verdict will come; wait for the Delete event.
            continue;
        }
        let json = serde_json::to_value(&object).unwrap_or_default();
        match judge(&json) {
            ObjectVerdict::Pending => {}
            terminal => return WatchEnd::Verdict(terminal),
        }
    }
}
