//! The 32-dimension int8 semantic sketch of intent text, and its similarity.
//!
//! Version 1 (this file) is a *hashed feature projection*: every token feature (stemmed
//! unigram, bigram of adjacent tokens, placeholder, symbol) gets a 64-bit xxh3 hash whose
//! low 32 bits are its ±1 signs on the 32 dimensions (a random projection in the
//! Johnson–Lindenstrauss sense); the weighted sum is scaled so the largest magnitude is
//! 127 and rounded to int8. Everything is integer arithmetic, so the bytes are identical
//! on every platform, wasm32 included.
//!
//! The semantic mode chooses the feature weights (function words never count alone):
//! - `intent` (the action asked): content words, question/modal/negation words at half
//!   weight, and bigrams of adjacent tokens that capture phrasing;
//! - `topic` (the domain): content words only;
//! - `hybrid`: content words, asking words and bigrams at low weight.
//!
//! Weights were chosen on Banking77 (`tests/sketch_quality.rs` prints the numbers): in 32
//! hashed dimensions every extra feature is also noise, so bigrams and function words stay
//! light. Masking names costs about 2 points of 1-NN accuracy there (product names such as
//! "Apple Pay" are masked too) and buys identical sketches for the same template.
//!
//! Similarity is the cosine of the int8 vectors. A hashed projection groups same-template
//! prompts exactly (after masking) and paraphrases loosely; the distilled table of the
//! semantic-quality work replaces the features under a new [`SKETCH_VERSION`].

use crate::mask::Token;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use std::sync::OnceLock;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Number of dimensions.
pub const SKETCH_DIMS: usize = 32;

/// Version of the sketch function; sketches of different versions are not comparable.
pub const SKETCH_VERSION: u32 = 1;

/// What the sketch weighs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
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

    fn weights(self) -> Weights {
        match self {
            SemanticMode::Intent => Weights {
                content: 4,
                asking: 2,
                function: 0,
                bigram: 1,
                mask: 0,
                symbol: 2,
            },
            SemanticMode::Topic => Weights {
                content: 4,
                asking: 0,
                function: 0,
                bigram: 0,
                mask: 0,
                symbol: 1,
            },
            SemanticMode::Hybrid => Weights {
                content: 4,
                asking: 1,
                function: 0,
                bigram: 1,
                mask: 0,
                symbol: 1,
            },
        }
    }
}

/// Integer weight of each feature class in one mode.
struct Weights {
    content: i32,
    /// Question, modal and negation words: what the user asks or refuses.
    asking: i32,
    /// Other function words.
    function: i32,
    bigram: i32,
    mask: i32,
    symbol: i32,
}

impl Weights {
    fn of(&self, class: WordClass) -> i32 {
        match class {
            WordClass::Content => self.content,
            WordClass::Asking => self.asking,
            WordClass::Function => self.function,
            WordClass::Mask => self.mask,
            WordClass::Symbol => self.symbol,
        }
    }
}

fn unigram_hash(text: &str) -> u64 {
    xxh3_64_with_seed(text.as_bytes(), UNIGRAM_SEED)
}

/// A 32-dimension int8 sketch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Sketch(pub [i8; SKETCH_DIMS]);

const UNIGRAM_SEED: u64 = 0x5eed_0001;
const BIGRAM_SEED: u64 = 0x5eed_0002;

impl Sketch {
    /// Sketch of masked, folded tokens in the given mode.
    pub fn from_tokens(tokens: &[Token], mode: SemanticMode) -> Sketch {
        let weights = mode.weights();
        let mut acc = [0i32; SKETCH_DIMS];
        let mut previous: Option<(u64, WordClass)> = None;
        for token in tokens {
            let (hash, class) = match token {
                Token::Word(word) => (unigram_hash(stem(word)), classify(word)),
                Token::Mask(mask) => (unigram_hash(mask.placeholder()), WordClass::Mask),
                Token::Symbol(c) => (unigram_hash(c.encode_utf8(&mut [0; 4])), WordClass::Symbol),
            };
            add(&mut acc, hash, weights.of(class));
            if let (Some((previous_hash, previous_class)), true) = (previous, weights.bigram > 0) {
                let mut pair = [0u8; 16];
                pair[..8].copy_from_slice(&previous_hash.to_le_bytes());
                pair[8..].copy_from_slice(&hash.to_le_bytes());
                let both_function =
                    previous_class == WordClass::Function && class == WordClass::Function;
                let weight = if both_function { 1 } else { weights.bigram };
                add(&mut acc, xxh3_64_with_seed(&pair, BIGRAM_SEED), weight);
            }
            previous = Some((hash, class));
        }
        Sketch::quantize(&acc)
    }

