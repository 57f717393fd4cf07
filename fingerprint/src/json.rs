//! A JSON document as one flat array of nodes (a *tape*): what the API parsers walk.
//!
//! Request bodies are mostly many small message objects holding long plain strings. A tree
//! of owned values (`serde_json::Value`, or the borrowed tree this module held before) pays
//! for every node: an allocation per object, a free per object, and a value of 32 bytes or
//! more moved through each return; on a 32 KB chat body that was most of the fingerprint's
//! cost. Here the parser ([`parse`](mod@parse)) appends one 8-byte [`Node`] per value to a
//! single vector, strings stay where they are in the body (only a string with an escape is
//! unescaped, once, into the document's side list), and the walkers read it through
//! [`Value`], a small `Copy` view that looks like a JSON value: `Value::String(&str)`,
//! `Value::Array(Array)` and so on. Containers are handles ([`Array`], [`Object`]) that
//! iterate their children in place.
//!
//! Object members stay in input order with duplicates kept; a lookup takes the last
//! duplicate, as `serde_json::Value` does. [`Value::write_canonical`] writes compact JSON
//! with object keys sorted and duplicates resolved: the same bytes whatever key order or
//! whitespace the client used.

// One `from_utf8_unchecked`, in `Document::raw`: the ranges the parser records are on
// character boundaries of a text it checked, and the walk reads them many times.
#![allow(unsafe_code)]

mod parse;

pub use parse::JsonError;
use std::fmt;

/// Parses a whole document (trailing non-whitespace is an error): what serde_json
/// accepts, with the same values ([`parse`](mod@parse) says how).
///
/// A body that is not UTF-8 is invalid JSON (RFC 8259 §8.1); the parser checks it as it
/// goes, only where a byte of 0x80 or over can be.
pub fn parse(bytes: &[u8]) -> Result<Document<'_>, JsonError> {
    parse::document(bytes)
}

/// A parsed document: the body's text, its nodes in document order, and the unescaped
/// text of the strings that had escapes.
#[derive(Debug, Clone)]
pub struct Document<'a> {
    text: &'a str,
    nodes: Vec<Node>,
    unescaped: Vec<String>,
}

/// One value of the document, in 8 bytes. A container's children follow it directly (an
/// object's as key, value, key, value…), and its `next` is the index just past its last
/// descendant, so siblings are found by jumping from `next` to `next`; a leaf's `next` is
/// the index after it. The tape of a chat body is about half the body's size: it is
/// written once and read a few times, so its size is memory traffic on every request.
#[derive(Debug, Clone, Copy)]
struct Node {
    /// The kind in the low 3 bits; above them `a`: for a string or number the start of
    /// its raw text in the body (an escaped string: its index in `unescaped`), for an
    /// array or object the number of children (members for an object).
    head: u32,
    /// String and number: the end of the raw text. Array and object: `next`.
    tail: u32,
}

/// The largest `a` a node holds: bodies up to 512 MiB (the filter's limit is 64 MiB).
const A_LIMIT: usize = 1 << 29;

impl Node {
    fn new(kind: Kind, a: usize, tail: usize) -> Node {
        debug_assert!(a < A_LIMIT);
        Node {
            head: (a as u32) << 3 | kind as u32,
            tail: tail as u32,
        }
    }

    #[inline]
    fn kind(self) -> Kind {
        match self.head & 7 {
            0 => Kind::Null,
            1 => Kind::False,
            2 => Kind::True,
            3 => Kind::Number,
            4 => Kind::String,
            5 => Kind::EscapedString,
            6 => Kind::Array,
            _ => Kind::Object,
        }
    }

    #[inline]
    fn a(self) -> usize {
        (self.head >> 3) as usize
    }

