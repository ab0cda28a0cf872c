//! The list of active orders as `work-orders list`, `wait` and the `--watch` views show it:
//! fetching a filtered page, and one table row per order (what a user asks next: when the retry
//! comes, when the lease or claim runs out, how often it was reclaimed).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::agents::resolve_agent;
use super::args::{OrderListFilter, Output};
use super::render::{one_line, opt, print_document, print_list, relative};
use super::{collect_pages, query};
use crate::client::Client;
use crate::wire::{OrderStatus, WorkOrder};

/// Columns of `work-orders list` and of `--watch` lines: the first eight of the wide table.
pub const ORDER_HEADERS: &[&str] = ORDER_WIDE_HEADERS.split_at(8).0;
/// Columns of `work-orders list -o wide` (`order_rows` adds the last four).
const ORDER_WIDE_HEADERS: &[&str] = &[
    "ID",
    "TYPE",
    "STATUS",
    "RETRIES",
    "RECLAIMS",
    "AGENT",
    "NEXT",
    "CREATED",
    "TENANT",
    "TARGETING",
    "CLAIM ID",
    "LAST ERROR",
];
/// Column coloured by state.
pub const STATE_COLUMN: usize = 2;
/// Column of the next event (retry, lease end, claim timeout).
pub const NEXT_COLUMN: usize = 6;

/// What happens next to an order, and when: the retry of a RETRY_PENDING order, the end of a
/// claim's lease, or the claim timeout after which the reaper hands it out again.
pub fn next_event(o: &WorkOrder) -> Option<(&'static str, DateTime<Utc>)> {
    match o.status {
        OrderStatus::RetryPending => o.next_retry_after.map(|t| ("retry", t)),
        OrderStatus::Claimed => {
            let timeout = o
                .claimed_at
                .map(|c| c + chrono::Duration::seconds(i64::from(o.claim_timeout_seconds)));
            match (o.lease_expires_at, timeout) {
                (Some(lease), Some(t)) if lease < t => Some(("lease ends", lease)),
                (Some(lease), None) => Some(("lease ends", lease)),
                (_, Some(t)) => Some(("claim times out", t)),
                (None, None) => None,
            }
        }
        _ => None,
    }
}

fn agent_label(id: &Option<Uuid>, names: &HashMap<Uuid, String>) -> String {
    match id {
        Some(id) => names.get(id).cloned().unwrap_or_else(|| id.to_string()),
        None => "-".into(),
    }
}

/// One table row per order; `names` maps agent ids to names.
pub fn order_rows(
    orders: &[WorkOrder],
    names: &HashMap<Uuid, String>,
    wide: bool,
) -> Vec<Vec<String>> {
    let now = Utc::now();
    orders
        .iter()
        .map(|o| {
            let next = next_event(o)
                .map(|(what, t)| format!("{what} {}", relative(t, now)))
                .unwrap_or_else(|| "-".into());
            let mut row = vec![
                o.id.to_string(),
                o.work_type.to_string(),
                o.status.as_str().to_string(),
                format!("{}/{}", o.retry_count, o.max_retries),
                format!("{}/{}", o.reclaim_count, o.max_reclaims),
                agent_label(&o.claimed_by, names),
                next,
                relative(o.created_at, now),
            ];
            if wide {
                row.extend([
                    opt(&o.tenant),
                    targeting_text(o),
                    opt(&o.claim_id),
                    o.last_error
                        .as_deref()
                        .map(|e| one_line(e, 60))
                        .unwrap_or_else(|| "-".into()),
                ]);
            }
            row
        })
        .collect()
}

pub fn targeting_text(o: &WorkOrder) -> String {
    let t = serde_json::to_value(&o.targeting).unwrap_or_default();
    let mut parts = Vec::new();
    for (key, label) in [
        ("labels", "label"),
        ("agent_names", "name"),
        ("agent_ids", "id"),
    ] {
        for v in t[key].as_array().into_iter().flatten() {
            parts.push(format!("{label}={}", v.as_str().unwrap_or_default()));
        }
    }
    for (k, v) in t["annotations"].as_object().into_iter().flatten() {
        parts.push(format!("{k}={}", v.as_str().unwrap_or_default()));
    }
    if parts.is_empty() {
        "any agent".into()
    } else {
        parts.join(",")
    }
}

/// Prints orders in `output` (documents, names or a table).
pub fn print_orders(
    output: Output,
    orders: &[WorkOrder],
    names: &HashMap<Uuid, String>,
) -> anyhow::Result<()> {
    if print_document(output, &orders)? {
        return Ok(());
    }
    print_list(
        output,
        orders,
        |o| o.id.to_string(),
        (ORDER_HEADERS, ORDER_WIDE_HEADERS),
        |wide| order_rows(orders, names, wide),
        STATE_COLUMN,
    );
    Ok(())
}

/// Fetches one page (or, with `all`, every page) of active orders matching `filter`.
pub async fn list_orders(
    client: &Client,
    filter: &OrderListFilter,
    limit: usize,
    all: bool,
    chunk: usize,
) -> anyhow::Result<(Vec<WorkOrder>, bool)> {
    let agent_id = match &filter.agent {
        Some(a) => Some(resolve_agent(client, a).await?.to_string()),
        None => None,
    };
    collect_pages(limit, all, chunk, |size, cursor| {
        let q = query(&[
            ("status", filter.status.clone()),
            ("work_type", filter.work_type.clone()),
            ("label", filter.label.clone()),
            ("agent_id", agent_id.clone()),
            ("since", filter.since.map(|t| t.to_rfc3339())),
            ("limit", Some(size.to_string())),
            ("cursor", cursor),
        ]);
        async move { client.list_work_orders(&q).await }
    })
    .await
}
