//! A byte stream cut into output lines (docs/design.md §9), the same way for the worker's
//! commands and the executor's containers: bytes are redacted as read ([`Redactor::redact_bytes`]),
//! before any cut, so no cut splits a secret; invalid UTF-8 becomes U+FFFD and never ends the
//! stream; a line longer than the budget is sent as pieces of at most that many bytes, cut on a
//! character boundary while it is read, so a long line without a newline is never held whole.
//!
//! Memory held between reads: less than the budget plus the longest secret plus 4 bytes.

use super::redact::Redactor;

/// One line, or one piece of an over-long line, ready to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// Valid UTF-8, at most the budget's bytes, without its line ending (`\n` or `\r\n`).
    pub text: String,
    /// Whether the piece starts a line (false for the second and later pieces of a long line).
    pub starts_line: bool,
}

/// Cuts the bytes of one stream into [`Piece`]s; one per stream (it holds the unfinished line).
#[derive(Debug)]
pub struct LineCutter {
    redactor: Redactor,
    max_bytes: usize,
    /// Read and not yet redacted: they may be the start of a secret.
    raw: Vec<u8>,
    /// Redacted and not yet decoded: the first bytes of a character split across reads.
    undecoded: Vec<u8>,
    /// The line being read, decoded.
    line: String,
    /// Whether `line` continues a line already given out in pieces.
    continued: bool,
}

impl LineCutter {
    /// Cuts lines at `max_bytes` (at least 4, so a piece always holds a character).
    pub fn new(redactor: Redactor, max_bytes: usize) -> Self {
        LineCutter {
            redactor,
            max_bytes: max_bytes.max(4),
            raw: Vec::new(),
            undecoded: Vec::new(),
            line: String::new(),
            continued: false,
        }
    }