    /// The index after this node's subtree, for the node at `at`.
    #[inline]
    fn next(self, at: u32) -> u32 {
        if self.head & 6 == 6 {
            self.tail
        } else {
            at + 1
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Null = 0,
    False = 1,
    True = 2,
    Number = 3,
    String = 4,
    EscapedString = 5,
    Array = 6,
    Object = 7,
}

impl<'a> Document<'a> {
    /// The top-level value.
    pub fn root(&self) -> Value<'_> {
        self.value(0)
    }

    #[inline(always)]
    fn value(&self, at: u32) -> Value<'_> {
        let node = self.nodes[at as usize];
        match node.kind() {
            Kind::Null => Value::Null,
            Kind::False => Value::Bool(false),
            Kind::True => Value::Bool(true),
            Kind::Number => Value::Number(Number(self.raw(node))),
            Kind::String => Value::String(self.raw(node)),
            Kind::EscapedString => Value::String(&self.unescaped[node.a()]),
            Kind::Array => Value::Array(Array { doc: self, at }),
            Kind::Object => Value::Object(Object { doc: self, at }),
        }
    }

    /// The raw text of a string or number node: a range of the body that the parser
    /// found between ASCII delimiters (a string's quotes, a number's ASCII run).
    #[inline(always)]
    fn raw(&self, node: Node) -> &str {
        let bytes = &self.text.as_bytes()[node.a()..node.tail as usize];
        // SAFETY: `text` is valid UTF-8 and the range starts and ends next to ASCII bytes
        // (or at the text's ends), so it starts and ends on character boundaries. Slicing
        // the `&str` would check those boundaries again on every field read of the walk.
        unsafe { std::str::from_utf8_unchecked(bytes) }
    }

    /// Indices of the keys of the object at `at` (each value follows its key).
    fn keys(&self, at: u32) -> impl Iterator<Item = u32> + '_ {
        let end = self.nodes[at as usize].tail;
        let mut i = at + 1;
        std::iter::from_fn(move || {
            (i < end).then(|| {
                let key = i;
                i = self.nodes[i as usize + 1].next(i + 1);
                key
            })
        })
    }

    /// The text of a key node (the parser writes only strings there).
    fn key_text(&self, at: u32) -> &str {
        self.value(at).as_str().unwrap_or_default()
    }

    /// Whether the key node at `at` is `key`: the hot comparison of every lookup, done on
    /// the raw bytes (a key with an escape is compared unescaped).
    #[inline]
    fn key_is(&self, at: u32, key: &str) -> bool {
        let node = self.nodes[at as usize];
        match node.kind() {
            Kind::String => {
                let (start, end) = (node.a(), node.tail as usize);
                end - start == key.len() && bytes_at(self.text.as_bytes(), start, key.as_bytes())
            }
            _ => self.key_text(at) == key,
        }
    }
}

/// Whether `text` holds `key` at `start`. A key of up to eight bytes is compared as one
/// word read from the body (masked to its length), with the key's word folded at compile
/// time where the key is a literal: the slice comparison calls `memcmp`, a byte loop out
/// of line in wasm, and lookups make one per member of every message.
#[inline(always)]
fn bytes_at(text: &[u8], start: usize, key: &[u8]) -> bool {
    let n = key.len();
    if (1..=8).contains(&n) {
        if let Some(chunk) = text.get(start..start + 8) {
            let word = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
            let mut want = 0u64;
            for (i, &byte) in key.iter().enumerate() {
                want |= u64::from(byte) << (8 * i);
            }
            return word & (u64::MAX >> (64 - 8 * n)) == want;
        }
    }
    text.get(start..start + n) == Some(key)
}

/// A view of one JSON value; strings borrow from the body (or the document).
#[derive(Debug, Clone, Copy)]
pub enum Value<'d> {
    Null,
    Bool(bool),
    Number(Number<'d>),
    String(&'d str),
    Array(Array<'d>),
    Object(Object<'d>),
}

/// A JSON number, kept as its text; valued (by serde_json, as when it was checked) on use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Number<'d>(&'d str);

impl Number<'_> {
    fn value(self) -> Option<serde_json::Number> {
        serde_json::from_str(self.0).ok()
    }

    pub fn as_u64(self) -> Option<u64> {
        self.value()?.as_u64()
    }
}

/// An array's items, in order.
#[derive(Clone, Copy)]
pub struct Array<'d> {
    doc: &'d Document<'d>,
    at: u32,
}

impl<'d> Array<'d> {
    pub fn len(self) -> usize {
        self.doc.nodes[self.at as usize].a()
    }

    pub fn is_empty(self) -> bool {
        self.len() == 0
    }

    pub fn iter(self) -> Items<'d> {
        Items {
            doc: self.doc,
            next: self.at + 1,
            end: self.doc.nodes[self.at as usize].tail,
        }
    }
}

