//! The 32-dimension int8 semantic sketch of intent text, and its similarity.
//!
//! Two versions exist; sketches of different versions are not comparable, so the version
//! travels with every sketch (`sketch_version` in records, the batcher protocol and the
//! store):
//! - version 2 ([`distilled`], the default, [`SKETCH_VERSION`]): a static WordPiece token
//!   table distilled from all-MiniLM-L6-v2 ([`table`], fitted by `scripts/distill-sketch`;
//!   docs/SKETCH.md has the method and the numbers). It groups paraphrases of one intent
//!   like the sentence-embedding model does, at a few microseconds per prompt;
//! - version 1 ([`hashed`]): a hashed projection of stemmed unigrams and bigrams, kept for
//!   the evaluation and for comparison.
//!
//! The semantic mode chooses how much each word class ([`words`]) counts: `intent` the
//! action asked, `topic` the domain (content words only), `hybrid` both. Both versions end
//! in [`quantize`]: the weighted sum scaled so the largest magnitude is 127. Everything is
//! integer arithmetic, so the bytes are identical on every platform, wasm32 included.
//! Similarity is the cosine of the int8 vectors.

pub mod codebook;
pub mod distilled;
pub mod hashed;
pub mod table;
pub mod words;

use crate::mask::Token;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

/// Number of dimensions.
pub const SKETCH_DIMS: usize = 32;

/// Version of the sketch function; sketches of different versions are not comparable.
pub const SKETCH_VERSION: u32 = 2;

/// What the sketch weighs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SemanticMode {
    /// The action asked.
    #[default]
    Intent,
    /// The domain.
    Topic,
    /// Both.
    Hybrid,
}

impl SemanticMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SemanticMode::Intent => "intent",
            SemanticMode::Topic => "topic",
            SemanticMode::Hybrid => "hybrid",
        }
    }

    pub fn parse(value: &str) -> Option<SemanticMode> {
        match value {
            "intent" => Some(SemanticMode::Intent),
            "topic" => Some(SemanticMode::Topic),
            "hybrid" => Some(SemanticMode::Hybrid),
            _ => None,
        }
    }
}

/// A 32-dimension int8 sketch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Sketch(pub [i8; SKETCH_DIMS]);

impl Sketch {
    /// The current-version ([`SKETCH_VERSION`]) sketch of masked, folded tokens.
    pub fn from_tokens(tokens: &[Token], mode: SemanticMode) -> Sketch {
        distilled::sketch(tokens, mode)
    }

    /// The sketch of masked, folded tokens in a given version (1 or 2); `None` for others.
    pub fn of_version(version: u32, tokens: &[Token], mode: SemanticMode) -> Option<Sketch> {
        match version {
            1 => Some(hashed::sketch(tokens, mode)),
            2 => Some(distilled::sketch(tokens, mode)),
            _ => None,
        }
    }

    /// True when no feature contributed (no tokens).
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|v| *v == 0)
    }

    /// Cosine similarity in [-1, 1]; 0 when either sketch is zero.
    pub fn similarity(&self, other: &Sketch) -> f32 {
        let (mut dot, mut norm_a, mut norm_b) = (0i32, 0i32, 0i32);
        for (a, b) in self.0.iter().zip(&other.0) {
            let (a, b) = (i32::from(*a), i32::from(*b));
            dot += a * b;
            norm_a += a * a;
            norm_b += b * b;
        }
        if norm_a == 0 || norm_b == 0 {
            return 0.0;
        }
        (f64::from(dot) / (f64::from(norm_a) * f64::from(norm_b)).sqrt()) as f32
    }

    /// The 32 bytes as unpadded base64url (43 characters), the `x-cohort-fp` value.
    pub fn to_base64url(&self) -> String {
        URL_SAFE_NO_PAD.encode(self.0.map(|v| v as u8))
    }

    /// Parses [`Sketch::to_base64url`] output.
    pub fn from_base64url(text: &str) -> Option<Sketch> {
        let bytes = URL_SAFE_NO_PAD.decode(text).ok()?;
        let bytes: [u8; SKETCH_DIMS] = bytes.try_into().ok()?;
        Some(Sketch(bytes.map(|b| b as i8)))
    }
}

