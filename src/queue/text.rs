//! Text as the queue stores it (docs/design.md §5 "Retry safety"). PostgreSQL `text` and `jsonb`
//! cannot hold U+0000, and real input carries it (container logs, binary garbage in a name): a
//! `500` there would leave a finished order claimed until the reaper hands it out again, so the
//! work would run twice. Every text that reaches the database passes through here first:
//! U+0000 is removed (nothing else is altered), and text over its limit is cut at a character
//! boundary with [`CUT_MARKER`] at the end, so a reader can tell it was cut.

use std::borrow::Cow;
use std::collections::BTreeMap;

/// Appended to text cut at its limit. Plain ASCII, so it is readable in any terminal and log.
pub const CUT_MARKER: &str = "\n[... cut by Pullman: longer than the limit]";

/// Longest result `message` (and the `last_error` taken from it) that is stored, in bytes.
/// Longer messages are cut (docs/design.md §5), never refused: refusing a complete would leave the
/// order claimed.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// `text` without U+0000; borrowed when there was none (the common case costs one scan).
pub fn without_nul(text: &str) -> Cow<'_, str> {
    if text.contains('\0') {
        Cow::Owned(text.replace('\0', ""))
    } else {
        Cow::Borrowed(text)
    }
}

/// Removes U+0000 from `text` in place.
pub fn strip_nul(text: &mut String) {
    if text.contains('\0') {
        text.retain(|c| c != '\0');
    }
}

/// Removes U+0000 from every string of a list.
pub fn strip_nul_all(list: &mut [String]) {
    list.iter_mut().for_each(strip_nul);
}

/// Removes U+0000 from every key and value of a map. Keys that become equal collapse into one
/// (the last in key order wins), as they would have been indistinguishable once stored.
pub fn strip_nul_map(map: &mut BTreeMap<String, String>) {
    if map
        .iter()
        .any(|(k, v)| k.contains('\0') || v.contains('\0'))
    {
        *map = std::mem::take(map)
            .into_iter()
            .map(|(mut k, mut v)| {
                strip_nul(&mut k);
                strip_nul(&mut v);
                (k, v)
            })
            .collect();
    }
}

/// `text` as stored under a limit of `max_bytes` (UTF-8 bytes): U+0000 removed, then, when still
/// longer than `max_bytes`, cut at the last character boundary that leaves room for
/// [`CUT_MARKER`], which is appended. The result is never longer than `max_bytes` (for
/// `max_bytes` ≥ the marker's length).
pub fn storable(text: &str, max_bytes: usize) -> Cow<'_, str> {
    let clean = without_nul(text);
    if clean.len() <= max_bytes {
        return clean;
    }
    let end = clean.floor_char_boundary(max_bytes.saturating_sub(CUT_MARKER.len()));
    let mut cut = String::with_capacity(end + CUT_MARKER.len());
    cut.push_str(&clean[..end]);
    cut.push_str(CUT_MARKER);
    Cow::Owned(cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_is_removed_and_nothing_else_changes() {
        assert_eq!(without_nul("a\0b\0\0c ü"), "abc ü");
        assert!(matches!(without_nul("plain"), Cow::Borrowed("plain")));
        let mut s = String::from("\0x\0");
        strip_nul(&mut s);
        assert_eq!(s, "x");
    }

    #[test]
    fn long_text_is_cut_at_a_character_boundary_with_the_marker() {
        // "é" is two bytes: a cut in the middle of one must step back to its start.
        let text = "é".repeat(100);
        let limit = CUT_MARKER.len() + 11;
        let cut = storable(&text, limit);
        assert!(cut.len() <= limit, "{} > {limit}", cut.len());
        assert!(cut.ends_with(CUT_MARKER));
        assert_eq!(&cut[..cut.len() - CUT_MARKER.len()], "é".repeat(5));
    }

    #[test]
    fn text_at_the_limit_is_kept_whole() {
        let text = "x".repeat(100);
        assert_eq!(storable(&text, 100), text);
        // NUL removal happens first, so text that fits once cleaned is not cut.
        let with_nul = format!("{text}\0");
        assert_eq!(storable(&with_nul, 100), text);
    }

    #[test]
    fn map_keys_and_values_are_cleaned() {
        let mut m = BTreeMap::from([("k\0".to_string(), "v\0v".to_string())]);
        strip_nul_map(&mut m);
        assert_eq!(m, BTreeMap::from([("k".to_string(), "vv".to_string())]));
    }
}