impl<'d> IntoIterator for Array<'d> {
    type Item = Value<'d>;
    type IntoIter = Items<'d>;

    fn into_iter(self) -> Items<'d> {
        self.iter()
    }
}

/// An array's items: each item's node, then a jump past its descendants to the next.
pub struct Items<'d> {
    doc: &'d Document<'d>,
    next: u32,
    end: u32,
}

impl<'d> Iterator for Items<'d> {
    type Item = Value<'d>;

    #[inline]
    fn next(&mut self) -> Option<Value<'d>> {
        if self.next >= self.end {
            return None;
        }
        let at = self.next;
        self.next = self.doc.nodes[at as usize].next(at);
        Some(self.doc.value(at))
    }
}

impl fmt::Debug for Array<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// An object's members, in input order (duplicates kept; lookups take the last).
#[derive(Clone, Copy)]
pub struct Object<'d> {
    doc: &'d Document<'d>,
    at: u32,
}

impl<'d> Object<'d> {
    /// Members as (key, value), in input order.
    pub fn members(self) -> impl Iterator<Item = (&'d str, Value<'d>)> + 'd {
        let doc = self.doc;
        doc.keys(self.at)
            .map(move |key| (doc.key_text(key), doc.value(key + 1)))
    }

    pub fn get(self, key: &str) -> Option<Value<'d>> {
        let doc = self.doc;
        // The index of the last match's value (0, the root, is never a member's value).
        let mut found = 0;
        for at in doc.keys(self.at) {
            if doc.key_is(at, key) {
                found = at + 1;
            }
        }
        (found != 0).then(|| doc.value(found))
    }

    /// The values of several `keys` in one pass over the members (the last duplicate
    /// wins): for walkers that read many fields of each of many objects. The values are
    /// made when read ([`Picked`]): a walker usually reads two or three of them.
    pub fn pick<const N: usize>(self, keys: [&str; N]) -> Picked<'d, N> {
        let doc = self.doc;
        let mut at = [0; N];
        for key in doc.keys(self.at) {
            if let Some(slot) = keys.iter().position(|name| doc.key_is(key, name)) {
                at[slot] = key + 1;
            }
        }
        Picked { doc, at }
    }

    pub fn contains_key(self, key: &str) -> bool {
        let doc = self.doc;
        doc.keys(self.at).any(|at| doc.key_is(at, key))
    }

    /// Members sorted by key, the last of duplicates kept.
    fn canonical_members(self) -> Vec<(&'d str, Value<'d>)> {
        let mut members: Vec<_> = self.members().enumerate().collect();
        // Sort by key, later duplicates first, then keep the first of each key.
        members.sort_by(|(i, (a, _)), (j, (b, _))| a.cmp(b).then(j.cmp(i)));
        members.dedup_by(|(_, (a, _)), (_, (b, _))| a == b);
        members.into_iter().map(|(_, member)| member).collect()
    }
}

/// What [`Object::pick`] found: the value of each key asked for, by the key's position.
#[derive(Clone, Copy)]
pub struct Picked<'d, const N: usize> {
    doc: &'d Document<'d>,
    /// The value's node for each key; 0 (the root, never a member) when absent.
    at: [u32; N],
}

impl<'d, const N: usize> Picked<'d, N> {
    /// The value of the `i`th key, if the object has it.
    #[inline]
    pub fn get(&self, i: usize) -> Option<Value<'d>> {
        let at = self.at[i];
        (at != 0).then(|| self.doc.value(at))
    }

    /// The `i`th key's value when it is a string.
    #[inline]
    pub fn str(&self, i: usize) -> Option<&'d str> {
        self.get(i).and_then(Value::as_str)
    }
}

impl fmt::Debug for Object<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.members()).finish()
    }
}