    /// Takes the next bytes read; answers the lines they complete and the pieces of a line that
    /// grew past the budget.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<Piece> {
        self.raw.extend_from_slice(bytes);
        let (clean, used) = self.redactor.redact_bytes(&self.raw, false);
        self.raw.drain(..used);
        self.take(&clean, false)
    }

    /// The stream ended: the rest, redacted and decoded, as a last line if anything is left.
    pub fn finish(&mut self) -> Vec<Piece> {
        let (clean, _) = self.redactor.redact_bytes(&self.raw, true);
        self.raw.clear();
        let mut pieces = self.take(&clean, true);
        if !self.line.is_empty() {
            pieces.push(self.piece_of_line());
        }
        pieces
    }

    fn take(&mut self, clean: &[u8], end: bool) -> Vec<Piece> {
        self.undecoded.extend_from_slice(clean);
        let bytes = std::mem::take(&mut self.undecoded);
        let mut pieces = Vec::new();
        let mut chunks = bytes.utf8_chunks().peekable();
        while let Some(chunk) = chunks.next() {
            self.text(chunk.valid(), &mut pieces);
            let invalid = chunk.invalid();
            if invalid.is_empty() {
                continue;
            }
            // The start of a character whose other bytes are still to come.
            let incomplete = chunks.peek().is_none()
                && std::str::from_utf8(invalid).is_err_and(|e| e.error_len().is_none());
            if incomplete && !end {
                self.undecoded.extend_from_slice(invalid);
            } else {
                self.text("\u{FFFD}", &mut pieces);
            }
        }
        pieces
    }

    fn text(&mut self, mut text: &str, pieces: &mut Vec<Piece>) {
        loop {
            let (part, newline) = match text.find('\n') {
                Some(i) => (&text[..i], Some(i)),
                None => (text, None),
            };
            self.line.push_str(part);
            self.cut_long(pieces);
            let Some(i) = newline else { return };
            if self.line.ends_with('\r') {
                self.line.pop();
            }
            if self.line.is_empty() && self.continued {
                // The line's last piece was cut just before its `\r\n`: nothing is left of it.
                self.continued = false;
            } else {
                pieces.push(self.piece_of_line());
            }
            text = &text[i + 1..];
        }
    }

    /// Gives out pieces of the line while it is longer than the budget; what is left is at most
    /// the budget and never empty, so a newline right after a cut does not make an empty line.
    fn cut_long(&mut self, pieces: &mut Vec<Piece>) {
        while self.line.len() > self.max_bytes {
            let cut = self.line.floor_char_boundary(self.max_bytes);
            let rest = self.line.split_off(cut);
            pieces.push(Piece {
                text: std::mem::replace(&mut self.line, rest),
                starts_line: !self.continued,
            });
            self.continued = true;
        }
    }

    fn piece_of_line(&mut self) -> Piece {
        let piece = Piece {
            text: std::mem::take(&mut self.line),
            starts_line: !self.continued,
        };
        self.continued = false;
        piece
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut_all(c: &mut LineCutter, input: &[u8], read: usize) -> Vec<Piece> {
        let mut out = Vec::new();
        for part in input.chunks(read) {
            out.extend(c.feed(part));
        }
        out.extend(c.finish());
        out
    }

    fn texts(pieces: &[Piece]) -> Vec<&str> {
        pieces.iter().map(|p| p.text.as_str()).collect()
    }

    /// `input` cut by a fresh cutter (a 64-byte budget) reading `read` bytes at a time, for every
    /// `read` shorter than `input`.
    fn every_read_size(input: &[u8]) -> impl Iterator<Item = (usize, Vec<Piece>)> + '_ {
        (1..input.len()).map(|read| {
            let mut c = LineCutter::new(Redactor::default(), 64);
            (read, cut_all(&mut c, input, read))
        })
    }

    #[test]
    fn lines_end_at_newlines_whatever_the_reads() {
        for (read, pieces) in every_read_size(b"one\r\ntwo\n\nthree") {
            assert_eq!(
                texts(&pieces),
                ["one", "two", "", "three"],
                "reads of {read}"
            );
            assert!(pieces.iter().all(|p| p.starts_line));
        }
    }

    #[test]
    fn invalid_utf8_becomes_a_replacement_and_the_stream_goes_on() {
        let input = b"ok \xff\xfe end\nnext \xe2\x82\n\xc3\xa9t\xc3\xa9\n";
        for (read, pieces) in every_read_size(input) {
            assert_eq!(
                texts(&pieces),
                ["ok \u{fffd}\u{fffd} end", "next \u{fffd}", "été"],
                "reads of {read}"
            );
        }
        // A stream that ends inside a character.
        let mut c = LineCutter::new(Redactor::default(), 64);
        assert_eq!(texts(&cut_all(&mut c, b"ab\xe2\x82", 1)), ["ab\u{fffd}"]);
    }

    #[test]
    fn a_long_line_is_cut_while_it_is_read_into_pieces_within_the_budget() {
        let max = 10;
        let mut c = LineCutter::new(Redactor::default(), max);
        // 25 bytes, no newline yet: two pieces out, at most one budget held.
        let first = c.feed(&[b'x'; 25]);
        assert_eq!(texts(&first), ["x".repeat(10), "x".repeat(10)]);
        assert_eq!((first[0].starts_line, first[1].starts_line), (true, false));
        assert!(c.line.len() <= max);
        let rest = c.feed(b"\nnext\n");
        assert_eq!(texts(&rest), ["xxxxx", "next"]);
        assert_eq!((rest[0].starts_line, rest[1].starts_line), (false, true));
        // Exactly the budget, then `\r\n` split anywhere: one piece, no empty line after it.
        for read in 1..13 {
            let mut c = LineCutter::new(Redactor::default(), max);
            let input = [[b'w'; 10].as_slice(), b"\r\nnext\r\n"].concat();
            assert_eq!(
                texts(&cut_all(&mut c, &input, read)),
                ["w".repeat(10), "next".into()],
                "reads of {read}"
            );
        }
        // Exactly the budget, then a newline: one piece, no empty line after it.
        let mut c = LineCutter::new(Redactor::default(), max);
        assert_eq!(texts(&cut_all(&mut c, &[b'y'; 10], 3)), ["y".repeat(10)]);
        let mut c = LineCutter::new(Redactor::default(), max);
        let input = [[b'y'; 10].as_slice(), b"\n"].concat();
        assert_eq!(texts(&cut_all(&mut c, &input, 4)), ["y".repeat(10)]);
    }

    #[test]
    fn pieces_never_split_a_character() {
        let line = "é".repeat(20); // 40 bytes
        for read in 1..8 {
            let mut c = LineCutter::new(Redactor::default(), 9);
            let pieces = cut_all(&mut c, line.as_bytes(), read);
            assert!(
                pieces
                    .iter()
                    .all(|p| p.text.len() <= 9 && !p.text.is_empty())
            );
            assert_eq!(
                pieces.iter().map(|p| p.text.as_str()).collect::<String>(),
                line
            );
        }
    }

    #[test]
    fn a_secret_across_the_cut_is_hidden_before_the_cut() {
        let secret = "s3cr3t-value";
        let r = Redactor::new([secret.to_string()]);
        // The secret starts 4 bytes before the budget: cut first, it would leak its first 4 bytes.
        for start in 0..16 {
            let input = format!("{}{secret} tail\n", "x".repeat(start));
            for read in [1, 3, 7, 64] {
                let mut c = LineCutter::new(r.clone(), 16);
                let all = cut_all(&mut c, input.as_bytes(), read)
                    .into_iter()
                    .map(|p| p.text)
                    .collect::<String>();
                assert_eq!(
                    all,
                    format!("{}[REDACTED] tail", "x".repeat(start)),
                    "start {start}, reads of {read}"
                );
            }
        }
    }

    #[test]
    fn a_huge_line_without_newline_is_never_held_whole() {
        let mut c = LineCutter::new(Redactor::default(), 64 * 1024);
        let block = vec![b'z'; 1 << 20];
        let mut out = 0usize;
        for _ in 0..10 {
            for p in c.feed(&block) {
                out += p.text.len();
            }
            assert!(c.line.len() <= 64 * 1024 && c.raw.len() < 8 && c.undecoded.len() < 4);
        }
        out += c.finish().iter().map(|p| p.text.len()).sum::<usize>();
        assert_eq!(out, 10 << 20);
    }
}
