//! `pullman work-orders …`: create (optionally waiting), list, get (optionally watching), wait,
//! cancel, rerun. The list's rows are `admin::order_list`'s.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::process::ExitCode;

use anyhow::{Context, bail};
use chrono::Utc;
use serde_json::json;
use uuid::Uuid;

use super::agents::agent_names;
use super::args::{Connection, CreateWorkOrder, LogsArgs, Output, WorkOrdersCommand};
use super::explain::waiting_sentence;
use super::history::print_attempts;
use super::lookup::{Scope, resolve_order};
use super::order_list::{list_orders, next_event, print_orders, targeting_text};
use super::render::{
    one_line, opt, print_document, print_fields, relative, relative_and_exact, when,
};
use super::wait;
use crate::client::Client;
use crate::wire::WorkOrder;

/// The `get` view of one active order (as `kubectl describe`): fields, attempts, YAML last.
fn describe(o: &WorkOrder, names: &HashMap<Uuid, String>, wide: bool) {
    let now = Utc::now();
    let mut fields = vec![
        ("ID", o.id.to_string()),
        ("Type", o.work_type.to_string()),
        ("Status", o.status.as_str().to_string()),
        ("Tenant", opt(&o.tenant)),
        ("Priority", o.priority.to_string()),
        (
            "Concurrency",
            o.concurrency.as_ref().map_or("-".to_string(), |c| {
                format!("{} (max {}, {})", c.key, c.max, c.on_conflict.as_str())
            }),
        ),
        ("Targeting", targeting_text(o)),
        (
            "Retries",
            format!(
                "{} of {} (backoff {} s, doubling)",
                o.retry_count, o.max_retries, o.backoff_seconds
            ),
        ),
        (
            "Reclaims",
            format!(
                "{} of {} (claim timeout {} s)",
                o.reclaim_count, o.max_reclaims, o.claim_timeout_seconds
            ),
        ),
        ("On disruption", o.retry_on_disruption.as_str().to_string()),
    ];
    if let Some(t) = o.next_retry_after {
        fields.push(("Next retry", relative_and_exact(t, now)));
    }
    if let Some(w) = &o.waiting {
        fields.push(("Waiting", waiting_sentence(w)));
    }
    if let Some(agent) = o.claimed_by {
        let name = names.get(&agent).map(String::as_str).unwrap_or("?");
        let since = o
            .claimed_at
            .map(|t| format!(" since {}", relative_and_exact(t, now)))
            .unwrap_or_default();
        fields.push(("Claimed by", format!("{name} ({agent}){since}")));
        fields.push(("Claim ID", opt(&o.claim_id)));
    }
    if let Some(t) = o.lease_expires_at {
        let secs = o
            .lease_seconds
            .map(|s| format!(", {s} s each"))
            .unwrap_or_default();
        fields.push((
            "Lease expires",
            format!("{}{secs}", relative_and_exact(t, now)),
        ));
    }
    if let Some((what, t)) = next_event(o).filter(|(w, _)| *w == "claim times out") {
        fields.push((
            "Claim times out",
            format!("{} ({what})", relative_and_exact(t, now)),
        ));
    }
    if let Some(e) = &o.last_error {
        let at = o
            .last_error_at
            .map(|t| format!(" ({}, {})", relative(t, now), when(t)))
            .unwrap_or_default();
        fields.push(("Last error", format!("{}{at}", one_line(e, 200))));
    }
    if let Some(original) = o.rerun_of {
        fields.push(("Rerun of", original.to_string()));
    }
    fields.push(("Created", relative_and_exact(o.created_at, now)));
    fields.push(("Updated", relative_and_exact(o.updated_at, now)));
    print_fields(&fields);
    print_attempts(o.attempts.as_deref(), names, wide);
    if let Some(yaml) = &o.yaml_content {
        crate::outln!("\nYAML:\n{yaml}");
    }
}