impl<'d> Value<'d> {
    pub fn get(self, key: &str) -> Option<Value<'d>> {
        match self {
            Value::Object(object) => object.get(key),
            _ => None,
        }
    }

    pub fn as_str(self) -> Option<&'d str> {
        match self {
            Value::String(text) => Some(text),
            _ => None,
        }
    }

    pub fn as_array(self) -> Option<Array<'d>> {
        match self {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }

    pub fn as_object(self) -> Option<Object<'d>> {
        match self {
            Value::Object(object) => Some(object),
            _ => None,
        }
    }

    pub fn as_u64(self) -> Option<u64> {
        match self {
            Value::Number(number) => number.as_u64(),
            _ => None,
        }
    }

    pub fn is_number(self) -> bool {
        matches!(self, Value::Number(_))
    }

    pub fn is_object(self) -> bool {
        matches!(self, Value::Object(_))
    }

    pub fn is_null(self) -> bool {
        matches!(self, Value::Null)
    }

    /// JSON type name, for error messages.
    pub fn kind(self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "an array",
            Value::Object(_) => "an object",
        }
    }

    /// Compact JSON with sorted keys.
    pub fn write_canonical(self, out: &mut Vec<u8>) {
        self.write_canonical_without(None, out);
    }

    /// Like [`Value::write_canonical`], leaving out member `skip` of this object or of each
    /// object directly in this array (e.g. `cache_control` marks).
    pub fn write_canonical_without(self, skip: Option<&str>, out: &mut Vec<u8>) {
        match self {
            Value::Object(object) => write_object(object, skip, out),
            Value::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    match item {
                        Value::Object(object) => write_object(object, skip, out),
                        other => other.write_canonical(out),
                    }
                }
                out.push(b']');
            }
            Value::Null => out.extend_from_slice(b"null"),
            Value::Bool(true) => out.extend_from_slice(b"true"),
            Value::Bool(false) => out.extend_from_slice(b"false"),
            // The parser checked every number with serde_json, so `value` is `Some`.
            Value::Number(number) => match number.value() {
                Some(value) => out.extend_from_slice(value.to_string().as_bytes()),
                None => out.extend_from_slice(number.0.as_bytes()),
            },
            Value::String(text) => write_string(text, out),
        }
    }
}

impl fmt::Display for Value<'_> {
    /// Canonical JSON.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = Vec::new();
        self.write_canonical(&mut out);
        f.write_str(&String::from_utf8_lossy(&out))
    }
}

fn write_object(object: Object<'_>, skip: Option<&str>, out: &mut Vec<u8>) {
    out.push(b'{');
    let mut first = true;
    for (key, value) in object.canonical_members() {
        if Some(key) == skip {
            continue;
        }
        if !first {
            out.push(b',');
        }
        first = false;
        write_string(key, out);
        out.push(b':');
        value.write_canonical(out);
    }
    out.push(b'}');
}

