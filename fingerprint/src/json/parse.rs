//! The JSON parser behind [`super::parse`]: one pass over the body that appends a node per
//! value to the document's tape.
//!
//! It accepts exactly the documents serde_json accepts, with the same values (property
//! tests in `super` and the fuzz corpus check it), and does little per byte or per value:
//! - a string is scanned eight bytes at a time for `"`, `\` or a control character
//!   ([`find_special`]) and stays in the body when it has no escape;
//! - a value is one 8-byte node pushed onto one vector: no allocation per object, no
//!   tree to free;
//! - the grammar is one loop ([`values`]) over a stack of the arrays and objects still
//!   open, not a recursion, and the read position is a local: a chat body is mostly short
//!   strings, and a call per value (with the position and a `Result` passed through
//!   memory each time) was most of the parse's cost in V8.
//!
//! The rare tokens whose value takes real work are handed to serde_json itself, so their
//! rules live in one place: a string with an escape (unescaping, `\u` surrogate pairs) and
//! every number (integer ranges, float rounding, overflow).
//!
//! UTF-8 is checked where it can be broken, not in a pass of its own: outside strings the
//! grammar admits only ASCII, and a string's bytes are checked only when the scan for its
//! closing quote saw a byte of 0x80 or over (or it has an escape). So a document that
//! parses is valid UTF-8 as a whole, and the parser hands it on as a `&str`.
// One `from_utf8_unchecked`, at the end of `document`: the parse has checked the whole body
// as UTF-8 piecewise, and checking it again would be the pass this module saves.
#![allow(unsafe_code)]

use super::{Document, Kind, Node};

/// Why a body is not JSON, with the byte offset where the parser stopped.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JsonError {
    #[error("invalid UTF-8 at byte {0}")]
    Utf8(usize),
    #[error("{what} at byte {at}")]
    Syntax { what: &'static str, at: usize },
    /// A string with escapes or a number that serde_json refused.
    #[error("{message} in the token at byte {at}")]
    Token { message: String, at: usize },
    #[error("a body of 512 MiB or more")]
    TooLarge,
}

/// serde_json's nesting limit: entering the 128th open array or object is an error.
const DEPTH_LIMIT: usize = 128;

/// Parses `bytes` as one JSON document (surrounding whitespace allowed).
pub(super) fn document(bytes: &[u8]) -> Result<Document<'_>, JsonError> {
    if bytes.len() >= super::A_LIMIT {
        return Err(JsonError::TooLarge);
    }
    let mut tape = Tape {
        // Chat bodies of short turns hold about one value per 14 bytes; the vector grows
        // past this guess when it must.
        nodes: Vec::with_capacity(bytes.len() / 12 + 4),
        unescaped: Vec::new(),
    };
    let end = values(bytes, skip_whitespace(bytes, 0), &mut tape)?;
    let end = skip_whitespace(bytes, end);
    if end != bytes.len() {
        return Err(syntax("trailing characters", end));
    }
    debug_assert!(std::str::from_utf8(bytes).is_ok());
    // SAFETY: the parse consumed every byte: outside strings only ASCII tokens (whitespace,
    // punctuation, literals, number characters), and every string either checked with
    // `from_utf8` or seen by `find_special` to hold no byte of 0x80 or over. The property
    // tests in `super` hold the parser to serde_json on arbitrary bytes, which refuses
    // any document that is not UTF-8.
    let text = unsafe { std::str::from_utf8_unchecked(bytes) };
    Ok(Document {
        text,
        nodes: tape.nodes,
        unescaped: tape.unescaped,
    })
}

/// What the parse writes: the nodes, and the unescaped text of strings with escapes.
struct Tape {
    nodes: Vec<Node>,
    unescaped: Vec<String>,
}

impl Tape {
    /// Appends a leaf node (its `next` is the following index).
    #[inline(always)]
    fn leaf(&mut self, kind: Kind, a: usize, tail: usize) {
        self.nodes.push(Node::new(kind, a, tail));
    }
}

fn syntax(what: &'static str, at: usize) -> JsonError {
    JsonError::Syntax { what, at }
}