/// Fetches an active order; a finished one is an error pointing at `pullman log get`.
pub async fn get_active(client: &Client, id: Uuid) -> anyhow::Result<WorkOrder> {
    match client.get_work_order(id).await {
        Err(e) if e.code() == Some("finished") => {
            bail!("work order {id} already finished; see `pullman log get {id}`")
        }
        other => Ok(other?),
    }
}

async fn create(client: &Client, c: CreateWorkOrder) -> anyhow::Result<WorkOrder> {
    let yaml = if c.file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        s
    } else {
        std::fs::read_to_string(&c.file).with_context(|| format!("reading {}", c.file.display()))?
    };
    let annotations: BTreeMap<String, String> = c.annotations.into_iter().collect();
    let mut body = json!({
        "work_type": c.work_type,
        "yaml_content": yaml,
        "targeting": {
            "labels": c.labels, "agent_names": c.agent_names,
            "agent_ids": c.agent_ids, "annotations": annotations,
        },
    });
    for (k, v) in [
        ("max_retries", c.max_retries),
        ("backoff_seconds", c.backoff_seconds),
        ("claim_timeout_seconds", c.claim_timeout_seconds),
        ("max_reclaims", c.max_reclaims),
        ("priority", c.priority),
    ] {
        if let Some(v) = v {
            body[k] = json!(v);
        }
    }
    if let Some(t) = c.tenant {
        body["tenant"] = json!(t);
    }
    if let Some(policy) = c.retry_on_disruption {
        body["retry_on_disruption"] = json!(policy);
    }
    if let Some(key) = c.concurrency_key {
        body["concurrency"] = json!({"key": key});
        if let Some(max) = c.max_concurrent {
            body["concurrency"]["max"] = json!(max);
        }
        if let Some(on_conflict) = c.on_conflict {
            body["concurrency"]["on_conflict"] = json!(on_conflict);
        }
    }
    client
        .create_work_order(&body)
        .await
        .map_err(|e| super::in_flag_words(e, CREATE_FLAGS))
}

/// The create body's fields and the flags of `work-orders create` that set them.
const CREATE_FLAGS: &[(&str, &str)] = &[
    ("yaml_content", "-f FILE"),
    ("work_type", "--work-type"),
    ("targeting.agent_ids", "--agent-id"),
    ("targeting.agent_names", "--agent-name"),
    ("targeting.labels", "--label"),
    ("targeting.annotations", "--annotation"),
    ("agent_ids", "--agent-id"),
    ("agent_names", "--agent-name"),
    ("labels", "--label"),
    ("annotations", "--annotation"),
    ("max_retries", "--max-retries"),
    ("backoff_seconds", "--backoff-seconds"),
    ("claim_timeout_seconds", "--claim-timeout-seconds"),
    ("max_reclaims", "--max-reclaims"),
    ("priority", "--priority"),
    ("concurrency.key", "--concurrency-key"),
    ("concurrency.max", "--max-concurrent"),
    ("tenant", "--tenant"),
    ("retry_on_disruption", "--retry-on-disruption"),
];