    /// Scales so the largest magnitude is 127, rounding half away from zero.
    fn quantize(acc: &[i32; SKETCH_DIMS]) -> Sketch {
        let max = acc.iter().map(|v| i64::from(*v).abs()).max().unwrap_or(0);
        let mut out = [0i8; SKETCH_DIMS];
        if max == 0 {
            return Sketch(out);
        }
        for (q, v) in out.iter_mut().zip(acc) {
            let v = i64::from(*v);
            let rounded = (2 * v * 127 + v.signum() * max) / (2 * max);
            *q = rounded.clamp(-127, 127) as i8;
        }
        Sketch(out)
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

    /// 32-bit sign signature (bit `i` set when dimension `i` is positive): a locality-
    /// sensitive bucket; equal sketches always share it, near ones usually do.
    pub fn signature(&self) -> u32 {
        self.0
            .iter()
            .enumerate()
            .fold(0u32, |sig, (i, v)| if *v > 0 { sig | 1 << i } else { sig })
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

fn add(acc: &mut [i32; SKETCH_DIMS], hash: u64, weight: i32) {
    if weight == 0 {
        return;
    }
    let signs = hash as u32;
    for (d, value) in acc.iter_mut().enumerate() {
        let sign = ((signs >> d) & 1) as i32 * 2 - 1;
        *value += sign * weight;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WordClass {
    Content,
    Asking,
    Function,
    Mask,
    Symbol,
}

const ASKING: &[&str] = &[
    "can", "can't", "cannot", "could", "couldn't", "didn't", "doesn't", "don't", "how", "isn't",
    "need", "never", "no", "not", "should", "want", "wasn't", "what", "when", "where", "which",
    "who", "why", "won't", "would",
];

const FUNCTION: &[&str] = &[
    "a", "about", "am", "an", "and", "any", "are", "as", "at", "be", "been", "but", "by", "did",
    "do", "does", "for", "from", "had", "has", "have", "hello", "hey", "hi", "i", "i'm", "i've",
    "if", "in", "into", "is", "it", "it's", "its", "just", "me", "my", "of", "on", "or", "our",
    "please", "so", "some", "that", "the", "their", "them", "there", "these", "they", "this",
    "those", "to", "up", "us", "was", "we", "were", "will", "with", "you", "your",
];

/// Longest word in the lists; longer words are content without a lookup.
const LONGEST_LISTED: usize = 8;

fn classify(word: &str) -> WordClass {
    static TABLE: OnceLock<Vec<(u64, WordClass)>> = OnceLock::new();
    if word.len() > LONGEST_LISTED {
        return WordClass::Content;
    }
    let table = TABLE.get_or_init(|| {
        let mut table: Vec<(u64, WordClass)> = ASKING
            .iter()
            .map(|w| (xxh3_64(w.as_bytes()), WordClass::Asking))
            .chain(
                FUNCTION
                    .iter()
                    .map(|w| (xxh3_64(w.as_bytes()), WordClass::Function)),
            )
            .collect();
        table.sort_unstable_by_key(|(hash, _)| *hash);
        table
    });
    let hash = xxh3_64(word.as_bytes());
    match table.binary_search_by_key(&hash, |(h, _)| *h) {
        Ok(i) => table[i].1,
        Err(_) => WordClass::Content,
    }
}

/// Light suffix stripping so "refund", "refunds", "refunded", "refunding" share features.
fn stem(word: &str) -> &str {
    if word.len() <= 4 || !word.is_ascii() {
        return word;
    }
    for suffix in ["ing", "ed", "es", "s"] {
        if let Some(stem) = word.strip_suffix(suffix) {
            if stem.len() >= 3 && !(suffix == "s" && (stem.ends_with('s') || stem.ends_with('u'))) {
                return stem;
            }
        }
    }
    word
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mask::tokenize;

    fn sketch(text: &str, mode: SemanticMode) -> Sketch {
        Sketch::from_tokens(&tokenize(text), mode)
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
    fn word_lists_classify_and_fit_the_length_bound() {
        for word in ASKING.iter().chain(FUNCTION) {
            assert!(word.len() <= LONGEST_LISTED, "{word}");
        }
        assert_eq!(classify("how"), WordClass::Asking);
        assert_eq!(classify("couldn't"), WordClass::Asking);
        assert_eq!(classify("the"), WordClass::Function);
        assert_eq!(classify("refund"), WordClass::Content);
        assert_eq!(classify("withdrawal"), WordClass::Content);
    }

    #[test]
    fn stems_merge_inflections() {
        assert_eq!(stem("refunded"), "refund");
        assert_eq!(stem("refunds"), "refund");
        assert_eq!(stem("refunding"), "refund");
        assert_eq!(stem("status"), "status");
        assert_eq!(stem("card"), "card");
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

    #[test]
    fn signature_reflects_signs() {
        let mut s = Sketch::default();
        s.0[0] = 5;
        s.0[31] = 1;
        s.0[2] = -3;
        assert_eq!(s.signature(), 1 | 1 << 31);
    }
}
