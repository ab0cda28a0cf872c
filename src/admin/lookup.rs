//! Work orders by a unique id prefix, as git and docker take them (issue #15): `pullman
//! work-orders get 3f2a` finds the one order whose id starts with `3f2a`, active or in the log.
//! The server filters with `id_prefix` on both lists; an ambiguous prefix is an error listing the
//! candidates, an unknown one says so.

use anyhow::bail;
use uuid::Uuid;

use super::query;
use crate::client::Client;
use crate::wire::{LogEntry, WorkOrder};
use serde::de::DeserializeOwned;

/// Where an order is looked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Active orders only (`cancel`).
    Active,
    /// The log only (`log get`, `rerun`).
    Finished,
    /// Both (`get`, `wait`).
    Either,
}

/// Most candidates asked for per list: enough to show that a prefix is ambiguous.
const CANDIDATES: usize = 10;

/// A prefix as the API takes it: lowercase hex digits, dashes dropped. Errors name what is wrong.
pub fn normalize_prefix(given: &str) -> anyhow::Result<String> {
    let prefix = given.replace('-', "").to_ascii_lowercase();
    if prefix.is_empty() || prefix.len() > 32 || !prefix.chars().all(|c| c.is_ascii_hexdigit()) {
        bail!(
            "{given:?} is not a work order id or id prefix (hex digits, dashes allowed, at most 32 \
             digits)"
        );
    }
    Ok(prefix)
}

/// One order an id prefix matched: its id and where it is (`PENDING`, …, or `log: succeeded`).
#[derive(Debug, Clone)]
pub struct Candidate {
    pub id: Uuid,
    pub state: String,
}

/// Resolves `given` (a full id, or a unique prefix of one) to an order id in `scope`.
pub async fn resolve_order(client: &Client, given: &str, scope: Scope) -> anyhow::Result<Uuid> {
    if let Ok(id) = Uuid::parse_str(given) {
        return Ok(id);
    }
    let prefix = normalize_prefix(given)?;
    let candidates = candidates(client, &prefix, scope).await?;
    pick(given, scope, candidates)
}

fn pick(given: &str, scope: Scope, candidates: Vec<Candidate>) -> anyhow::Result<Uuid> {
    let what = match scope {
        Scope::Active => "active work order",
        Scope::Finished => "finished work order (in the log)",
        Scope::Either => "work order",
    };
    match candidates.as_slice() {
        [] => bail!("no {what} has an id starting with {given:?}"),
        [one] => Ok(one.id),
        many => bail!(
            "the id prefix {given:?} is ambiguous; it matches {}{} orders:\n{}\ngive more digits",
            if many.len() >= CANDIDATES {
                "at least "
            } else {
                ""
            },
            many.len(),
            many.iter()
                .map(|c| format!("  {}  {}", c.id, c.state))
                .collect::<Vec<_>>()
                .join("\n")
        ),
    }
}

async fn candidates(client: &Client, prefix: &str, scope: Scope) -> anyhow::Result<Vec<Candidate>> {
    let mut found = Vec::new();
    if scope != Scope::Finished {
        let orders = matching::<WorkOrder>(client, "/work-orders", prefix).await?;
        found.extend(orders.into_iter().map(|o| Candidate {
            id: o.id,
            state: o.status.as_str().to_string(),
        }));
    }
    if scope != Scope::Active {
        let entries = matching::<LogEntry>(client, "/work-order-log", prefix).await?;
        found.extend(entries.into_iter().map(|e| Candidate {
            id: e.id,
            state: format!("log: {}", e.outcome.as_str()),
        }));
    }
    // An order moving to the log between the two calls shows up in both.
    found.sort_by_key(|c| c.id);
    found.dedup_by_key(|c| c.id);
    // Only true matches count, should a server ignore `id_prefix`.
    found.retain(|c| c.id.simple().to_string().starts_with(prefix));
    Ok(found)
}

/// Items of one list whose id starts with `prefix` (the server filters with `id_prefix`).
async fn matching<T: DeserializeOwned>(
    client: &Client,
    path: &str,
    prefix: &str,
) -> anyhow::Result<Vec<T>> {
    let q = query(&[
        ("id_prefix", Some(prefix.to_string())),
        ("limit", Some(CANDIDATES.to_string())),
    ]);
    Ok(client.list_page::<T>(path, &q).await?.items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_hex_with_optional_dashes() {
        assert_eq!(normalize_prefix("3F2A-01").unwrap(), "3f2a01");
        assert!(normalize_prefix("laptop").is_err());
        assert!(normalize_prefix("").is_err());
    }

    #[test]
    fn an_ambiguous_prefix_lists_the_candidates() {
        let a = Candidate {
            id: Uuid::new_v4(),
            state: "PENDING".into(),
        };
        let b = Candidate {
            id: Uuid::new_v4(),
            state: "log: failed".into(),
        };
        let err = pick("ab", Scope::Either, vec![a.clone(), b.clone()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("ambiguous") && err.contains(&a.id.to_string()));
        assert!(err.contains(&b.id.to_string()) && err.contains("log: failed"));
        assert!(
            pick("ab", Scope::Active, vec![])
                .unwrap_err()
                .to_string()
                .contains("no active work order")
        );
        assert_eq!(pick("ab", Scope::Either, vec![a.clone()]).unwrap(), a.id);
    }
}
