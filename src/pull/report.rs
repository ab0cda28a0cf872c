//! An agent's reports sent together (issue #34): the verdicts of orders that finish at about the
//! same time go to the server in one batch complete (`POST /agents/{id}/complete`) instead of one
//! request each. Each order still waits for its own answer and retries it as before
//! (`order::report`); this only carries its complete.
//!
//! How batches form, as the server's group commit forms its own: [`RUNNERS`] tasks take reports
//! from one queue. A runner takes the first waiting, yields once to the scheduler (so that orders
//! finishing in the same moment are in too), takes every other waiting (up to
//! [`MAX_COMPLETES`], and [`BATCH_MESSAGE_BYTES`] of messages), sends them and comes back.
//! Nothing waits to fill a batch: a lone report goes at once, as a single complete, the request
//! every server knows. A server without the batch route (`404`, one older than it) gets single
//! completes from then on; a batch refused as a whole (`400`, `413`, `422`) is sent again as
//! single completes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{Mutex, mpsc, oneshot};
use uuid::Uuid;

use crate::client::{Client, ClientError, Completed};
use crate::gather::take_waiting;
use crate::queue::limits::MAX_COMPLETES;
use crate::wire::{CompleteBody, CompleteItem, CompleteManyBody};

/// Requests in flight at once per agent: while one waits for its answer (the server's commit),
/// the next batch forms.
pub const RUNNERS: usize = 2;

/// Messages one batch carries at most, bytes (a batch stops growing past it): far below the
/// server's 4 MiB body limit, with every item's message up to the 64 KiB the server keeps.
pub const BATCH_MESSAGE_BYTES: usize = 256 * 1024;

/// What the server answered one report: what [`Client::complete`] returns, its error shared by
/// every report of a batch that failed as a whole.
pub type Answer = Result<Completed, Arc<ClientError>>;

/// One report waiting for its batch.
struct Waiting {
    order_id: Uuid,
    body: CompleteBody,
    reply: oneshot::Sender<Answer>,
}

/// The queue of an agent's reports and its runners; the runners stop once the last [`Reporter`]
/// is dropped.
pub struct Reporter {
    sender: mpsc::UnboundedSender<Waiting>,
}

impl Reporter {
    /// Starts [`RUNNERS`] runners sending the reports of `agent_id` with `client` (on the current
    /// tokio runtime).
    pub fn start(client: Client, agent_id: Uuid) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        let runner = Arc::new(Runner {
            client,
            agent_id,
            receiver: Mutex::new(receiver),
            singles_only: AtomicBool::new(false),
        });
        for _ in 0..RUNNERS {
            tokio::spawn(runner.clone().run());
        }
        Reporter { sender }
    }

    /// Sends `body` (the complete of `order_id`) with the next batch and returns its answer.
    pub async fn complete(&self, order_id: Uuid, body: CompleteBody) -> Answer {
        let (reply, answer) = oneshot::channel();
        let waiting = Waiting {
            order_id,
            body,
            reply,
        };
        // The runners live as long as any Reporter: only a runtime that is stopping drops a
        // report unanswered, and then whether it was delivered is unknown (a report sent again
        // is fenced, and a repeat is answered as a replay).
        let stopped = || {
            Err(Arc::new(ClientError::Protocol(
                "the agent's reporter stopped before the server answered".into(),
            )))
        };
        if self.sender.send(waiting).is_err() {
            return stopped();
        }
        answer.await.unwrap_or_else(|_| stopped())
    }
}

/// What the runners share.
struct Runner {
    client: Client,
    agent_id: Uuid,
    receiver: Mutex<mpsc::UnboundedReceiver<Waiting>>,
    /// The server answered the batch route `404`: it has none.
    singles_only: AtomicBool,
}

impl Runner {
    /// Takes what is waiting (`gather::take_waiting`), sends it, answers, and again, until the
    /// queue is closed.
    async fn run(self: Arc<Self>) {
        while let Some(batch) = take_waiting(
            &self.receiver,
            MAX_COMPLETES,
            message_bytes,
            BATCH_MESSAGE_BYTES,
        )
        .await
        {
            self.send(batch).await;
        }
    }

    /// Sends one batch and answers each of its reports.
    async fn send(&self, batch: Vec<Waiting>) {
        if batch.len() == 1 || self.singles_only.load(Ordering::Relaxed) {
            return self.singles(batch).await;
        }
        let body = CompleteManyBody {
            completes: batch.iter().map(item).collect(),
        };
        match self.client.complete_many(self.agent_id, &body).await {
            Ok(answers) => {
                for (waiting, answer) in batch.into_iter().zip(answers) {
                    let _ = waiting.reply.send(answer.map_err(Arc::new));
                }
            }
            Err(e) if e.code() == Some("not_found") => {
                if !self.singles_only.swap(true, Ordering::Relaxed) {
                    tracing::info!(
                        "the server has no batch complete route (it is older than this agent); \
                         reporting each order on its own"
                    );
                }
                self.singles(batch).await;
            }
            // The batch refused as a whole (say, past a smaller limit of another version): each
            // report alone still gets the answer meant for it.
            Err(e) if e.is_refused_body() || e.code() == Some("payload_too_large") => {
                tracing::warn!(error = %e, completes = batch.len(), "a batch complete was refused; reporting its orders one by one");
                self.singles(batch).await;
            }
            Err(e) => {
                let e = Arc::new(e);
                for waiting in batch {
                    let _ = waiting.reply.send(Err(e.clone()));
                }
            }
        }
    }

    /// Each report as a single complete, all at once.
    async fn singles(&self, batch: Vec<Waiting>) {
        futures::future::join_all(batch.into_iter().map(|waiting| async move {
            let answer = self
                .client
                .complete(waiting.order_id, &waiting.body)
                .await
                .map_err(Arc::new);
            let _ = waiting.reply.send(answer);
        }))
        .await;
    }
}

fn message_bytes(waiting: &Waiting) -> usize {
    waiting.body.message.as_ref().map_or(0, String::len)
}

/// A report as an item of a batch complete (the agent is the route's).
fn item(waiting: &Waiting) -> CompleteItem {
    let body = &waiting.body;
    CompleteItem {
        work_order_id: waiting.order_id,
        claim_id: body.claim_id,
        success: body.success,
        message: body.message.clone(),
        retryable: body.retryable,
        disrupted: body.disrupted,
    }
}
