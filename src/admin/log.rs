//! `pullman log …`: finished work orders, newest first, paged with `--limit` / `--all`.

use std::collections::HashMap;

use chrono::Utc;
use uuid::Uuid;

use super::agents::{agent_names, resolve_agent};
use super::args::{Connection, LogCommand, Output};
use super::history::print_attempts;
use super::lookup::{Scope, resolve_order};
use super::render::{
    CUT_NOTE, message_parts, one_line, opt, print_document, print_fields, print_list, relative,
    relative_and_exact, when,
};
use super::{collect_pages, query};
use crate::wire::LogEntry;

/// Prints a result message in full; a message the server cut at its limit is marked as cut.
pub fn print_message(message: &str) {
    let (text, cut) = message_parts(message);
    crate::outln!("{text}");
    if cut {
        crate::outln!("{CUT_NOTE}");
    }
}

/// Columns of `log list -o wide` (`log_rows` adds the last three).
const LOG_WIDE_HEADERS: &[&str] = &[
    "ID",
    "TYPE",
    "OUTCOME",
    "RETRIES",
    "RECLAIMS",
    "AGENT",
    "COMPLETED",
    "MESSAGE",
    "TENANT",
    "CREATED",
    "CLAIM ID",
];
/// Columns of `log list`: the first eight of the wide table.
const LOG_HEADERS: &[&str] = LOG_WIDE_HEADERS.split_at(8).0;

fn log_rows(entries: &[LogEntry], names: &HashMap<Uuid, String>, wide: bool) -> Vec<Vec<String>> {
    let now = Utc::now();
    entries
        .iter()
        .map(|e| {
            let mut row = vec![
                e.id.to_string(),
                e.work_type.to_string(),
                e.outcome.as_str().to_string(),
                format!("{}/{}", e.retry_count, e.max_retries),
                format!("{}/{}", e.reclaim_count, e.max_reclaims),
                e.claimed_by
                    .map(|a| names.get(&a).cloned().unwrap_or_else(|| a.to_string()))
                    .unwrap_or_else(|| "-".into()),
                if wide {
                    when(e.completed_at)
                } else {
                    relative(e.completed_at, now)
                },
                e.message
                    .as_deref()
                    .map(|m| one_line(m, 60))
                    .unwrap_or_default(),
            ];
            if wide {
                row.extend([opt(&e.tenant), when(e.created_at), opt(&e.claim_id)]);
            }
            row
        })
        .collect()
}

fn print_entries(
    output: Output,
    entries: &[LogEntry],
    names: &HashMap<Uuid, String>,
) -> anyhow::Result<()> {
    if print_document(output, &entries)? {
        return Ok(());
    }
    print_list(
        output,
        entries,
        |e| e.id.to_string(),
        (LOG_HEADERS, LOG_WIDE_HEADERS),
        |wide| log_rows(entries, names, wide),
        2,
    );
    Ok(())
}

fn describe(e: &LogEntry, names: &HashMap<Uuid, String>, wide: bool) {
    let now = Utc::now();
    let agent = e
        .claimed_by
        .map(|a| format!("{} ({a})", names.get(&a).map(String::as_str).unwrap_or("?")))
        .unwrap_or_else(|| "-".into());
    let mut fields = vec![
        ("ID", e.id.to_string()),
        ("Type", e.work_type.to_string()),
        ("Outcome", e.outcome.as_str().to_string()),
        ("Tenant", opt(&e.tenant)),
        ("Retries", format!("{} of {}", e.retry_count, e.max_retries)),
        (
            "Reclaims",
            format!("{} of {}", e.reclaim_count, e.max_reclaims),
        ),
        ("On disruption", e.retry_on_disruption.as_str().to_string()),
        ("Last agent", agent),
    ];
    if let Some(original) = e.rerun_of {
        fields.push(("Rerun of", original.to_string()));
    }
    fields.push(("Created", relative_and_exact(e.created_at, now)));
    fields.push(("Completed", relative_and_exact(e.completed_at, now)));
    print_fields(&fields);
    print_attempts(e.attempts.as_deref(), names, wide);
    if let Some(m) = &e.message {
        crate::outln!("\nMessage:");
        print_message(m);
    }
}

/// `pullman log …`.
pub async fn log(conn: &Connection, cmd: LogCommand) -> anyhow::Result<()> {
    let client = conn.client()?;
    let output = conn.output;
    let tables = matches!(output, Output::Table | Output::Wide);
    match cmd {
        LogCommand::List {
            work_type,
            success,
            outcome,
            label,
            since,
            agent,
            paging,
        } => {
            let agent_id = match agent {
                Some(a) => Some(resolve_agent(&client, &a).await?.to_string()),
                None => None,
            };
            let (entries, more) =
                collect_pages(paging.limit, paging.all, paging.chunk(), |size, cursor| {
                    let q = query(&[
                        ("work_type", work_type.clone()),
                        ("success", success.map(|s| s.to_string())),
                        ("outcome", outcome.clone()),
                        ("label", label.clone()),
                        ("since", since.map(|t| t.to_rfc3339())),
                        ("agent_id", agent_id.clone()),
                        ("limit", Some(size.to_string())),
                        ("cursor", cursor),
                    ]);
                    let client = &client;
                    async move { client.list_log(&q).await }
                })
                .await?;
            let names = if tables {
                agent_names(&client).await?
            } else {
                HashMap::new()
            };
            print_entries(output, &entries, &names)?;
            if tables && more {
                eprintln!("(more entries: raise --limit or pass --all)");
            }
        }
        LogCommand::Get { id } => {
            let id = resolve_order(&client, &id, Scope::Finished).await?;
            let entry = client.get_log_entry(id).await?;
            if !print_document(output, &entry)? {
                match output {
                    Output::Name => crate::outln!("{}", entry.id),
                    _ => describe(&entry, &agent_names(&client).await?, output == Output::Wide),
                }
            }
        }
    }
    Ok(())
}
