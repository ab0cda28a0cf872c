//! The printed report: one row per fault with recovery times and the answers seen during it, the
//! answers of the whole run by endpoint, the findings quoted exactly, and the checks' verdict.
//! Tables are Markdown so a run can be pasted into the README as it is.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::checks::Checks;
use crate::faults::PhaseRecord;
use crate::http::{Answer, Endpoint, Exchange, Finding};

/// A progress line on stderr.
pub fn progress(line: &str) {
    eprintln!("[faults] {line}");
}

fn dur(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

fn answer_label(a: Answer) -> String {
    match a {
        Answer::Status(s) => s.to_string(),
        Answer::Refused => "refused".into(),
        Answer::Lost => "lost".into(),
        Answer::TimedOut => "timeout".into(),
    }
}

/// Answers within one phase, by class.
#[derive(Default)]
struct Tally {
    total: usize,
    ok: usize,
    refused_409: usize,
    unavailable_503: usize,
    other_5xx: usize,
    other_4xx: usize,
    no_answer: usize,
    /// Slowest answer to anything but a long-poll.
    slowest: Duration,
}

fn tally(exchanges: &[&Exchange]) -> Tally {
    let mut t = Tally::default();
    for e in exchanges {
        t.total += 1;
        match e.answer {
            Answer::Status(200..=299) => t.ok += 1,
            Answer::Status(404 | 409) => t.refused_409 += 1,
            Answer::Status(503) => t.unavailable_503 += 1,
            Answer::Status(500..=599) => t.other_5xx += 1,
            Answer::Status(_) => t.other_4xx += 1,
            Answer::Refused | Answer::Lost | Answer::TimedOut => t.no_answer += 1,
        }
        if e.endpoint != Endpoint::ClaimNext {
            t.slowest = t.slowest.max(e.took);
        }
    }
    t
}

/// Time from the injection to the first answer satisfying `pick` that arrived after the component
/// was down (a long-poll held across the fault counts: the server recovered under it).
fn first_after(
    phase: &PhaseRecord,
    exchanges: &[Exchange],
    pick: impl Fn(&Exchange) -> bool,
) -> String {
    first_answer(exchanges, phase.down, pick)
        .map_or("—".into(), |at| dur(at.saturating_sub(phase.injected)))
}

/// When the first answer satisfying `pick` arrived at or after `since`.
fn first_answer(
    exchanges: &[Exchange],
    since: Duration,
    pick: impl Fn(&Exchange) -> bool,
) -> Option<Duration> {
    exchanges
        .iter()
        .map(|e| (e.sent + e.took, e))
        .filter(|(answered, e)| *answered >= since && pick(e))
        .map(|(answered, _)| answered)
        .min()
}

/// The longest stretch of the phase in which no picked answer arrived (from the injection to
/// the first, between two, from the last to the phase's end): for completes, the write outage
/// as the agents saw it.
fn longest_gap(
    phase: &PhaseRecord,
    exchanges: &[Exchange],
    pick: impl Fn(&Exchange) -> bool,
) -> String {
    let mut at: Vec<Duration> = exchanges
        .iter()
        .map(|e| e.sent + e.took)
        .zip(exchanges)
        .filter(|(answered, e)| *answered >= phase.injected && *answered < phase.end && pick(e))
        .map(|(answered, _)| answered)
        .collect();
    at.sort();
    let mut last = phase.injected;
    let mut longest = Duration::ZERO;
    for t in at.into_iter().chain(std::iter::once(phase.end)) {
        longest = longest.max(t.saturating_sub(last));
        last = t;
    }
    dur(longest)
}

/// The first picked answer after the component was back, from then.
fn first_after_back(
    phase: &PhaseRecord,
    exchanges: &[Exchange],
    pick: impl Fn(&Exchange) -> bool,
) -> String {
    first_answer(exchanges, phase.back, pick)
        .map_or("—".into(), |at| dur(at.saturating_sub(phase.back)))
}

/// Count of `5xx` answers other than `503`.
pub fn five_hundreds(exchanges: &[Exchange]) -> usize {
    exchanges
        .iter()
        .filter(|e| matches!(e.answer, Answer::Status(s) if s >= 500 && s != 503))
        .count()
}

/// Prints the per-fault table.
pub fn print_phases(phases: &[PhaseRecord], exchanges: &[Exchange]) {
    println!("\n### Faults and recovery\n");
    println!(
        "Times from the injection. *back*: the suite saw the component accept connections / \
         ready again (polled every 50–100 ms); *first 2xx / claim / complete*: first such answer \
         received after the component was down. Answers: to requests sent during the phase; \
         *slowest non-poll*: the longest wait for any answer but a long-poll's; *longest without \
         a complete*: the phase's longest stretch with no complete answered 200/202 (the write \
         outage as agents saw it); *claim after back*: the first claim answered 200 after the \
         component was back, from then."
    );
    println!();
    println!(
        "| # | fault | back | first 2xx | first claim | first complete | longest without a complete | claim after back | answers | 2xx | 409/404 | 503 | other 5xx | other 4xx | no answer | slowest non-poll |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (i, p) in phases.iter().enumerate() {
        let during: Vec<&Exchange> = exchanges
            .iter()
            .filter(|e| e.sent >= p.injected && e.sent < p.end)
            .collect();
        let t = tally(&during);
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            i + 1,
            p.fault.describe(),
            dur(p.back.saturating_sub(p.injected)),
            first_after(p, exchanges, |e| e.answer.is_success()),
            first_after(p, exchanges, |e| e.endpoint == Endpoint::ClaimNext
                && e.answer == Answer::Status(200)),
            first_after(p, exchanges, |e| e.endpoint == Endpoint::Complete
                && matches!(e.answer, Answer::Status(200 | 202))),
            longest_gap(p, exchanges, |e| e.endpoint == Endpoint::Complete
                && matches!(e.answer, Answer::Status(200 | 202))),
            first_after_back(p, exchanges, |e| e.endpoint == Endpoint::ClaimNext
                && e.answer == Answer::Status(200)),
            t.total,
            t.ok,
            t.refused_409,
            t.unavailable_503,
            t.other_5xx,
            t.other_4xx,
            t.no_answer,
            dur(t.slowest),
        );
    }
}

