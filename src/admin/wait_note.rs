//! Why an order still waits, said where people wait on it (`work-orders wait`, `logs -f`,
//! `create --wait [--logs]`), as GitHub's "Waiting for a runner" and Buildkite's "no agents
//! matching" are: on stderr once the order has waited [`FIRST_NOTE_AFTER`], again each time the
//! reason changes, and in the message of a timeout (docs/design.md §10).

use std::time::{Duration, Instant};

use uuid::Uuid;

use super::explain::waiting_sentence;
use crate::client::Client;
use crate::wire::{Explanation, WaitReason};

/// How long an order waits before the reason is said: most orders are claimed sooner, and a
/// note for each of them would be noise.
pub const FIRST_NOTE_AFTER: Duration = Duration::from_secs(3);
/// How often `logs -f` asks why the order waits (it has no other look at the order meanwhile).
const LOOK_EVERY: Duration = Duration::from_secs(2);
/// How often it asks once an agent holds the order: only a retry or a reclaim makes it wait
/// again (said at most this late), and a long build followed by many people should not cost a
/// request each every 2 s.
const LOOK_WHILE_HELD: Duration = Duration::from_secs(10);

/// What was said so far about one order's wait.
pub struct WaitNotes {
    started: Instant,
    said: Option<WaitReason>,
}

impl Default for WaitNotes {
    fn default() -> Self {
        WaitNotes {
            started: Instant::now(),
            said: None,
        }
    }
}

impl WaitNotes {
    /// Takes one look's answer: `Some` while the order waits, `None` while an agent holds it.
    /// Says the reason on stderr when it is due and new; a claim resets what was said, so a
    /// retry that waits again is news again.
    pub fn saw(&mut self, waiting: Option<&Explanation>) {
        match waiting {
            None => self.said = None,
            Some(e)
                if self.started.elapsed() >= FIRST_NOTE_AFTER && self.said != Some(e.reason) =>
            {
                eprintln!("{}", waiting_sentence(e));
                self.said = Some(e.reason);
            }
            Some(_) => {}
        }
    }
}

/// Looks at order `id` every [`LOOK_EVERY`] and says why it waits, as [`WaitNotes`] does; for
/// commands that follow something else (the output stream). Never returns: race it against
/// what it accompanies. An order that no longer waits, or an error, says nothing.
pub async fn note_while_waiting(client: &Client, id: Uuid) {
    let mut notes = WaitNotes::default();
    tokio::time::sleep(FIRST_NOTE_AFTER).await;
    loop {
        let next = match client.explain_work_order(id).await {
            Ok(e) => {
                notes.saw(Some(&e));
                LOOK_EVERY
            }
            Err(e) if e.code() == Some("not_waiting") => {
                notes.saw(None);
                LOOK_WHILE_HELD
            }
            Err(_) => LOOK_EVERY,
        };
        tokio::time::sleep(next).await;
    }
}

/// Why order `id` waits now, as a sentence, for a timeout's message; `None` when it does not
/// wait (claimed, finished) or the server cannot say.
pub async fn why_now(client: &Client, id: Uuid) -> Option<String> {
    client
        .explain_work_order(id)
        .await
        .ok()
        .map(|e| waiting_sentence(&e))
}
