//! Hiding secret values in an order's output before it leaves the agent (docs/design.md §9): the
//! agent's own token and the values it is told to hide become [`REDACTED`].
//!
//! A value is hidden whole, trimmed of surrounding whitespace. A value of several lines (a PEM
//! key, a kubeconfig) is also hidden line by line, as GitHub Actions masks a multi-line secret:
//! each line of at least [`MIN_SECRET_BYTES`] (trimmed) is hidden wherever it appears, so a
//! command that prints the value one line at a time, or only part of it, leaks no line. Shorter
//! lines (`}`, `---`) are not hidden on their own: hiding them would hide every `}` of the
//! output, and they tell nothing of the secret.
//!
//! Redaction runs on the bytes as read, before they are cut into lines or pieces
//! ([`Redactor::redact_bytes`] keeps back a tail that may be the start of a secret), so no cut
//! can split a secret, a multi-line one included.

use std::sync::Arc;

/// What a hidden value is replaced with.
pub const REDACTED: &str = "[REDACTED]";

/// Shortest value, or line of a multi-line value, hidden on its own: bytes after trimming
/// whitespace. `pullman worker` refuses a `--redact-env` value shorter than this, since hiding
/// it would hide every occurrence of those characters in ordinary output.
pub const MIN_SECRET_BYTES: usize = 4;

/// What of one secret value is hidden (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretParts {
    /// The value trimmed of surrounding whitespace; empty when there is nothing to hide.
    pub whole: String,
    /// For a multi-line value: its lines of at least [`MIN_SECRET_BYTES`], trimmed.
    pub lines: Vec<String>,
    /// For a multi-line value: its non-blank lines shorter than [`MIN_SECRET_BYTES`], which are
    /// hidden only as part of the whole value.
    pub short_lines: usize,
}

impl SecretParts {
    /// Splits `value` into what is hidden. Lines end at `\n`, `\r\n` or `\r`.
    pub fn of(value: &str) -> Self {
        let whole = value.trim().to_string();
        let mut lines = Vec::new();
        let mut short_lines = 0;
        if whole.contains(['\n', '\r']) {
            for line in whole.split(['\n', '\r']).map(str::trim) {
                if line.len() >= MIN_SECRET_BYTES {
                    lines.push(line.to_string());
                } else if !line.is_empty() {
                    short_lines += 1;
                }
            }
        }
        SecretParts {
            whole,
            lines,
            short_lines,
        }
    }

    /// Whether the value whole is too short to hide safely (shorter than [`MIN_SECRET_BYTES`]).
    pub fn too_short(&self) -> bool {
        self.whole.len() < MIN_SECRET_BYTES
    }
}

/// Replaces secret values with [`REDACTED`] in output before it leaves the agent.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    /// Longest first, so a secret containing another is replaced whole.
    secrets: Arc<Vec<Vec<u8>>>,
}

impl Redactor {
    /// Hides each of `values` whole and, for a multi-line value, each of its lines of at least
    /// [`MIN_SECRET_BYTES`] ([`SecretParts`]). Empty and all-whitespace values are ignored (they
    /// would hide every line's spaces, or everything); a short single-line value is hidden as
    /// given (the caller decides whether to accept it, see [`SecretParts::too_short`]).
    pub fn new(values: impl IntoIterator<Item = String>) -> Self {
        let mut secrets: Vec<Vec<u8>> = Vec::new();
        for value in values {
            let parts = SecretParts::of(&value);
            if parts.whole.is_empty() {
                continue;
            }
            secrets.push(parts.whole.into_bytes());
            secrets.extend(parts.lines.into_iter().map(String::into_bytes));
        }
        secrets.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
        secrets.dedup();
        Redactor {
            secrets: Arc::new(secrets),
        }
    }