/// `pullman work-orders …`; the exit code is the order's outcome for `wait` and `create --wait`
/// (see [`super::args::WAIT_EXIT_CODES`]), success otherwise.
pub async fn work_orders(conn: &Connection, cmd: WorkOrdersCommand) -> anyhow::Result<ExitCode> {
    let client = conn.client()?;
    let output = conn.output;
    match cmd {
        WorkOrdersCommand::Create(c) => {
            let (then_wait, wait_args, then_logs) = (c.wait, c.wait_args.clone(), c.logs);
            // Checked before anything is created: a timeout that nothing waits on is a mistake.
            if !then_wait && !wait_args.timeout.is_zero() {
                bail!("--timeout applies to --wait: add --wait, or leave --timeout out");
            }
            let mut order = create(&client, *c).await?;
            if then_wait {
                // `-o name` prints the id at once: `ID=$(… -o name --wait)` has it even when
                // the wait times out or is interrupted, exactly when a script needs it.
                let id_printed = output == Output::Name;
                if id_printed {
                    crate::outln!("{}", order.id);
                }
                eprintln!("work order {} created; waiting for it to finish", order.id);
                if then_logs {
                    let follow = LogsArgs {
                        follow: true,
                        ..Default::default()
                    };
                    // `-o` was the created order's format (`name`: its id, printed above);
                    // the lines follow as text.
                    let logs = super::logs::logs(&client, order.id, &follow, Output::Table);
                    if wait_args.timeout.is_zero() {
                        return logs.await;
                    }
                    return match tokio::time::timeout(wait_args.timeout, logs).await {
                        Ok(code) => code,
                        Err(_) => {
                            let why = super::wait_note::why_now(&client, order.id)
                                .await
                                .map(|w| format!(": {w}"))
                                .unwrap_or_default();
                            eprintln!(
                                "timed out after {} s: work order {} has not finished{why}",
                                wait_args.timeout.as_secs(),
                                order.id
                            );
                            Ok(ExitCode::from(wait::EXIT_TIMEOUT))
                        }
                    };
                }
                return wait::wait_for(&client, order.id, &wait_args, output, id_printed).await;
            }
            if output == Output::Table || output == Output::Wide {
                order.yaml_content = None;
            }
            if !print_document(output, &order)? {
                print_orders(output, std::slice::from_ref(&order), &HashMap::new())?;
            }
        }
        WorkOrdersCommand::List {
            filter,
            paging,
            watch,
        } => {
            if watch {
                wait::watch_list(&client, &filter, output).await?;
                return Ok(ExitCode::SUCCESS);
            }
            let (orders, more) =
                list_orders(&client, &filter, paging.limit, paging.all, paging.chunk()).await?;
            let names = if matches!(output, Output::Table | Output::Wide) {
                agent_names(&client).await?
            } else {
                HashMap::new()
            };
            print_orders(output, &orders, &names)?;
            if matches!(output, Output::Table | Output::Wide) {
                if orders.is_empty() {
                    crate::outln!(
                        "(no active work orders; finished ones are in `pullman log list`)"
                    );
                }
                if more {
                    eprintln!("(more orders: raise --limit or pass --all)");
                }
            }
        }
        WorkOrdersCommand::Get { id, watch } => {
            let id = resolve_order(&client, &id, Scope::Either).await?;
            if watch {
                return wait::watch_order(&client, id, output).await;
            }
            let order = get_active(&client, id).await?;
            if !print_document(output, &order)? {
                match output {
                    Output::Name => crate::outln!("{}", order.id),
                    _ => describe(&order, &agent_names(&client).await?, output == Output::Wide),
                }
            }
        }
        WorkOrdersCommand::Explain { id } => {
            let id = resolve_order(&client, &id, Scope::Either).await?;
            super::explain::explain(&client, id, output).await?;
        }
        WorkOrdersCommand::Wait { id, wait } => {
            let id = resolve_order(&client, &id, Scope::Either).await?;
            return wait::wait_for(&client, id, &wait, output, false).await;
        }
        WorkOrdersCommand::Logs { id, logs } => {
            let id = resolve_order(&client, &id, Scope::Either).await?;
            return super::logs::logs(&client, id, &logs, output).await;
        }
        WorkOrdersCommand::Cancel { id } => {
            let id = resolve_order(&client, &id, Scope::Active).await?;
            let entry = client.cancel_work_order(id).await?;
            if !print_document(output, &entry)? {
                match output {
                    Output::Name => crate::outln!("{id}"),
                    _ => crate::outln!("work order {id} cancelled"),
                }
            }
        }
        WorkOrdersCommand::Rerun { id } => {
            let id = resolve_order(&client, &id, Scope::Finished).await?;
            let mut order = client.rerun_work_order(id).await?;
            if !print_document(output, &order)? {
                match output {
                    Output::Name => crate::outln!("{}", order.id),
                    _ => {
                        order.yaml_content = None;
                        crate::outln!("work order {} queued as a rerun of {id}", order.id);
                    }
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
