//! A borrowed JSON tree: what the API parsers walk.
//!
//! `serde_json::Value` copies every string and builds a sorted map per object; for request
//! bodies (mostly strings, many small message objects) that allocation dominated the
//! fingerprint's cost. This tree borrows strings from the body when they contain no
//! escapes and keeps object members in order in a `Vec` (objects here are small, and a
//! lookup scans from the end so the last duplicate key wins, as in `serde_json::Value`).
//! Parsing goes through serde_json's deserializer: the same grammar, UTF-8 validation and
//! 128-level nesting limit.
//!
//! [`Value::write_canonical`] writes compact JSON with object keys sorted and duplicates
//! resolved: the same bytes whatever key order or whitespace the client used.

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
use std::fmt;

/// A JSON value borrowing its strings from the input where it can.
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(Cow<'a, str>),
    Array(Vec<Value<'a>>),
    Object(Object<'a>),
}

/// Object members in input order (duplicates kept; lookups take the last).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Object<'a>(pub Vec<(Cow<'a, str>, Value<'a>)>);

impl<'a> Object<'a> {
    pub fn get(&self, key: &str) -> Option<&Value<'a>> {
        self.0.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Members sorted by key, the last of duplicates kept.
    fn canonical_members(&self) -> Vec<&(Cow<'a, str>, Value<'a>)> {
        let mut members: Vec<_> = self.0.iter().enumerate().collect();
        // Sort by key, later duplicates first, then keep the first of each key.
        members.sort_by(|(i, (a, _)), (j, (b, _))| a.cmp(b).then(j.cmp(i)));
        members.dedup_by(|(_, (a, _)), (_, (b, _))| a == b);
        members.into_iter().map(|(_, member)| member).collect()
    }
}

/// Parses a whole document (trailing non-whitespace is an error).
///
/// The body is checked as UTF-8 once, as a whole, and then parsed as a `&str`: parsing
/// bytes, serde_json validates each string on its own, which for a body of many short
/// messages cost more than the whole-body check (a word at a time over ASCII). A body that
/// is not UTF-8 is invalid JSON either way (RFC 8259 §8.1).
pub fn parse(bytes: &[u8]) -> Result<Value<'_>, serde_json::Error> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        <serde_json::Error as serde::de::Error>::custom(format!(
            "invalid UTF-8 at byte {}",
            e.valid_up_to()
        ))
    })?;
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let value = Value::deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(value)
}

impl<'a> Value<'a> {
    pub fn get(&self, key: &str) -> Option<&Value<'a>> {
        match self {
            Value::Object(object) => object.get(key),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(text) => Some(text),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value<'a>]> {
        match self {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }

    pub fn as_object(&self) -> Option<&Object<'a>> {
        match self {
            Value::Object(object) => Some(object),
            _ => None,
        }
    }

    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Number(number) => number.as_u64(),
            _ => None,
        }
    }

    pub fn is_number(&self) -> bool {
        matches!(self, Value::Number(_))
    }

    pub fn is_object(&self) -> bool {
        matches!(self, Value::Object(_))
    }

    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// JSON type name, for error messages.
    pub fn kind(&self) -> &'static str {
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
    pub fn write_canonical(&self, out: &mut Vec<u8>) {
        self.write_canonical_without(None, out);
    }

    /// Like [`Value::write_canonical`], leaving out member `skip` of this object or of each
    /// object directly in this array (e.g. `cache_control` marks).
    pub fn write_canonical_without(&self, skip: Option<&str>, out: &mut Vec<u8>) {
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
            Value::Number(number) => out.extend_from_slice(number.to_string().as_bytes()),
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

fn write_object(object: &Object<'_>, skip: Option<&str>, out: &mut Vec<u8>) {
    out.push(b'{');
    let mut first = true;
    for (key, value) in object.canonical_members() {
        if Some(key.as_ref()) == skip {
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

impl<'de> Deserialize<'de> for Value<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<Value<'de>, E> {
        Ok(Value::Null)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value<'de>, E> {
        Ok(Value::Bool(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value<'de>, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value<'de>, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value<'de>, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Value<'de>, E> {
        Ok(Value::String(Cow::Borrowed(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value<'de>, E> {
        Ok(Value::String(Cow::Owned(v.to_owned())))
    }

    fn visit_string<E>(self, v: String) -> Result<Value<'de>, E> {
        Ok(Value::String(Cow::Owned(v)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value<'de>, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value<'de>, A::Error> {
        let mut members = Vec::new();
        while let Some((key, value)) = map.next_entry::<Key<'de>, Value<'de>>()? {
            members.push((key.0, value));
        }
        Ok(Value::Object(Object(members)))
    }
}

/// An object key, borrowed when it has no escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical(text: &str) -> String {
        let mut out = Vec::new();
        parse(text.as_bytes()).unwrap().write_canonical(&mut out);
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
        let value = parse(br#"{"a": 1, "b": 2, "a": 3}"#).unwrap();
        assert_eq!(value.get("a").and_then(Value::as_u64), Some(3));
        assert_eq!(canonical(r#"{"a": 1, "b": 2, "a": 3}"#), r#"{"a":3,"b":2}"#);
    }

    #[test]
    fn strings_without_escapes_are_borrowed() {
        let value = parse(br#"{"plain": "abc", "escaped": "a\nb"}"#).unwrap();
        assert!(matches!(
            value.get("plain"),
            Some(Value::String(Cow::Borrowed("abc")))
        ));
        assert!(matches!(value.get("escaped"), Some(Value::String(Cow::Owned(s))) if s == "a\nb"));
    }

    #[test]
    fn skipping_a_member() {
        let value = parse(br#"[{"a": 1, "cache_control": {}}, {"cache_control": 2}]"#).unwrap();
        let mut out = Vec::new();
        value.write_canonical_without(Some("cache_control"), &mut out);
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

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 4096, ..Default::default() })]

        /// Checking UTF-8 over the whole body first (then parsing a `&str`) accepts and
        /// rejects exactly what serde_json does on the bytes, with the same values.
        #[test]
        fn parse_agrees_with_serde_json_on_bytes(bytes in jsonish()) {
            let ours = parse(&bytes);
            let theirs = serde_json::from_slice::<serde_json::Value>(&bytes);
            proptest::prop_assert_eq!(ours.is_ok(), theirs.is_ok());
            if let (Ok(ours), Ok(theirs)) = (ours, theirs) {
                let mut out = Vec::new();
                ours.write_canonical(&mut out);
                proptest::prop_assert_eq!(String::from_utf8(out).unwrap(), theirs.to_string());
            }
        }
    }
}