#[inline(always)]
fn skip_whitespace(bytes: &[u8], mut pos: usize) -> usize {
    while let Some(b' ' | b'\n' | b'\t' | b'\r') = bytes.get(pos) {
        pos += 1;
    }
    pos
}

/// One value and everything inside it, from `pos` (at its first byte); returns the
/// position after it.
///
/// The innermost array or object not yet closed is in `at` (its node's index), `count`
/// (its items or members so far) and `in_object`; `outer` holds the ones around it, and
/// `depth` counts them all: serde_json's nesting level. After a value ends, the loop at
/// the bottom reads what follows it in the innermost container: a `,` (then the next
/// member's key, in an object) or the container's close.
fn values(bytes: &[u8], mut pos: usize, tape: &mut Tape) -> Result<usize, JsonError> {
    let mut outer = [(0u32, 0u32, false); DEPTH_LIMIT];
    let mut depth = 0;
    let (mut at, mut count, mut in_object) = (0u32, 0u32, false);
    'value: loop {
        match bytes.get(pos) {
            Some(b'"') => pos = string(bytes, pos, tape)?,
            Some(&open_byte @ (b'{' | b'[')) => {
                if depth + 1 >= DEPTH_LIMIT {
                    return Err(syntax("recursion limit exceeded", pos));
                }
                let object = open_byte == b'{';
                let kind = if object { Kind::Object } else { Kind::Array };
                let node = tape.nodes.len();
                tape.leaf(kind, 0, 0);
                pos = skip_whitespace(bytes, pos + 1);
                let close = if object { b'}' } else { b']' };
                if bytes.get(pos) == Some(&close) {
                    pos += 1;
                    tape.nodes[node] = Node::new(kind, 0, tape.nodes.len());
                } else {
                    if depth > 0 {
                        outer[depth - 1] = (at, count, in_object);
                    }
                    depth += 1;
                    (at, count, in_object) = (node as u32, 0, object);
                    if object {
                        pos = key(bytes, pos, tape)?;
                    }
                    continue 'value;
                }
            }
            Some(b't') => pos = literal(bytes, pos, b"true", Kind::True, tape)?,
            Some(b'f') => pos = literal(bytes, pos, b"false", Kind::False, tape)?,
            Some(b'n') => pos = literal(bytes, pos, b"null", Kind::Null, tape)?,
            Some(b'-' | b'0'..=b'9') => pos = number(bytes, pos, tape)?,
            Some(_) => return Err(syntax("expected value", pos)),
            None => return Err(syntax("EOF while parsing a value", pos)),
        }
        // A value ended: what follows it, closing containers until one goes on.
        loop {
            if depth == 0 {
                return Ok(pos);
            }
            count += 1;
            pos = skip_whitespace(bytes, pos);
            match bytes.get(pos) {
                Some(b',') => {
                    pos = skip_whitespace(bytes, pos + 1);
                    if in_object {
                        pos = key(bytes, pos, tape)?;
                    }
                    continue 'value;
                }
                Some(b'}') if in_object => {}
                Some(b']') if !in_object => {}
                None => return Err(syntax("EOF while parsing a list or object", pos)),
                Some(_) if in_object => return Err(syntax("expected `,` or `}`", pos)),
                Some(_) => return Err(syntax("expected `,` or `]`", pos)),
            }
            pos += 1;
            let kind = if in_object { Kind::Object } else { Kind::Array };
            let next = tape.nodes.len();
            tape.nodes[at as usize] = Node::new(kind, count as usize, next);
            depth -= 1;
            if depth > 0 {
                (at, count, in_object) = outer[depth - 1];
            }
        }
    }
}

/// An object member's key and its `:`, from `pos` (after `{` or `,` and whitespace);
/// returns the position of the value.
#[inline(always)]
fn key(bytes: &[u8], pos: usize, tape: &mut Tape) -> Result<usize, JsonError> {
    match bytes.get(pos) {
        Some(b'"') => {}
        None => return Err(syntax("EOF while parsing an object", pos)),
        Some(_) => return Err(syntax("key must be a string", pos)),
    }
    let pos = skip_whitespace(bytes, string(bytes, pos, tape)?);
    match bytes.get(pos) {
        Some(b':') => Ok(skip_whitespace(bytes, pos + 1)),
        None => Err(syntax("EOF while parsing an object", pos)),
        Some(_) => Err(syntax("expected `:`", pos)),
    }
}

