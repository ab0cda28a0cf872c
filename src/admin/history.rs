//! The attempt history of an order (every claim: agent, claim id, start, end, how it ended), as
//! `work-orders get` and `log get` print it under the order (issue #15).

use std::collections::HashMap;

use chrono::Utc;
use uuid::Uuid;

use super::render::{one_line, print_table, relative, when};
use crate::wire::Attempt;

const ATTEMPT_HEADERS: &[&str] = &[
    "#", "AGENT", "CLAIM", "STARTED", "TOOK", "RESULT", "MESSAGE",
];

/// How long an attempt took (or has been running), in its largest whole unit.
fn took(a: &Attempt) -> String {
    let end = a.ended_at.unwrap_or_else(Utc::now);
    let secs = (end - a.started_at).num_seconds().max(0);
    let text = match secs {
        0..90 => format!("{secs}s"),
        90..5400 => format!("{}m", secs / 60),
        _ => format!("{}h", secs / 3600),
    };
    if a.ended_at.is_none() {
        format!("{text} so far")
    } else {
        text
    }
}

/// Attempt rows, oldest first; `wide` gives full claim ids and exact start times.
pub fn attempt_rows(
    attempts: &[Attempt],
    names: &HashMap<Uuid, String>,
    wide: bool,
) -> Vec<Vec<String>> {
    let now = Utc::now();
    attempts
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let claim = a.claim_id.to_string();
            vec![
                (i + 1).to_string(),
                names
                    .get(&a.agent_id)
                    .cloned()
                    .unwrap_or_else(|| a.agent_id.to_string()),
                if wide { claim } else { claim[..8].to_string() },
                if wide {
                    when(a.started_at)
                } else {
                    relative(a.started_at, now)
                },
                took(a),
                a.result.as_str().to_string(),
                a.message
                    .as_deref()
                    .map(|m| one_line(m, if wide { 120 } else { 60 }))
                    .unwrap_or_else(|| "-".into()),
            ]
        })
        .collect()
}

/// Prints the `Attempts:` section (or says there were none).
pub fn print_attempts(attempts: Option<&[Attempt]>, names: &HashMap<Uuid, String>, wide: bool) {
    let Some(attempts) = attempts else {
        return;
    };
    if attempts.is_empty() {
        crate::outln!("\nAttempts: none (never claimed)");
        return;
    }
    crate::outln!("\nAttempts:");
    print_table(
        ATTEMPT_HEADERS,
        &attempt_rows(attempts, names, wide),
        Some(5),
    );
}