/// Scales so the largest magnitude is 127, rounding half away from zero.
///
/// Sums of table rows stay far below 2^54, where the rounding fits in `i64`; wasm has no
/// 128-bit division (it is a slow library call there), so [`quantize_wide`] is only the
/// fallback for magnitudes no real text reaches. Both give the same result.
pub fn quantize(acc: &[i64; SKETCH_DIMS]) -> Sketch {
    let max = acc.iter().map(|v| v.unsigned_abs()).max().unwrap_or(0);
    if max >= 1 << 54 {
        return quantize_wide(acc, max);
    }
    let mut out = [0i8; SKETCH_DIMS];
    if max == 0 {
        return Sketch(out);
    }
    let max = max as i64;
    for (q, &v) in out.iter_mut().zip(acc) {
        let rounded = (2 * v * 127 + v.signum() * max) / (2 * max);
        *q = rounded.clamp(-127, 127) as i8;
    }
    Sketch(out)
}

/// [`quantize`] in `i128`, for any magnitude `max` (the largest `|v|`, not 0).
fn quantize_wide(acc: &[i64; SKETCH_DIMS], max: u64) -> Sketch {
    let max = i128::from(max);
    Sketch(acc.map(|v| {
        let v = i128::from(v);
        ((2 * v * 127 + v.signum() * max) / (2 * max)).clamp(-127, 127) as i8
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mask::tokenize;

    fn sketch(text: &str, mode: SemanticMode) -> Sketch {
        Sketch::from_tokens(&tokenize(text), mode)
    }

    /// The `i64` path rounds exactly as the `i128` one does (itself the rounding before
    /// the `i64` path existed).
    fn agrees_with_wide(acc: &[i64; SKETCH_DIMS]) -> bool {
        let max = acc.iter().map(|v| v.unsigned_abs()).max().unwrap_or(0);
        max == 0 || quantize(acc) == quantize_wide(acc, max)
    }

    proptest::proptest! {
        #[test]
        fn quantize_matches_128_bit_rounding(
            acc in proptest::array::uniform32(proptest::prelude::any::<i64>()),
            shift in 10u32..64,
        ) {
            // Shifts of 10 and more bring every sum under 2^54, onto the i64 path.
            let acc = acc.map(|v| v >> shift);
            proptest::prop_assert!(agrees_with_wide(&acc));
        }
    }

    #[test]
    fn quantize_at_the_extremes() {
        for fill in [(1 << 54) - 1, -(1 << 54) + 1, 1, -1] {
            let mut acc = [fill; SKETCH_DIMS];
            assert!(agrees_with_wide(&acc));
            acc[3] = -5;
            acc[7] = 1 << 20;
            assert!(agrees_with_wide(&acc));
        }
        // Past 2^54 the wide path runs, and cannot overflow.
        assert_eq!(quantize(&[i64::MIN; SKETCH_DIMS]).0, [-127; SKETCH_DIMS]);
        assert_eq!(quantize(&[i64::MAX; SKETCH_DIMS]).0, [127; SKETCH_DIMS]);
        assert_eq!(quantize(&[0; SKETCH_DIMS]).0, [0; SKETCH_DIMS]);
    }

    #[test]
    fn quantized_peak_is_127() {
        let s = sketch("how do i cancel my order", SemanticMode::Intent);
        assert_eq!(s.0.iter().map(|v| v.unsigned_abs()).max(), Some(127));
    }

    #[test]
    fn identical_text_similarity_is_one_and_empty_is_zero() {
        let a = sketch("reset my password", SemanticMode::Hybrid);
        assert!((a.similarity(&a) - 1.0).abs() < 1e-6);
        let empty = sketch("", SemanticMode::Hybrid);
        assert!(empty.is_zero());
        assert_eq!(a.similarity(&empty), 0.0);
    }

    #[test]
    fn modes_differ() {
        let text = "why was my card payment declined";
        assert_ne!(
            sketch(text, SemanticMode::Intent),
            sketch(text, SemanticMode::Topic)
        );
    }

    #[test]
    fn base64url_round_trip() {
        let s = sketch("where is my parcel", SemanticMode::Intent);
        let text = s.to_base64url();
        assert_eq!(text.len(), 43);
        assert_eq!(Sketch::from_base64url(&text), Some(s));
        assert_eq!(Sketch::from_base64url("short"), None);
    }
}
