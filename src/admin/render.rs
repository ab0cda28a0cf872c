//! Printing for the admin commands: `-o table|wide|json|yaml|name`, aligned columns, colour only on
//! a terminal (and never with `NO_COLOR`), times as "in 2m (2026-…Z)", and result messages that the
//! server cut at its limit marked as cut.

use std::io::IsTerminal;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::args::Output;
use crate::wire::CUT_MARKER;

/// Prints `value` as the API's JSON (pretty) or the same document in YAML; `false` when `output`
/// is neither, so the caller prints its own table or names.
pub fn print_document(output: Output, value: &impl Serialize) -> anyhow::Result<bool> {
    match output {
        Output::Json => crate::outln!("{}", serde_json::to_string_pretty(value)?),
        // Through serde_json::Value so that JSON and YAML print the same document (a round-trip
        // through either parser gives equal values).
        Output::Yaml => crate::out!(
            "{}",
            serde_norway::to_string(&serde_json::to_value(value)?)?
        ),
        _ => return Ok(false),
    }
    Ok(true)
}

/// Whether to colour standard output: a terminal, and `NO_COLOR` unset or empty
/// (https://no-color.org).
pub fn colour_enabled() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// ANSI colour of a state word: green done well, red failed, yellow waiting or cut short.
fn colour_of(word: &str) -> Option<&'static str> {
    Some(match word {
        "succeeded" | "SUCCEEDED" | "active" => "32",
        "failed" | "FAILED" | "retired" => "31",
        "RETRY_PENDING" | "cancelled" | "CANCELLED" | "stale" | "reclaimed" | "released"
        | "retry_scheduled" | "disrupted" => "33",
        "CLAIMED" | "running" => "36",
        _ => return None,
    })
}

/// Prints `rows` under `headers`, aligned; column `state_column` (if any) is coloured by its value
/// when [`colour_enabled`]. Padding is computed on the plain text, so colour never misaligns.
pub fn print_table(headers: &[&str], rows: &[Vec<String>], state_column: Option<usize>) {
    for line in table_lines(headers, rows, state_column, colour_enabled()) {
        crate::outln!("{line}");
    }
}

/// A list as `-o name` (one `name` a line) or as a table: `-o wide` under `wide_headers` with
/// `rows(true)`, otherwise under `headers` with `rows(false)`, column `state_column` coloured.
/// Documents (`-o json`, `-o yaml`) are the caller's to print first.
pub fn print_list<T>(
    output: Output,
    items: &[T],
    name: impl Fn(&T) -> String,
    (headers, wide_headers): (&[&str], &[&str]),
    rows: impl Fn(bool) -> Vec<Vec<String>>,
    state_column: usize,
) {
    match output {
        Output::Name => items.iter().for_each(|i| crate::outln!("{}", name(i))),
        Output::Wide => print_table(wide_headers, &rows(true), Some(state_column)),
        _ => print_table(headers, &rows(false), Some(state_column)),
    }
}

/// Rows only, no header: the lines `--watch` appends under the first table.
pub fn print_rows(headers: &[&str], rows: &[Vec<String>], state_column: Option<usize>) {
    for line in table_lines(headers, rows, state_column, colour_enabled())
        .into_iter()
        .skip(1)
    {
        crate::outln!("{line}");
    }
}

fn table_lines(
    headers: &[&str],
    rows: &[Vec<String>],
    state_column: Option<usize>,
    colour: bool,
) -> Vec<String> {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String], header: bool| {
        let parts: Vec<String> = cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                let padded = format!("{c:<w$}");
                match (colour, header, state_column == Some(i), colour_of(c)) {
                    (true, true, _, _) => format!("\x1b[1m{padded}\x1b[0m"),
                    (true, false, true, Some(code)) => format!("\x1b[{code}m{padded}\x1b[0m"),
                    _ => padded,
                }
            })
            .collect();
        parts.join("  ").trim_end().to_string()
    };
    let mut out = vec![line(
        &headers.iter().map(|h| h.to_string()).collect::<Vec<_>>(),
        true,
    )];
    out.extend(rows.iter().map(|r| line(r, false)));
    out
}

