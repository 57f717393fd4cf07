//! The bad-input corpus: every case returns a typed error (a bypass reason) or a
//! fingerprint, never a panic. The same inputs seed the fuzz target (fuzz/corpus).

use cohort_fingerprint::{fingerprint, FingerprintError, IntentSketch, Request, SemanticMode};

fn outcome(body: &[u8]) -> Result<cohort_fingerprint::Fingerprint, FingerprintError> {
    fingerprint(&Request::new(body))
}

fn reason(body: &[u8]) -> &'static str {
    match outcome(body) {
        Ok(_) => "ok",
        Err(e) => e.bypass_reason(),
    }
}

fn chat(content: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "model": "m",
        "messages": [{"role": "user", "content": content}]
    }))
    .unwrap()
}

#[test]
fn invalid_utf8_is_invalid_json() {
    let mut body = br#"{"model":"m","messages":[{"role":"user","content":"caf"#.to_vec();
    body.extend_from_slice(&[0xC3, 0x28, 0xFF]);
    body.extend_from_slice(br#""}]}"#);
    assert_eq!(reason(&body), "invalid_json");
}

#[test]
fn malformed_and_truncated_json() {
    for body in [
        &br#"{"model":"m","messages":[{"role":"user","content":"hi"}"#[..],
        br#"{"model":"m",,"messages":[]}"#,
        br#"{model: 'm'}"#,
        b"",
        b"   ",
        b"{",
        br#"{"messages":[{"role":"user","content":"hi"}]} trailing"#,
    ] {
        assert_eq!(
            reason(body),
            "invalid_json",
            "{}",
            String::from_utf8_lossy(body)
        );
    }
}

#[test]
fn nesting_ten_thousand_deep_is_rejected_without_overflow() {
    let arrays = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    assert_eq!(reason(arrays.as_bytes()), "invalid_json");
    let objects = format!("{}1{}", r#"{"a":"#.repeat(10_000), "}".repeat(10_000));
    assert_eq!(reason(objects.as_bytes()), "invalid_json");
    let inside = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":{}"x"{}}}]}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    assert_eq!(reason(inside.as_bytes()), "invalid_json");
}

#[test]
fn a_ten_megabyte_body() {
    let body = chat(&"lorem ipsum dolor sit amet ".repeat(10 * 1024 * 1024 / 27 + 1));
    assert!(body.len() > 10_000_000);
    assert_eq!(reason(&body), "body_too_large");
    // With the limit raised it is fingerprinted, and the sketch reads a bounded window.
    let mut request = Request::new(&body);
    request.max_body_bytes = 16 * 1024 * 1024;
    let fp = fingerprint(&request).unwrap();
    assert_eq!(fp.prefix_blocks.len(), fp.prompt_bytes.div_ceil(256));
    assert!(!fp.intent.sketch.is_zero());
}

#[test]
fn empty_prompts() {
    assert_eq!(reason(br#"{"model":"m","messages":[]}"#), "empty_prompt");
    assert_eq!(reason(br#"{"model":"m","prompt":""}"#), "empty_prompt");
    assert_eq!(reason(br#"{"model":"m","prompt":[]}"#), "empty_prompt");
    assert_eq!(reason(br#"{"model":"m","input":[]}"#), "empty_prompt");
    assert_eq!(
        reason(br#"{"model":"m","messages":[{"role":"system","content":""}],"tools":[]}"#),
        "ok"
    );
    // An empty user message is still a turn: fingerprinted, with a zero sketch.
    let fp = outcome(&chat("")).unwrap();
    assert!(fp.intent.sketch.is_zero());
}

#[test]
fn emoji_only_is_sketched_from_the_emoji() {
    let fp = outcome(&chat("🔥🔥🚀 🙏")).unwrap();
    assert_eq!(fp.intent.masked_text(), "🔥 🔥 🚀 🙏");
    assert!(!fp.intent.sketch.is_zero());
    let flood = outcome(&chat(&"😀".repeat(100_000))).unwrap();
    assert!(!flood.intent.sketch.is_zero());
}

#[test]
fn zero_width_and_bidi_characters_do_not_change_the_sketch() {
    let plain = IntentSketch::of_text("cancel my order", SemanticMode::Intent);
    let hidden = IntentSketch::of_text(
        "can\u{200B}cel\u{200D} my\u{FEFF} \u{202E}order\u{2066}",
        SemanticMode::Intent,
    );
    assert_eq!(plain.sketch, hidden.sketch);
}

#[test]
fn nul_bytes() {
    // Escaped NULs are valid JSON text: fingerprinted, NUL treated as a separator.
    let fp = outcome(&chat("cancel\u{0}my\u{0}order")).unwrap();
    assert_eq!(fp.intent.masked_text(), "cancel my order");
    // A raw NUL byte inside a JSON string is not valid JSON.
    assert_eq!(
        reason(b"{\"model\":\"m\",\"prompt\":\"a\0b\"}"),
        "invalid_json"
    );
    assert_eq!(reason(b"\0\0\0\0"), "invalid_json");
}

#[test]
fn unknown_shapes() {
    for body in [
        &br#"{"model":"text-embedding-3-small","input_ids":[1,2]}"#[..],
        br#"[{"role":"user","content":"hi"}]"#,
        b"42",
        b"null",
        br#""just a string""#,
        br#"{}"#,
    ] {
        assert_eq!(
            reason(body),
            "unknown_shape",
            "{}",
            String::from_utf8_lossy(body)
        );
    }
}

#[test]
fn wrong_field_types_are_malformed() {
    for body in [
        &br#"{"model":"m","messages":"hello"}"#[..],
        br#"{"model":"m","messages":["hello"]}"#,
        br#"{"model":"m","messages":[{"role":"user","content":42}]}"#,
        br#"{"model":7,"messages":[{"role":"user","content":"hi"}]}"#,
        br#"{"model":"m","prompt":{"text":"x"}}"#,
        br#"{"model":"m","prompt":[1,-2,3]}"#,
        br#"{"model":"m","prompt":[[1],[99999999999]]}"#,
        br#"{"model":"m","input":[7]}"#,
        br#"{"model":"m","instructions":["x"],"input":"y"}"#,
        br#"{"model":"m","system":42,"messages":[{"role":"user","content":"hi"}]}"#,
    ] {
        assert_eq!(
            reason(body),
            "malformed_request",
            "{}",
            String::from_utf8_lossy(body)
        );
    }
}

#[test]
fn huge_arrays_and_single_tokens() {
    let ids: Vec<String> = (0..100_000).map(|i| i.to_string()).collect();
    let tokens = format!(r#"{{"model":"m","prompt":[{}]}}"#, ids.join(","));
    assert_eq!(reason(tokens.as_bytes()), "ok");
    let parts: Vec<String> = (0..100_000)
        .map(|_| r#"{"type":"text","text":"a"}"#.to_owned())
        .collect();
    let many = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":[{}]}}]}}"#,
        parts.join(",")
    );
    assert_eq!(reason(many.as_bytes()), "ok");
    let one_token = chat(&"x".repeat(1024 * 1024));
    let fp = outcome(&one_token).unwrap();
    assert!(fp.intent.masked_text().len() <= 2 * cohort_fingerprint::normalize::HALF_WINDOW + 2);
}