fn write_string(text: &str, out: &mut Vec<u8>) {
    // Serialising a &str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, text);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical(text: &str) -> String {
        let mut out = Vec::new();
        parse(text.as_bytes())
            .unwrap()
            .root()
            .write_canonical(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn canonical_json_sorts_keys_and_matches_serde_json() {
        for text in [
            r#"{"b": 1, "a": [true, null, 2.5, -3, "x\"y\n"], "c": {"z": {}, "y": []}}"#,
            r#"[1e300, 0.1, 18446744073709551615, -9223372036854775808, "é\u0000😀"]"#,
            r#""plain""#,
        ] {
            let serde: serde_json::Value = serde_json::from_str(text).unwrap();
            assert_eq!(canonical(text), serde.to_string(), "{text}");
        }
    }

    #[test]
    fn the_last_duplicate_key_wins() {
        let document = parse(br#"{"a": 1, "b": 2, "a": 3}"#).unwrap();
        assert_eq!(document.root().get("a").and_then(Value::as_u64), Some(3));
        assert_eq!(canonical(r#"{"a": 1, "b": 2, "a": 3}"#), r#"{"a":3,"b":2}"#);
    }

    #[test]
    fn strings_without_escapes_stay_in_the_body() {
        let body = br#"{"plain": "abc", "escaped": "a\nb"}"#;
        let document = parse(body).unwrap();
        let plain = document
            .root()
            .get("plain")
            .and_then(Value::as_str)
            .unwrap();
        assert_eq!(plain, "abc");
        assert!(body.as_ptr_range().contains(&plain.as_ptr()));
        assert_eq!(document.unescaped, ["a\nb"]);
        let escaped = document.root().get("escaped").and_then(Value::as_str);
        assert_eq!(escaped, Some("a\nb"));
    }

    proptest::proptest! {
        #[test]
        fn bytes_at_is_a_slice_comparison(
            text in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..24),
            start in 0usize..24,
            key in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..12),
        ) {
            let expected = text.get(start..start + key.len()) == Some(&key[..]);
            proptest::prop_assert_eq!(bytes_at(&text, start, &key), expected);
        }
    }

    #[test]
    fn containers_are_walked_in_place() {
        let document =
            parse(br#"{"m": [{"r": "u", "c": [1, [2, {}], "x"]}, null, []], "t": true}"#).unwrap();
        let root = document.root().as_object().unwrap();
        let keys: Vec<_> = root.members().map(|(key, _)| key).collect();
        assert_eq!(keys, ["m", "t"]);
        let items = root.get("m").and_then(Value::as_array).unwrap();
        assert_eq!(items.len(), 3);
        let kinds: Vec<_> = items.iter().map(Value::kind).collect();
        assert_eq!(kinds, ["an object", "null", "an array"]);
        let first = items.iter().next().unwrap();
        let inner = first.get("c").and_then(Value::as_array).unwrap();
        assert_eq!(inner.len(), 3);
        assert_eq!(inner.iter().last().and_then(Value::as_str), Some("x"));
        assert!(matches!(root.get("t"), Some(Value::Bool(true))));
        assert_eq!(root.get("missing").map(Value::kind), None);
        let dup = parse(br#"{"a": 1, "b": "x", "a": 3}"#).unwrap();
        let picked = dup.root().as_object().unwrap().pick(["a", "b", "c"]);
        assert_eq!(
            (picked.get(0).and_then(Value::as_u64), picked.str(1)),
            (Some(3), Some("x"))
        );
        assert!(picked.get(2).is_none());
    }

    #[test]
    fn skipping_a_member() {
        let document = parse(br#"[{"a": 1, "cache_control": {}}, {"cache_control": 2}]"#).unwrap();
        let mut out = Vec::new();
        document
            .root()
            .write_canonical_without(Some("cache_control"), &mut out);
        assert_eq!(out, br#"[{"a":1},{}]"#);
    }

    #[test]
    fn bad_input_is_an_error() {
        assert!(parse(b"{").is_err());
        assert!(parse(b"[1] x").is_err());
        assert!(parse(b"\"\xff\"").is_err());
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(parse(deep.as_bytes()).is_err());
        // Invalid UTF-8 outside a string, and after an otherwise complete document.
        assert!(parse(b"{\"a\": 1, \xc3}").is_err());
        assert!(parse(b"{} \xe2\x82").is_err());
    }

    /// JSON-ish bytes: fragments of valid documents, escapes, multi-byte and invalid UTF-8.
    fn jsonish() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let fragment = prop_oneof![
            Just(b"{".to_vec()),
            Just(b"}".to_vec()),
            Just(b"[".to_vec()),
            Just(b"]".to_vec()),
            Just(b",".to_vec()),
            Just(b":".to_vec()),
            Just(b"\"".to_vec()),
            Just(b"\"role\"".to_vec()),
            Just(b"\"content\": \"hi\"".to_vec()),
            Just(br#"\u00e9\ud83d\ude00"#.to_vec()),
            Just(b"\\".to_vec()),
            Just(b"\\u".to_vec()),
            Just(b"12.5e3".to_vec()),
            Just(b"-0".to_vec()),
            Just(b"true null ".to_vec()),
            Just("é😀".as_bytes().to_vec()),
            Just(b"\xc3".to_vec()),
            Just(b"\xed\xa0\x80".to_vec()),
            Just(b"\xff".to_vec()),
            Just(b"\x00\n\t".to_vec()),
            proptest::collection::vec(any::<u8>(), 0..4),
        ];
        let broken = proptest::collection::vec(fragment, 0..24).prop_map(|parts| parts.concat());
        // Whole chat bodies around adversarial text (valid, escapes and all), some cut short.
        let body = (crate::test_text::any_text(), any::<u16>()).prop_map(|(text, cut)| {
            let body = serde_json::json!({"messages": [{"role": "user", "content": text}]});
            let bytes = serde_json::to_vec(&body).unwrap();
            let keep = if cut % 4 == 0 {
                cut as usize % (bytes.len() + 1)
            } else {
                bytes.len()
            };
            bytes[..keep].to_vec()
        });
        prop_oneof![broken, body]
    }

    /// Any JSON document (numbers of every range, escapes, nesting), compact or pretty.
    fn json_document() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let number = prop_oneof![
            any::<u64>().prop_map(|n| n.to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| f.to_string()),
            Just("1e400".to_string()),
            Just("-0".to_string()),
            Just("18446744073709551616".to_string()),
            Just("1.5E+3".to_string()),
            Just("0.000001e-7".to_string()),
        ];
        let leaf = prop_oneof![
            Just("null".to_string()),
            Just("true".to_string()),
            Just("false".to_string()),
            number,
            crate::test_text::any_text().prop_map(|t| serde_json::to_string(&t).unwrap()),
            Just(r#""\ud83d\ude00 \u00e9 \/ \b\f""#.to_string()),
            Just(r#""\ud800""#.to_string()),
        ];
        let value = leaf.prop_recursive(6, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6)
                    .prop_map(|items| format!("[{}]", items.join(","))),
                proptest::collection::vec(("[a-c]{0,2}", inner), 0..6).prop_map(|members| {
                    let members: Vec<_> = members
                        .into_iter()
                        .map(|(key, value)| {
                            format!("{}:{value}", serde_json::to_string(&key).unwrap())
                        })
                        .collect();
                    format!("{{{}}}", members.join(","))
                }),
            ]
        });
        (value, any::<bool>()).prop_map(|(text, pretty)| {
            let text = if pretty {
                text.replace(',', " ,\n\t")
                    .replace(':', " : ")
                    .replace('[', "[\r\n ")
            } else {
                text
            };
            text.into_bytes()
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 4096, ..Default::default() })]

        /// Checking UTF-8 only inside strings (the grammar admits only ASCII outside)
        /// accepts and rejects exactly what serde_json does on the bytes, with the same
        /// values.
        #[test]
        fn parse_agrees_with_serde_json_on_bytes(bytes in jsonish()) {
            let ours = parse(&bytes);
            let theirs = serde_json::from_slice::<serde_json::Value>(&bytes);
            proptest::prop_assert_eq!(ours.is_ok(), theirs.is_ok());
            if let (Ok(ours), Ok(theirs)) = (ours, theirs) {
                let mut out = Vec::new();
                ours.root().write_canonical(&mut out);
                proptest::prop_assert_eq!(String::from_utf8(out).unwrap(), theirs.to_string());
            }
        }

        /// Whole documents of every shape, written compact or pretty and sometimes with one
        /// byte changed, removed or added: the same verdict and values as serde_json.
        #[test]
        fn parse_agrees_with_serde_json_on_documents(
            (bytes, edit) in (json_document(), (proptest::prelude::any::<u16>(), 0u8..4, proptest::prelude::any::<u8>())),
        ) {
            let mut bytes = bytes;
            let (at, how, byte) = edit;
            let at = at as usize % (bytes.len() + 1);
            match how {
                1 if at < bytes.len() => bytes[at] = byte,
                2 if at < bytes.len() => { bytes.remove(at); }
                3 => bytes.insert(at, byte),
                _ => {}
            }
            let ours = parse(&bytes);
            let theirs = serde_json::from_slice::<serde_json::Value>(&bytes);
            proptest::prop_assert_eq!(ours.is_ok(), theirs.is_ok(), "{}", String::from_utf8_lossy(&bytes));
            if let (Ok(ours), Ok(theirs)) = (ours, theirs) {
                let mut out = Vec::new();
                ours.root().write_canonical(&mut out);
                proptest::prop_assert_eq!(String::from_utf8(out).unwrap(), theirs.to_string());
            }
        }
    }
}
