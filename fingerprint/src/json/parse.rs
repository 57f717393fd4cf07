//! The JSON parser behind [`super::parse`]: one recursive-descent pass over the body that
//! appends a node per value to the document's tape.
//!
//! It accepts exactly the documents serde_json accepts, with the same values (property
//! tests in `super` and the fuzz corpus check it), and does little per byte or per value:
//! - a string is scanned eight bytes at a time for `"`, `\` or a control character
//!   ([`find_special`]) and stays in the body when it has no escape;
//! - a value is one 8-byte node pushed onto one vector: no allocation per object, no
//!   tree to free.
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
const DEPTH_LIMIT: u8 = 128;

/// Parses `bytes` as one JSON document (surrounding whitespace allowed).
pub(super) fn document(bytes: &[u8]) -> Result<Document<'_>, JsonError> {
    if bytes.len() >= super::A_LIMIT {
        return Err(JsonError::TooLarge);
    }
    let mut parser = Parser {
        bytes,
        pos: 0,
        depth_left: DEPTH_LIMIT,
        // Chat bodies of short turns hold about one value per 14 bytes; the vector grows
        // past this guess when it must.
        nodes: Vec::with_capacity(bytes.len() / 12 + 4),
        unescaped: Vec::new(),
    };
    parser.skip_whitespace();
    parser.value()?;
    parser.skip_whitespace();
    if parser.pos != parser.bytes.len() {
        return Err(parser.syntax("trailing characters"));
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
        nodes: parser.nodes,
        unescaped: parser.unescaped,
    })
}

struct Parser<'a> {
    bytes: &'a [u8],
    pos: usize,
    depth_left: u8,
    nodes: Vec<Node>,
    unescaped: Vec<String>,
}

impl<'a> Parser<'a> {
    fn syntax(&self, what: &'static str) -> JsonError {
        JsonError::Syntax { what, at: self.pos }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    /// Appends a leaf node (its `next` is the following index).
    fn leaf(&mut self, kind: Kind, a: usize, tail: usize) {
        self.nodes.push(Node::new(kind, a, tail));
    }

    fn value(&mut self) -> Result<(), JsonError> {
        match self.peek() {
            None => Err(self.syntax("EOF while parsing a value")),
            Some(b'"') => self.string(),
            Some(b'{') => self.nested(Kind::Object),
            Some(b'[') => self.nested(Kind::Array),
            Some(b't') => self.literal("true", Kind::True),
            Some(b'f') => self.literal("false", Kind::False),
            Some(b'n') => self.literal("null", Kind::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err(self.syntax("expected value")),
        }
    }

    /// An array or object, one nesting level down as serde_json counts levels: its node,
    /// then its children, then the node's count and `next` filled in.
    fn nested(&mut self, kind: Kind) -> Result<(), JsonError> {
        self.depth_left -= 1;
        if self.depth_left == 0 {
            return Err(self.syntax("recursion limit exceeded"));
        }
        let at = self.nodes.len();
        self.leaf(kind, 0, 0);
        let count = if kind == Kind::Array {
            self.array()?
        } else {
            self.object()?
        };
        self.depth_left += 1;
        let next = self.nodes.len();
        self.nodes[at] = Node::new(kind, count as usize, next);
        Ok(())
    }

    fn literal(&mut self, word: &str, kind: Kind) -> Result<(), JsonError> {
        if self.bytes[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            self.leaf(kind, 0, 0);
            Ok(())
        } else {
            Err(self.syntax("expected value"))
        }
    }

    /// The character after a value inside an array or object: `,` or `close`.
    /// Returns true at `close`.
    fn after_member(&mut self, close: u8, what: &'static str) -> Result<bool, JsonError> {
        self.skip_whitespace();
        match self.peek() {
            Some(b',') => {
                self.pos += 1;
                self.skip_whitespace();
                Ok(false)
            }
            Some(b) if b == close => {
                self.pos += 1;
                Ok(true)
            }
            None => Err(self.syntax("EOF while parsing a list or object")),
            Some(_) => Err(self.syntax(what)),
        }
    }

    /// Items after the `[`; returns how many.
    fn array(&mut self) -> Result<u32, JsonError> {
        self.pos += 1;
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(0);
        }
        let mut count = 0;
        loop {
            self.value()?;
            count += 1;
            if self.after_member(b']', "expected `,` or `]`")? {
                return Ok(count);
            }
        }
    }

    /// Members after the `{` (each a key node and a value node); returns how many.
    fn object(&mut self) -> Result<u32, JsonError> {
        self.pos += 1;
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(0);
        }
        let mut count = 0;
        loop {
            match self.peek() {
                Some(b'"') => {}
                None => return Err(self.syntax("EOF while parsing an object")),
                Some(_) => return Err(self.syntax("key must be a string")),
            }
            self.string()?;
            self.skip_whitespace();
            match self.peek() {
                Some(b':') => self.pos += 1,
                None => return Err(self.syntax("EOF while parsing an object")),
                Some(_) => return Err(self.syntax("expected `:`")),
            }
            self.skip_whitespace();
            self.value()?;
            count += 1;
            if self.after_member(b'}', "expected `,` or `}`")? {
                return Ok(count);
            }
        }
    }

    /// A string starting at the opening quote: a range of the body when it has no escape,
    /// otherwise unescaped by serde_json into the document's side list. Its bytes are
    /// checked as UTF-8 when they are not all ASCII.
    fn string(&mut self) -> Result<(), JsonError> {
        let open = self.pos;
        let mut i = open + 1;
        let mut escaped = false;
        let mut non_ascii = false;
        loop {
            let (at, high) = find_special(self.bytes, i);
            i = at;
            non_ascii |= high;
            match self.bytes.get(i) {
                Some(b'"') => break,
                Some(b'\\') => {
                    escaped = true;
                    // The escaped character cannot close the string; serde_json checks it.
                    i += 2;
                }
                Some(_) => {
                    self.pos = i;
                    return Err(self.syntax("control character while parsing a string"));
                }
                None => {
                    self.pos = self.bytes.len();
                    return Err(self.syntax("EOF while parsing a string"));
                }
            }
        }
        self.pos = i + 1;
        if !escaped {
            if non_ascii {
                std::str::from_utf8(&self.bytes[open + 1..i])
                    .map_err(|e| JsonError::Utf8(open + 1 + e.valid_up_to()))?;
            }
            self.leaf(Kind::String, open + 1, i);
            return Ok(());
        }
        // An escape can hide a byte from `find_special`'s ASCII check: check it all.
        let raw = std::str::from_utf8(&self.bytes[open..=i])
            .map_err(|e| JsonError::Utf8(open + e.valid_up_to()))?;
        let text = serde_json::from_str::<String>(raw).map_err(|e| token_error(e, open))?;
        self.unescaped.push(text);
        self.leaf(Kind::EscapedString, self.unescaped.len() - 1, 0);
        Ok(())
    }

    /// A number: the longest run of number characters, checked by serde_json. In a valid
    /// document a number is followed by whitespace, `,`, `]` or `}`, so the run is exactly
    /// the number; any other run is invalid both here and in serde_json.
    fn number(&mut self) -> Result<(), JsonError> {
        let start = self.pos;
        while let Some(b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') = self.peek() {
            self.pos += 1;
        }
        // Number characters are ASCII, so the run is a `&str`.
        let run = std::str::from_utf8(&self.bytes[start..self.pos]).unwrap_or_default();
        serde_json::from_str::<serde_json::Number>(run).map_err(|e| token_error(e, start))?;
        self.leaf(Kind::Number, start, self.pos);
        Ok(())
    }
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