fn literal(
    bytes: &[u8],
    pos: usize,
    word: &[u8],
    kind: Kind,
    tape: &mut Tape,
) -> Result<usize, JsonError> {
    if bytes[pos..].starts_with(word) {
        tape.leaf(kind, 0, 0);
        Ok(pos + word.len())
    } else {
        Err(syntax("expected value", pos))
    }
}

/// A string from its opening quote at `open`: a range of the body when it has no escape,
/// otherwise unescaped by serde_json into the tape's side list. Its bytes are checked as
/// UTF-8 when they are not all ASCII. Returns the position after the closing quote.
///
/// The common string (ASCII, no escape) is one scan and one node; the rest is
/// [`string_with_more`].
#[inline(always)]
fn string(bytes: &[u8], open: usize, tape: &mut Tape) -> Result<usize, JsonError> {
    let (at, high) = find_special(bytes, open + 1);
    if !high && bytes.get(at) == Some(&b'"') {
        tape.leaf(Kind::String, open + 1, at);
        return Ok(at + 1);
    }
    string_with_more(bytes, open, at, high, tape)
}

/// The rest of a string that is not plain ASCII or has an escape, from `at` (the first
/// special byte after `open`; `high`: a byte of 0x80 or over came before it).
#[inline(never)]
fn string_with_more(
    bytes: &[u8],
    open: usize,
    at: usize,
    high: bool,
    tape: &mut Tape,
) -> Result<usize, JsonError> {
    let mut i = at;
    let mut escaped = false;
    let mut non_ascii = high;
    loop {
        match bytes.get(i) {
            Some(b'"') => break,
            Some(b'\\') => {
                escaped = true;
                // The escaped character cannot close the string; serde_json checks it.
                i += 2;
            }
            Some(_) => return Err(syntax("control character while parsing a string", i)),
            None => return Err(syntax("EOF while parsing a string", bytes.len())),
        }
        let (next, high) = find_special(bytes, i);
        i = next;
        non_ascii |= high;
    }
    if !escaped {
        if non_ascii {
            std::str::from_utf8(&bytes[open + 1..i])
                .map_err(|e| JsonError::Utf8(open + 1 + e.valid_up_to()))?;
        }
        tape.leaf(Kind::String, open + 1, i);
        return Ok(i + 1);
    }
    // An escape can hide a byte from `find_special`'s ASCII check: check it all.
    let raw = std::str::from_utf8(&bytes[open..=i])
        .map_err(|e| JsonError::Utf8(open + e.valid_up_to()))?;
    let text = serde_json::from_str::<String>(raw).map_err(|e| token_error(e, open))?;
    tape.unescaped.push(text);
    tape.leaf(Kind::EscapedString, tape.unescaped.len() - 1, 0);
    Ok(i + 1)
}

/// A number: the longest run of number characters, checked by serde_json. In a valid
/// document a number is followed by whitespace, `,`, `]` or `}`, so the run is exactly
/// the number; any other run is invalid both here and in serde_json.
fn number(bytes: &[u8], start: usize, tape: &mut Tape) -> Result<usize, JsonError> {
    let mut end = start;
    while let Some(b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') = bytes.get(end) {
        end += 1;
    }
    // Number characters are ASCII, so the run is a `&str`.
    let run = std::str::from_utf8(&bytes[start..end]).unwrap_or_default();
    serde_json::from_str::<serde_json::Number>(run).map_err(|e| token_error(e, start))?;
    tape.leaf(Kind::Number, start, end);
    Ok(end)
}

fn token_error(error: serde_json::Error, at: usize) -> JsonError {
    JsonError::Token {
        message: error.to_string(),
        at,
    }
}

