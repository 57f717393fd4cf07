//! A `cohort fingerprint` input line: a raw body, a `{"text": …}` line or an envelope with
//! headers (knobs), as the CLI and the wasm build read them.
//!
//! Invariants: deterministic; exactly one of a bypass (with a known reason and an error)
//! or a sketch; a sketch's fields agree with each other (base64url, int8 values, version,
//! mode, 8-hex cohort, 16-hex key); invalid knobs reported at most once each; the record
//! serialises to one JSON line that parses back.

use crate::check::{assert_hex, assert_sketch};
use cohort_fingerprint::error::BYPASS_REASONS;
use cohort_fingerprint::record::{fingerprint_line, LineDefaults};
use cohort_fingerprint::sketch::{SemanticMode, SKETCH_VERSION};
use cohort_fingerprint::Sketch;

/// The fuzz target.
pub fn line(data: &[u8]) {
    let defaults = LineDefaults::default();
    let record = fingerprint_line(data, 1, &defaults);
    assert_eq!(
        record,
        fingerprint_line(data, 1, &defaults),
        "deterministic"
    );
    assert_ne!(
        record.bypass.is_some(),
        record.sketch.is_some(),
        "a record is either bypassed or sketched: {record:?}"
    );
    if let Some(reason) = record.bypass {
        assert!(BYPASS_REASONS.contains(&reason), "unknown reason {reason}");
        assert!(record.error.as_deref().is_some_and(|e| !e.is_empty()));
    }
    if let Some(text) = &record.sketch {
        let sketch = Sketch::from_base64url(text).expect("the sketch field is base64url");
        assert_sketch(&sketch);
        assert_eq!(record.sketch_i8.as_deref(), Some(&sketch.0[..]));
        assert_eq!(record.sketch_version, Some(SKETCH_VERSION));
        let mode = record.semantic_mode.expect("a sketch has a mode");
        assert!(SemanticMode::parse(mode).is_some(), "mode {mode}");
        assert_hex("cohort", record.cohort.as_deref().unwrap(), 8);
        assert_hex("routing key", record.routing_key.as_deref().unwrap(), 16);
        assert!(record.anchor.is_some());
    }
    for (i, knob) in record.invalid_knobs.iter().enumerate() {
        assert!(
            record.invalid_knobs[..i]
                .iter()
                .all(|k| k.knob != knob.knob),
            "knob {} reported twice",
            knob.knob
        );
    }
    let json = serde_json::to_string(&record).expect("a record serialises");
    assert!(!json.contains('\n'), "one record, one line");
    let back: serde_json::Value = serde_json::from_str(&json).expect("the line parses back");
    assert_eq!(back["line"], 1);
}