/// Prints every answer of the run by endpoint.
pub fn print_answers(exchanges: &[Exchange]) {
    let mut counts: BTreeMap<Endpoint, BTreeMap<String, usize>> = BTreeMap::new();
    for e in exchanges {
        *counts
            .entry(e.endpoint)
            .or_default()
            .entry(answer_label(e.answer))
            .or_default() += 1;
    }
    println!("\n### Answers of the whole run, by endpoint\n");
    println!("| endpoint | answers |");
    println!("|---|---|");
    for (endpoint, by) in counts {
        let cells: Vec<String> = by.iter().map(|(a, n)| format!("{a}: {n}")).collect();
        println!("| {} | {} |", endpoint.name(), cells.join(", "));
    }
}

/// Prints the findings (answers the protocol does not explain), the first `limit` quoted.
pub fn print_findings(findings: &[Finding], limit: usize) {
    println!("\n### Findings: 5xx other than 503, unexpected 4xx\n");
    if findings.is_empty() {
        println!("None.");
        return;
    }
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for f in findings {
        let status = f.answer.split(' ').next().unwrap_or("");
        let route = f.request.split(' ').take(2).collect::<Vec<_>>().join(" ");
        let route = route
            .split('/')
            .map(|part| if part.len() == 36 { "{id}" } else { part })
            .collect::<Vec<_>>()
            .join("/");
        *kinds.entry(format!("{status} on {route}")).or_default() += 1;
    }
    for (kind, n) in &kinds {
        println!("- {n} × {kind}");
    }
    println!();
    for f in findings.iter().take(limit) {
        println!("- at {}: `{}`\n  → `{}`", dur(f.at), f.request, f.answer);
    }
    if findings.len() > limit {
        println!("- … {} more", findings.len() - limit);
    }
}

