//! Waiting and watching (issue #15): `work-orders wait` / `create --wait` block until an order
//! finishes and exit with its outcome; `get -w` / `list -w` poll and print what changed. The API
//! has no push channel for admins, so these poll: every second while waiting, every 2 s while
//! watching, and keep going through transient errors (a server restart) with a note on stderr.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::agents::agent_names;
use super::args::{OrderListFilter, Output, WaitArgs};
use super::explain::waiting_sentence;
use super::log::print_message;
use super::order_list::{NEXT_COLUMN, ORDER_HEADERS, STATE_COLUMN, list_orders, order_rows};
use super::render::{print_rows, print_table};
use super::wait_note::WaitNotes;
use crate::client::{Client, ClientError};
use crate::wire::{LogEntry, Outcome, WorkOrder};

/// Exit status: the order failed (retries exhausted, not retryable, or reclaims exhausted).
pub const EXIT_FAILED: u8 = 3;
/// Exit status: the order was cancelled.
pub const EXIT_CANCELLED: u8 = 4;
/// Exit status: `--timeout` passed before the order finished.
pub const EXIT_TIMEOUT: u8 = 5;

const WAIT_POLL: Duration = Duration::from_secs(1);
const WATCH_POLL: Duration = Duration::from_secs(2);

/// The exit status for an outcome (0, [`EXIT_FAILED`], [`EXIT_CANCELLED`]).
pub fn exit_code_of(outcome: Outcome) -> u8 {
    match outcome {
        Outcome::Succeeded => 0,
        Outcome::Failed => EXIT_FAILED,
        Outcome::Cancelled => EXIT_CANCELLED,
    }
}

/// The one line on stderr that says how an order ended, for `wait` and `logs --follow` alike.
pub fn eprint_finished(entry: &LogEntry) {
    eprintln!(
        "work order {} {} (retries {}, reclaims {})",
        entry.id,
        entry.outcome.as_str(),
        entry.retry_count,
        entry.reclaim_count
    );
}

/// Where an order is now.
enum State {
    Active(Box<WorkOrder>),
    Finished(Box<LogEntry>),
}

/// One look at order `id`: active, in the log, or an error (unknown id, or a transport error the
/// caller may wait out).
async fn look(client: &Client, id: Uuid) -> Result<State, ClientError> {
    match client.get_work_order(id).await {
        Ok(order) => Ok(State::Active(Box::new(order))),
        // `finished` says it is in the log; a plain 404 may be a move racing this call.
        Err(ClientError::Api { status, .. }) if status == reqwest::StatusCode::NOT_FOUND => client
            .get_log_entry(id)
            .await
            .map(|e| State::Finished(Box::new(e))),
        Err(e) => Err(e),
    }
}