    /// Whether there is nothing to hide.
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// Redacts `buf`. With `complete` (the end of the stream) everything is consumed. Otherwise
    /// more bytes may follow: a tail that may be the start of a secret (or of a UTF-8 character)
    /// is left over, and the answer says how many bytes were consumed; the caller puts the rest
    /// in front of the next bytes, so a secret split across two reads, or across lines, is still
    /// hidden. The leftover is shorter than the longest secret plus 4 bytes.
    pub fn redact_bytes(&self, buf: &[u8], complete: bool) -> (Vec<u8>, usize) {
        let mut out = Vec::with_capacity(buf.len());
        let mut i = 0;
        'scan: while i < buf.len() {
            let rest = &buf[i..];
            for s in self.secrets.iter() {
                if rest.starts_with(s) {
                    out.extend_from_slice(REDACTED.as_bytes());
                    i += s.len();
                    continue 'scan;
                }
                // A longer secret (checked first) may still follow: wait for more bytes
                // rather than hide a shorter one that it contains.
                if !complete && s.starts_with(rest) {
                    break 'scan;
                }
            }
            out.push(buf[i]);
            i += 1;
        }
        if !complete {
            // Do not cut a UTF-8 character in two: keep its first bytes for the next piece.
            if let Err(e) = std::str::from_utf8(&out)
                && e.error_len().is_none()
            {
                let cut = out.len() - e.valid_up_to();
                out.truncate(e.valid_up_to());
                i -= cut;
            }
        }
        (out, i)
    }

    /// Redacts one whole text (a line, or several).
    pub fn redact(&self, text: &str) -> String {
        if self.is_empty() {
            return text.to_string();
        }
        String::from_utf8_lossy(&self.redact_bytes(text.as_bytes(), true).0).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn red(values: &[&str]) -> Redactor {
        Redactor::new(values.iter().map(|s| s.to_string()))
    }

    /// Feeds `input` in pieces of `piece` bytes, carrying the leftover forward.
    fn in_pieces(r: &Redactor, input: &[u8], piece: usize) -> String {
        let mut out = Vec::new();
        let mut carry: Vec<u8> = Vec::new();
        for part in input.chunks(piece) {
            carry.extend_from_slice(part);
            let (o, used) = r.redact_bytes(&carry, false);
            out.extend(o);
            carry.drain(..used);
        }
        let (o, _) = r.redact_bytes(&carry, true);
        out.extend(o);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn redacts_whole_lines_longest_first_and_ignores_empty_values() {
        let r = red(&["abcd", "abcdef", "", "  "]);
        assert_eq!(r.redact("x abcdef y abcd z"), "x [REDACTED] y [REDACTED] z");
        assert_eq!(r.redact("a  b"), "a  b");
        assert!(red(&["", " "]).is_empty());
    }

    #[test]
    fn a_secret_split_across_pieces_is_still_hidden() {
        let r = red(&["s3cr3t-token"]);
        let input = b"before s3cr3t-token after s3cr3t-token";
        for piece in 1..input.len() {
            assert_eq!(
                in_pieces(&r, input, piece),
                "before [REDACTED] after [REDACTED]",
                "piece size {piece}"
            );
        }
    }

    #[test]
    fn a_multi_line_secret_is_hidden_whole_and_line_by_line() {
        let value = "line-one-secret\r\nline-two-secret\n}\n";
        let parts = SecretParts::of(value);
        assert_eq!(parts.lines, ["line-one-secret", "line-two-secret"]);
        assert_eq!((parts.short_lines, parts.too_short()), (1, false));
        let r = red(&[value]);
        // Whole: one mask, even where its short line is printed, however the bytes come.
        for piece in 1..40 {
            assert_eq!(
                in_pieces(&r, b"a line-one-secret\r\nline-two-secret\n} b\n", piece),
                "a [REDACTED] b\n",
                "piece size {piece}"
            );
        }
        // Line by line, in any order, alone or inside other text.
        assert_eq!(
            r.redact("line-two-secret\nx=line-one-secret;\n}"),
            "[REDACTED]\nx=[REDACTED];\n}"
        );
        for piece in 1..20 {
            assert_eq!(
                in_pieces(&r, b"1 line-one-secret\n2 line-two-secret\n", piece),
                "1 [REDACTED]\n2 [REDACTED]\n",
                "piece size {piece}"
            );
        }
    }

    #[test]
    fn short_values_are_flagged_and_short_lines_not_hidden_alone() {
        assert!(SecretParts::of(" ab \n").too_short());
        assert!(!SecretParts::of("abcd").too_short());
        let r = red(&["ab\nlong-enough"]);
        assert_eq!(r.redact("ab cd long-enough"), "ab cd [REDACTED]");
    }

    #[test]
    fn pieces_never_cut_a_utf8_character() {
        let r = Redactor::default();
        let text = "é".as_bytes();
        let (o, used) = r.redact_bytes(&text[..1], false);
        assert!(o.is_empty());
        assert_eq!(used, 0);
        let (o, used) = r.redact_bytes(text, false);
        assert_eq!((o.as_slice(), used), (text, 2));
    }
}
