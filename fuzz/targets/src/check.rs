//! Invariant checks shared by several targets.

use cohort_fingerprint::sketch::SemanticMode;
use cohort_fingerprint::Sketch;

/// The three semantic modes, for targets that pick one from an input byte.
pub const MODES: [SemanticMode; 3] = [
    SemanticMode::Intent,
    SemanticMode::Topic,
    SemanticMode::Hybrid,
];

/// The first byte (0 for an empty input) and the rest.
pub fn split_first(data: &[u8]) -> (usize, &[u8]) {
    match data.split_first() {
        Some((first, rest)) => (usize::from(*first), rest),
        None => (0, data),
    }
}

/// A header value Envoy can carry unchanged: non-empty visible ASCII.
pub fn assert_visible_ascii(what: &str, value: &str) {
    assert!(
        !value.is_empty() && value.bytes().all(|b| b.is_ascii_graphic()),
        "{what}: {value:?} is not visible ASCII"
    );
}

/// `value` is exactly `digits` lowercase hex digits.
pub fn assert_hex(what: &str, value: &str, digits: usize) {
    assert!(
        value.len() == digits
            && value
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
        "{what}: {value:?} is not {digits} lowercase hex digits"
    );
}

/// A quantised sketch: values in ±127 with a peak of exactly 127 unless all zero, and a
/// base64url form that reads back.
pub fn assert_sketch(sketch: &Sketch) {
    let peak = sketch.0.iter().map(|v| v.unsigned_abs()).max().unwrap_or(0);
    assert!(
        sketch.0.iter().all(|v| *v != i8::MIN),
        "sketch value -128: {sketch:?}"
    );
    assert!(
        peak == 127 || sketch.is_zero(),
        "peak {peak} (not 127) in {sketch:?}"
    );
    let text = sketch.to_base64url();
    assert_eq!(text.len(), 43);
    assert_eq!(Sketch::from_base64url(&text), Some(*sketch));
    let self_similarity = sketch.similarity(sketch);
    if sketch.is_zero() {
        assert_eq!(self_similarity, 0.0);
    } else {
        assert!((self_similarity - 1.0).abs() < 1e-5, "{self_similarity}");
    }
}
