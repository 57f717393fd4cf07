//! Property tests: arbitrary bytes never panic; arbitrary valid bodies always fingerprint,
//! deterministically, with the invariants the rest of Cohort relies on.

use cohort_fingerprint::knobs::policy::{KnobPolicy, RouteOf};
use cohort_fingerprint::knobs::{RawKnobs, BATCH_THRESHOLD_RANGE, CACHE_TTL_RANGE_S};
use cohort_fingerprint::normalize::normalize;
use cohort_fingerprint::prefix::{common_prefix_blocks, BLOCK_BYTES};
use cohort_fingerprint::record::{fingerprint_line, LineDefaults};
use cohort_fingerprint::{fingerprint, IntentSketch, Request, SemanticMode};
use proptest::prelude::*;
use serde_json::{json, Value};

fn message() -> impl Strategy<Value = Value> {
    let role = prop::sample::select(vec!["user", "assistant", "tool", "system", "weird"]);
    let text = any::<String>();
    let content = prop_oneof![
        text.prop_map(Value::from),
        prop::collection::vec(text, 0..3).prop_map(|parts| {
            Value::Array(
                parts
                    .into_iter()
                    .map(|t| json!({"type": "text", "text": t}))
                    .collect(),
            )
        }),
        Just(Value::Null),
    ];
    (role, content).prop_map(|(role, content)| json!({"role": role, "content": content}))
}

fn chat_body() -> impl Strategy<Value = Value> {
    (
        any::<String>(),
        prop::option::of(any::<String>()),
        prop::collection::vec(message(), 1..6),
        prop::option::of(any::<String>()),
    )
        .prop_map(|(model, system, mut messages, tool)| {
            if let Some(system) = system {
                messages.insert(0, json!({"role": "system", "content": system}));
            }
            let mut body = json!({"model": model, "messages": messages});
            if let Some(tool) = tool {
                body["tools"] = json!([{"type": "function", "function": {"name": tool}}]);
            }
            body
        })
}