/// Looks until it gets an answer; transient failures are reported once each and waited out,
/// until `give_up_at` (then the last error is returned: the command failed, exit 1).
async fn look_patiently(
    client: &Client,
    id: Uuid,
    give_up_at: Option<Instant>,
) -> anyhow::Result<State> {
    let mut reported = false;
    loop {
        match look(client, id).await {
            Ok(state) => {
                if reported {
                    eprintln!("server reachable again");
                }
                return Ok(state);
            }
            Err(e) if e.is_transient() && give_up_at.is_none_or(|at| Instant::now() < at) => {
                if !reported {
                    eprintln!("{e}; still waiting");
                    reported = true;
                }
                tokio::time::sleep(WAIT_POLL).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Blocks until order `id` finishes or `args.timeout` passes; prints the log entry (its message,
/// or the document with `-o json|yaml`; with `-o name` its id unless `id_printed`) and returns
/// the outcome's exit status. A server that cannot be reached at the first look is an error
/// (exit 1, as `--help` says); later it is waited out (a restart), up to `--timeout`.
pub async fn wait_for(
    client: &Client,
    id: Uuid,
    args: &WaitArgs,
    output: Output,
    id_printed: bool,
) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let give_up_at = (!args.timeout.is_zero()).then(|| started + args.timeout);
    let mut first = true;
    let mut notes = WaitNotes::default();
    loop {
        let state = if first {
            look(client, id).await.map_err(anyhow::Error::from)
        } else {
            look_patiently(client, id, give_up_at).await
        };
        first = false;
        let order = match state? {
            State::Finished(entry) => {
                if !(id_printed && output == Output::Name) {
                    print_finished(&entry, output)?;
                }
                return Ok(ExitCode::from(exit_code_of(entry.outcome)));
            }
            State::Active(order) => order,
        };
        if give_up_at.is_some_and(|at| Instant::now() >= at) {
            let why = order
                .waiting
                .as_ref()
                .map(|e| format!(": {}", waiting_sentence(e)))
                .unwrap_or_default();
            eprintln!(
                "timed out after {} s: work order {id} is still {}{why}",
                args.timeout.as_secs(),
                order.status.as_str()
            );
            return Ok(ExitCode::from(EXIT_TIMEOUT));
        }
        notes.saw(order.waiting.as_ref());
        tokio::time::sleep(WAIT_POLL).await;
    }
}

/// A finished order as `wait` prints it: summary on stderr, message on stdout (so
/// `msg=$(pullman work-orders wait ID)` captures the message alone).
fn print_finished(entry: &LogEntry, output: Output) -> anyhow::Result<()> {
    if super::render::print_document(output, entry)? {
        return Ok(());
    }
    if output == Output::Name {
        crate::outln!("{}", entry.id);
        return Ok(());
    }
    eprint_finished(entry);
    if let Some(m) = &entry.message {
        print_message(m);
    }
    Ok(())
}

/// What a watcher compares: the fields whose change is worth a line (relative times in the row
/// change every second and are not).
fn change_key(o: &WorkOrder) -> String {
    format!(
        "{}|{}|{}|{:?}|{:?}|{:?}|{:?}",
        o.status.as_str(),
        o.retry_count,
        o.reclaim_count,
        o.claim_id,
        o.lease_expires_at,
        o.next_retry_after,
        o.last_error_at
    )
}

fn print_change(
    output: Output,
    order: &WorkOrder,
    names: &HashMap<Uuid, String>,
    first: bool,
) -> anyhow::Result<()> {
    match output {
        Output::Json => crate::outln!("{}", serde_json::to_string(order)?),
        Output::Yaml => crate::out!(
            "---\n{}",
            serde_norway::to_string(&serde_json::to_value(order)?)?
        ),
        Output::Name => crate::outln!("{}", order.id),
        Output::Table | Output::Wide => {
            let rows = order_rows(std::slice::from_ref(order), names, false);
            if first {
                print_table(ORDER_HEADERS, &rows, Some(STATE_COLUMN));
            } else {
                print_rows(ORDER_HEADERS, &rows, Some(STATE_COLUMN));
            }
        }
    }
    Ok(())
}

/// A line for an order that left the active list: its outcome in the STATUS column.
fn print_gone(
    output: Output,
    last: &WorkOrder,
    entry: Option<&LogEntry>,
    names: &HashMap<Uuid, String>,
) -> anyhow::Result<()> {
    match output {
        Output::Json => {
            if let Some(e) = entry {
                crate::outln!("{}", serde_json::to_string(e)?)
            }
        }
        Output::Yaml => {
            if let Some(e) = entry {
                crate::out!(
                    "---\n{}",
                    serde_norway::to_string(&serde_json::to_value(e)?)?
                )
            }
        }
        Output::Name => {}
        Output::Table | Output::Wide => {
            let mut row = order_rows(std::slice::from_ref(last), names, false).remove(0);
            // In the STATUS column's spelling (PENDING, …), not the log's (succeeded).
            row[STATE_COLUMN] = entry
                .map(|e| e.outcome.as_str().to_ascii_uppercase())
                .unwrap_or_else(|| "GONE".into());
            row[NEXT_COLUMN] = "-".into();
            print_rows(ORDER_HEADERS, &[row], Some(STATE_COLUMN));
        }
    }
    Ok(())
}

/// `work-orders get ID -w`: a line per change until the order finishes.
pub async fn watch_order(client: &Client, id: Uuid, output: Output) -> anyhow::Result<ExitCode> {
    let names = agent_names(client).await?;
    let mut last: Option<WorkOrder> = None;
    loop {
        match look_patiently(client, id, None).await? {
            State::Active(order) => {
                if last.as_ref().map(change_key) != Some(change_key(&order)) {
                    print_change(output, &order, &names, last.is_none())?;
                    last = Some(*order);
                }
            }
            State::Finished(entry) => {
                match &last {
                    Some(prev) => print_gone(output, prev, Some(&entry), &names)?,
                    None => print_finished(&entry, output)?,
                }
                return Ok(ExitCode::SUCCESS);
            }
        }
        tokio::time::sleep(WATCH_POLL).await;
    }
}

/// `work-orders list -w`: the list, then a line per order that appears, changes or finishes,
/// until interrupted.
pub async fn watch_list(
    client: &Client,
    filter: &OrderListFilter,
    output: Output,
) -> anyhow::Result<()> {
    let mut names = agent_names(client).await?;
    let mut known: HashMap<Uuid, WorkOrder> = HashMap::new();
    let mut first = true;
    loop {
        let orders = match list_orders(client, filter, usize::MAX, true, super::MAX_PAGE).await {
            Ok((orders, _)) => orders,
            Err(e) => {
                eprintln!("{e:#}; retrying");
                tokio::time::sleep(WATCH_POLL).await;
                continue;
            }
        };
        if first && matches!(output, Output::Table | Output::Wide) {
            print_table(ORDER_HEADERS, &[], None);
        }
        first = false;
        let mut seen = HashMap::new();
        for order in orders {
            let changed = known.get(&order.id).map(change_key) != Some(change_key(&order));
            if changed {
                if order.claimed_by.is_some_and(|a| !names.contains_key(&a)) {
                    names = agent_names(client).await.unwrap_or(names);
                }
                print_change(output, &order, &names, false)?;
            }
            seen.insert(order.id, order);
        }
        for (id, last) in known.drain() {
            if !seen.contains_key(&id) {
                let entry = client.get_log_entry(id).await.ok();
                print_gone(output, &last, entry.as_ref(), &names)?;
            }
        }
        known = seen;
        tokio::time::sleep(WATCH_POLL).await;
    }
}