/// Prints `label: value` lines with the values aligned (the `get` view, as `kubectl describe`).
pub fn print_fields(fields: &[(&str, String)]) {
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    for (k, v) in fields {
        let label = format!("{k}:");
        crate::outln!("{label:<width$} {v}");
    }
}

/// RFC 3339 UTC to the second.
pub fn when(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// `in 2m`, `3h ago`, `now`: the distance from `now` in its largest whole unit.
pub fn relative(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let secs = (t - now).num_seconds();
    if secs == 0 {
        return "now".into();
    }
    let text = span_text(secs.unsigned_abs());
    if secs > 0 {
        format!("in {text}")
    } else {
        format!("{text} ago")
    }
}

/// `45s`, `2m`, `3h`, `4d`: a span of seconds in its largest whole unit.
pub fn span_text(span: u64) -> String {
    match span {
        0..90 => format!("{span}s"),
        90..5400 => format!("{}m", span / 60),
        5400..129_600 => format!("{}h", span / 3600),
        _ => format!("{}d", span / 86_400),
    }
}

/// `in 2m (2026-12-01T05:10:00Z)`.
pub fn relative_and_exact(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    format!("{} ({})", relative(t, now), when(t))
}

/// `-` for nothing.
pub fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref()
        .map(|x| x.to_string())
        .unwrap_or_else(|| "-".into())
}

/// A result message as the server stored it, split into its text and whether the server cut it
/// at its limit (it appends [`CUT_MARKER`]).
pub fn message_parts(message: &str) -> (&str, bool) {
    match message.strip_suffix(CUT_MARKER) {
        Some(kept) => (kept, true),
        None => (message, false),
    }
}

/// The note printed under a message the server cut.
pub const CUT_NOTE: &str = "[message cut: the server keeps the first 64 KiB]";

/// A message on one line of at most `max` characters, for a table cell; `[cut]` when the server
/// cut it, `...` when this cell does.
pub fn one_line(message: &str, max: usize) -> String {
    let (text, cut) = message_parts(message);
    let flat = text.replace(['\n', '\r', '\t'], " ");
    let mut out = if flat.chars().count() > max {
        flat.chars().take(max.saturating_sub(3)).collect::<String>() + "..."
    } else {
        flat
    };
    if cut {
        out.push_str(" [cut]");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_times_read_like_a_person_would_say_them() {
        let now = Utc::now();
        assert_eq!(relative(now + chrono::Duration::seconds(120), now), "in 2m");
        assert_eq!(
            relative(now - chrono::Duration::seconds(30), now),
            "30s ago"
        );
        assert_eq!(relative(now + chrono::Duration::hours(3), now), "in 3h");
        assert_eq!(relative(now - chrono::Duration::days(3), now), "3d ago");
        assert_eq!(relative(now, now), "now");
    }

    #[test]
    fn a_cut_message_is_marked_and_an_uncut_one_is_not() {
        let cut = format!("abc{CUT_MARKER}");
        assert_eq!(message_parts(&cut), ("abc", true));
        assert_eq!(one_line(&cut, 60), "abc [cut]");
        assert_eq!(message_parts("abc"), ("abc", false));
        assert_eq!(one_line("a\nb", 60), "a b");
    }

    #[test]
    fn colour_does_not_move_the_columns() {
        let rows = vec![
            vec!["x".to_string(), "failed".to_string()],
            vec!["yy".to_string(), "ok".to_string()],
        ];
        let plain = table_lines(&["ID", "STATE"], &rows, Some(1), false);
        let coloured = table_lines(&["ID", "STATE"], &rows, Some(1), true);
        let strip = |s: &str| {
            let mut out = String::new();
            let mut in_escape = false;
            for c in s.chars() {
                match (in_escape, c) {
                    (false, '\x1b') => in_escape = true,
                    (true, 'm') => in_escape = false,
                    (false, c) => out.push(c),
                    _ => {}
                }
            }
            out.trim_end().to_string()
        };
        assert!(coloured[1].contains("\x1b[31m"));
        for (p, c) in plain.iter().zip(&coloured) {
            assert_eq!(p, &strip(c));
        }
    }
}
