//! `pullman work-orders explain`: why an order waits (docs/design.md §10), or, for an order that
//! no longer waits, what it does instead, as `kubectl describe` would say it: running on an
//! agent since a time, or finished with its outcome. Both exit 0; a script tells them apart by
//! `reason` (`-o json`): a wait reason, `running`, or `finished`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::agents::agent_names;
use super::args::Output;
use super::render::{print_document, span_text};
use crate::client::Client;
use crate::wire::{Explanation, Outcome};

/// What `explain` says of an order that does not wait.
#[derive(Debug, Serialize)]
struct NotWaiting {
    id: Uuid,
    /// `running` or `finished`.
    reason: &'static str,
    message: String,
    /// Running: the agent holding its claim (its name, or its id when unknown).
    #[serde(skip_serializing_if = "Option::is_none")]
    agent: Option<String>,
    /// Running: when it was claimed; finished: when it finished.
    since: Option<DateTime<Utc>>,
    /// Finished: how it ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    outcome: Option<Outcome>,
}

/// Prints why order `id` waits, or what it does instead.
pub async fn explain(client: &Client, id: Uuid, output: Output) -> anyhow::Result<()> {
    let not_waiting = match client.explain_work_order(id).await {
        Ok(e) => {
            if !print_document(output, &e)? {
                match output {
                    Output::Name => crate::outln!("{}", e.reason),
                    _ => crate::outln!("{}", waiting_sentence(&e)),
                }
            }
            return Ok(());
        }
        Err(e) if e.code() == Some("not_waiting") => running(client, id).await?,
        Err(e) if e.code() == Some("finished") => finished(client, id).await?,
        Err(e) => return Err(e.into()),
    };
    if !print_document(output, &not_waiting)? {
        match output {
            Output::Name => crate::outln!("{}", not_waiting.reason),
            _ => crate::outln!("{}", not_waiting.message),
        }
    }
    Ok(())
}

/// An explanation as a person reads it (docs/design.md §10): its message, how long the order has
/// waited, and its reason code for scripts that grep.
pub fn waiting_sentence(e: &Explanation) -> String {
    format!(
        "{} Waiting {} ({}).",
        e.message,
        span_text(e.waiting_seconds.unsigned_abs()),
        e.reason
    )
}

async fn running(client: &Client, id: Uuid) -> anyhow::Result<NotWaiting> {
    let order = match client.get_work_order(id).await {
        Ok(o) => o,
        // It finished between the two requests.
        Err(e) if e.code() == Some("finished") => return finished(client, id).await,
        Err(e) => return Err(e.into()),
    };
    let agent = match order.claimed_by {
        Some(agent) => Some(
            agent_names(client)
                .await?
                .remove(&agent)
                .unwrap_or_else(|| agent.to_string()),
        ),
        None => None,
    };
    let since = order.claimed_at;
    let message = match (&agent, since) {
        (Some(agent), Some(at)) => format!(
            "Work order {id} is running on agent {agent} since {} ({} ago); it does not wait \
             (running).",
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            span_text((Utc::now() - at).num_seconds().unsigned_abs())
        ),
        _ => format!(
            "Work order {id} is {}; it does not wait (running).",
            order.status.as_str()
        ),
    };
    Ok(NotWaiting {
        id,
        reason: "running",
        message,
        agent,
        since,
        outcome: None,
    })
}

async fn finished(client: &Client, id: Uuid) -> anyhow::Result<NotWaiting> {
    let entry = client.get_log_entry(id).await?;
    let outcome = entry.outcome;
    Ok(NotWaiting {
        id,
        reason: "finished",
        message: format!(
            "Work order {id} finished: {} at {}; `pullman log get {id}` shows how (finished).",
            outcome.as_str(),
            entry
                .completed_at
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ),
        agent: None,
        since: Some(entry.completed_at),
        outcome: Some(outcome),
    })
}