fn mode() -> impl Strategy<Value = SemanticMode> {
    prop::sample::select(vec![
        SemanticMode::Intent,
        SemanticMode::Topic,
        SemanticMode::Hybrid,
    ])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let _ = fingerprint(&Request::new(&bytes));
        let _ = fingerprint_line(&bytes, 1, &LineDefaults::default());
    }

    #[test]
    fn arbitrary_json_values_never_panic(value in any::<String>().prop_map(|s| json!({"messages": [{"role": "user", "content": s}], "prompt": s}))) {
        let bytes = serde_json::to_vec(&value).unwrap();
        let _ = fingerprint(&Request::new(&bytes));
    }

    #[test]
    fn valid_chat_bodies_fingerprint_deterministically(body in chat_body(), mode in mode()) {
        let bytes = serde_json::to_vec(&body).unwrap();
        let mut request = Request::new(&bytes);
        request.semantic_mode = mode;
        let a = fingerprint(&request).expect("a valid chat body fingerprints");
        let b = fingerprint(&request).unwrap();
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(a.prefix_blocks.len(), a.prompt_bytes.div_ceil(BLOCK_BYTES));
        let peak = a.intent.sketch.0.iter().map(|v| v.unsigned_abs()).max().unwrap();
        prop_assert!(peak == 127 || a.intent.sketch.is_zero());
    }

    #[test]
    fn appending_a_turn_keeps_full_blocks(body in chat_body(), text in any::<String>()) {
        // A user turn: a system message after only system messages would extend the system prompt.
        let extra = json!({"role": "user", "content": text});
        let before = fingerprint(&Request::new(&serde_json::to_vec(&body).unwrap())).unwrap();
        let mut longer = body.clone();
        longer["messages"].as_array_mut().unwrap().push(extra);
        let after = fingerprint(&Request::new(&serde_json::to_vec(&longer).unwrap())).unwrap();
        prop_assert!(common_prefix_blocks(&before.prefix_blocks, &after.prefix_blocks) >= before.prompt_bytes / BLOCK_BYTES);
        prop_assert_eq!(before.stable_prefix, after.stable_prefix);
    }

    #[test]
    fn any_text_sketches(text in any::<String>(), mode in mode()) {
        let sketch = IntentSketch::of_text(&text, mode);
        let similarity = sketch.sketch.similarity(&sketch.sketch);
        prop_assert!(sketch.sketch.is_zero() || (similarity - 1.0).abs() < 1e-6);
    }

    #[test]
    fn normalisation_is_idempotent(text in ".{0,300}") {
        let once = normalize(&text);
        prop_assert_eq!(normalize(&once), once);
    }

    #[test]
    fn invisible_characters_never_change_the_sketch(words in prop::collection::vec("[a-z]{1,8}", 1..8), zw in prop::sample::select(vec!['\u{200B}', '\u{200C}', '\u{200D}', '\u{2060}', '\u{FEFF}', '\u{202E}', '\u{2066}'])) {
        let plain = words.join(" ");
        let hidden: String = plain.chars().flat_map(|c| [c, zw]).collect();
        prop_assert_eq!(
            IntentSketch::of_text(&plain, SemanticMode::Intent).sketch,
            IntentSketch::of_text(&hidden, SemanticMode::Intent).sketch
        );
    }

    #[test]
    fn knobs_are_always_in_range(a in any::<String>(), b in any::<String>(), c in any::<String>(), d in any::<String>()) {
        let parsed = RawKnobs { prefetch: Some(&a), batch_threshold: Some(&b), cache_ttl: Some(&c), semantic_mode: Some(&d) }.parse();
        let k = parsed.knobs;
        prop_assert!(k.batch_threshold >= BATCH_THRESHOLD_RANGE.0 && k.batch_threshold <= BATCH_THRESHOLD_RANGE.1);
        prop_assert!(k.cache_ttl_s >= CACHE_TTL_RANGE_S.0 && k.cache_ttl_s <= CACHE_TTL_RANGE_S.1);
    }

    #[test]
    fn an_operators_bounds_hold_whatever_the_client_sends(
        a in prop_oneof![any::<String>(), Just("high".to_owned()), Just("low".to_owned())],
        b in prop_oneof![any::<String>(), (-1.0f32..2.0).prop_map(|v| v.to_string())],
        c in prop_oneof![any::<String>(), (0u32..5000).prop_map(|v| v.to_string())],
        d in prop_oneof![any::<String>(), Just("topic".to_owned()), Just("hybrid".to_owned())],
        t in (1u32..=9, 1u32..=9), s in (300u32..=3600, 300u32..=3600), cap in 0usize..4,
    ) {
        let (tl, th) = (t.0.min(t.1) as f32 / 10.0, t.0.max(t.1) as f32 / 10.0);
        let (sl, sh) = (s.0.min(s.1), s.0.max(s.1));
        let cap = ["none", "low", "medium", "high"][cap];
        let policy: KnobPolicy = serde_json::from_value(json!({"tenants": {"t": {
            "max_prefetch": cap, "batch_threshold_range": [tl, th], "cache_ttl_range_s": [sl, sh],
            "semantic_modes": ["intent"]}}})).unwrap();
        prop_assert!(policy.validate().is_ok());
        let limits = policy.limits(RouteOf::default(), Some("t"));
        let k = RawKnobs { prefetch: Some(&a), batch_threshold: Some(&b), cache_ttl: Some(&c), semantic_mode: Some(&d) }
            .parse_within(&limits).knobs;
        prop_assert!(k.batch_threshold >= tl && k.batch_threshold <= th);
        prop_assert!(k.cache_ttl_s >= sl && k.cache_ttl_s <= sh);
        prop_assert_eq!(k.semantic_mode, SemanticMode::Intent);
        prop_assert_eq!(limits.cap_prefetch(k.prefetch), k.prefetch, "never above the cap {}", cap);
    }
}