/// Prints the checks' figures and verdict.
pub fn print_checks(c: &Checks, drained: Option<Duration>, deaths: usize, abandoned: usize) {
    println!("\n### Checks (from the database after the drain)\n");
    println!("| what | figure |");
    println!("|---|---|");
    let row = |what: &str, figure: String| println!("| {what} | {figure} |");
    row(
        "orders created (201)",
        format!(
            "{} ({} create requests; {} creates retried after a 5xx or lost answer; {} given up)",
            c.created, c.create_attempts, c.creates_with_lost_answer, c.gave_up
        ),
    );
    row(
        "drained",
        drained.map_or("NO (deadline passed)".into(), |d| {
            format!("{} after the last phase", dur(d))
        }),
    );
    row("log entries", c.log_rows.to_string());
    row("left active", c.active_left.to_string());
    let outcomes: Vec<String> = c
        .outcomes
        .iter()
        .map(|(k, n)| format!("{k}: {n}"))
        .collect();
    row("outcomes (outcome/ended by)", outcomes.join(", "));
    row(
        "completes",
        format!(
            "{} finished (200), {} retries scheduled (202), {} refused (409/404), {} without \
             a definitive answer",
            c.completes_finished, c.completes_retry, c.completes_refused, c.completes_unknown
        ),
    );
    row("finished with the 200 lost", c.finished_unseen.to_string());
    row(
        "completes applied though answered 5xx/lost, retry refused",
        c.applied_but_refused.len().to_string(),
    );
    let stale: Vec<String> = c.stale.iter().map(|(k, n)| format!("{k}: {n}")).collect();
    row(
        "agents died mid-order",
        format!(
            "{deaths}; came back with the stale claim: {}",
            stale.join(", ")
        ),
    );
    row(
        "work abandoned after a refused heartbeat",
        abandoned.to_string(),
    );
    row(
        "duplicates (same marker twice)",
        c.duplicates.len().to_string(),
    );
    row(
        "invariant violations",
        if c.violations.is_empty() {
            "none: no order lost, none completed twice, every accepted complete carried the \
             logged claim_id"
                .into()
        } else {
            c.violations.len().to_string()
        },
    );
    for a in c.applied_but_refused.iter().take(10) {
        println!("\napplied but refused on retry: {a}");
    }
    for d in c.duplicates.iter().take(10) {
        println!("\nduplicate: {d}");
    }
    for v in c.violations.iter().take(30) {
        println!("\nVIOLATION: {v}");
    }
}

/// Prints the distinct `ERROR` messages of the replicas' logs with their counts (the server's side
/// of any `5xx`), at most `limit` of them.
pub fn print_server_errors(logs: &[std::path::PathBuf], limit: usize) {
    let mut messages: BTreeMap<String, usize> = BTreeMap::new();
    for path in logs {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        for line in text.lines().filter(|l| l.contains("ERROR")) {
            let line = strip_ansi(line);
            // Drop the timestamp: the same message at different times is one kind.
            let message = line.split_once(' ').map_or(line.as_str(), |(_, m)| m);
            *messages.entry(message.trim().to_string()).or_default() += 1;
        }
    }
    println!("\n### ERROR messages in the server logs (both replicas)\n");
    if messages.is_empty() {
        println!("None.");
        return;
    }
    let mut by_count: Vec<(String, usize)> = messages.into_iter().collect();
    by_count.sort_by_key(|m| std::cmp::Reverse(m.1));
    for (message, n) in by_count.iter().take(limit) {
        let mut end = message.len().min(300);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        println!("- {n} × `{}`", &message[..end]);
    }
}

/// Removes terminal colour sequences (`ESC [ ... m`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(ch) = chars.next() {
        if ch == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(ch);
        }
    }
    out
}