/// Index of the first byte at or after `from` that is `"`, `\` or below 0x20 (or the
/// length when there is none), eight bytes at a time (SWAR); and whether a byte of 0x80 or
/// over came before it (the string is then checked as UTF-8).
///
/// For each of the three tests the classic "has a zero byte" expression
/// `(x - 0x01…) & !x & 0x80…` flags the matching bytes; a borrow can flag a byte only
/// above a real match, so the lowest flag is always a real one. Bytes of 0x80 and over
/// (UTF-8 sequences) are never flagged, only noted.
pub(crate) fn find_special(bytes: &[u8], from: usize) -> (usize, bool) {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut i = from;
    let mut high = 0;
    while let Some(chunk) = bytes.get(i..i + 8) {
        let word = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
        let quote = word ^ (ONES * u64::from(b'"'));
        let backslash = word ^ (ONES * u64::from(b'\\'));
        let flags = (quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash)
            | (word.wrapping_sub(ONES * 0x20) & !word);
        let flags = flags & HIGH;
        if flags != 0 {
            // Only the bytes before the match count: the rest belong to what follows.
            let before = flags.trailing_zeros() & !7;
            let below = (1u64 << before).wrapping_sub(1);
            high |= word & below & HIGH;
            return (i + (before / 8) as usize, high != 0);
        }
        high |= word & HIGH;
        i += 8;
    }
    let mut high = high != 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'"' || b == b'\\' || b < 0x20 {
            return (i, high);
        }
        high |= b >= 0x80;
        i += 1;
    }
    (i, high)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slow_find_special(bytes: &[u8], from: usize) -> (usize, bool) {
        let at = (from..bytes.len())
            .find(|&i| matches!(bytes[i], b'"' | b'\\' | 0..=0x1f))
            .unwrap_or(bytes.len().max(from));
        (at, bytes[from.min(at)..at].iter().any(|&b| b >= 0x80))
    }

    #[test]
    fn find_special_stops_at_the_first_special_byte() {
        for text in [
            &b"plain text with no specials at all, long enough for words"[..],
            b"abcdefg\"",
            b"abcdefgh\\ijk",
            b"\x1f",
            b"\xc3\xa9\xf0\x9f\x98\x80 then \x00",
            b"\x21\x23\x5b\x5d\x20\x7f\x80\xff\"",
            b"ascii\" then \xc3\xa9 after the quote",
        ] {
            for from in 0..text.len() {
                assert_eq!(find_special(text, from), slow_find_special(text, from));
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn find_special_matches_a_byte_loop(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
            from in 0usize..40,
        ) {
            let from = from.min(bytes.len());
            proptest::prop_assert_eq!(find_special(&bytes, from), slow_find_special(&bytes, from));
        }
    }

    #[test]
    fn utf8_is_checked_inside_strings_and_refused_outside() {
        for (text, ok) in [
            (&b"[\"caf\xc3\xa9\"]"[..], true),
            (b"[\"caf\xc3\"]", false),
            (b"[\"\\n\xff\"]", false),
            (b"[\"\\\xc3\xa9\"]", false),
            (b"[1, \xc3\xa9]", false),
            (b"{\"\xe2\x82\xac\": \"\xf0\x9f\x98\x80\"}", true),
        ] {
            let theirs = serde_json::from_slice::<serde_json::Value>(text).is_ok();
            assert_eq!(theirs, ok, "{}", String::from_utf8_lossy(text));
            assert_eq!(
                document(text).is_ok(),
                ok,
                "{}",
                String::from_utf8_lossy(text)
            );
        }
    }

    #[test]
    fn nesting_stops_where_serde_json_stops() {
        for depth in [126, 127, 128, 129] {
            let text = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            let theirs = serde_json::from_str::<serde_json::Value>(&text).is_ok();
            assert_eq!(document(text.as_bytes()).is_ok(), theirs, "depth {depth}");
        }
        let mixed = format!("{}1{}", r#"{"a":["#.repeat(64), "]}".repeat(64));
        assert_eq!(
            document(mixed.as_bytes()).is_ok(),
            serde_json::from_str::<serde_json::Value>(&mixed).is_ok()
        );
    }

    #[test]
    fn errors_say_where() {
        assert_eq!(
            document(b"[1, x]").unwrap_err().to_string(),
            "expected value at byte 4"
        );
        assert!(document(br#"{"a": "\q"}"#)
            .unwrap_err()
            .to_string()
            .ends_with("in the token at byte 6"));
    }
}
