//! Sketch version 1: a hashed feature projection (kept for comparison and old batchers).
//!
//! Every token feature (stemmed unigram, bigram of adjacent tokens, placeholder, symbol)
//! gets a 64-bit xxh3 hash whose low 32 bits are its ±1 signs on the 32 dimensions (a
//! random projection in the Johnson–Lindenstrauss sense); the weighted sum is scaled to
//! int8 by [`super::quantize`]. The semantic mode chooses the feature weights (function
//! words never count alone):
//! - `intent`: content words, question/modal/negation words at half weight, and bigrams;
//! - `topic`: content words only;
//! - `hybrid`: content words, asking words and bigrams at low weight.
//!
//! It groups same-template prompts exactly (after masking) but paraphrases only loosely
//! (Banking77 1-NN 0.67–0.70); version 2 ([`super::distilled`]) replaced it.

use super::words::{classify, WordClass};
use super::{quantize, SemanticMode, Sketch, SKETCH_DIMS};
use crate::mask::Token;
use xxhash_rust::xxh3::xxh3_64_with_seed;

const UNIGRAM_SEED: u64 = 0x5eed_0001;
const BIGRAM_SEED: u64 = 0x5eed_0002;

/// Integer weight of each feature class in one mode.
struct Weights {
    content: i64,
    asking: i64,
    function: i64,
    bigram: i64,
    mask: i64,
    symbol: i64,
}

impl Weights {
    fn of_mode(mode: SemanticMode) -> Weights {
        match mode {
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

    fn of(&self, class: WordClass) -> i64 {
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

/// The version-1 sketch of masked, folded tokens.
pub fn sketch(tokens: &[Token], mode: SemanticMode) -> Sketch {
    let weights = Weights::of_mode(mode);
    let mut acc = [0i64; SKETCH_DIMS];
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
    quantize(&acc)
}

fn add(acc: &mut [i64; SKETCH_DIMS], hash: u64, weight: i64) {
    if weight == 0 {
        return;
    }
    let signs = hash as u32;
    for (d, value) in acc.iter_mut().enumerate() {
        let sign = ((signs >> d) & 1) as i64 * 2 - 1;
        *value += sign * weight;
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

    #[test]
    fn stems_merge_inflections() {
        assert_eq!(stem("refunded"), "refund");
        assert_eq!(stem("refunds"), "refund");
        assert_eq!(stem("refunding"), "refund");
        assert_eq!(stem("status"), "status");
        assert_eq!(stem("card"), "card");
    }

    #[test]
    fn peak_is_127_and_modes_differ() {
        let tokens = tokenize("why was my card payment declined");
        let intent = sketch(&tokens, SemanticMode::Intent);
        assert_eq!(intent.0.iter().map(|v| v.unsigned_abs()).max(), Some(127));
        assert_ne!(intent, sketch(&tokens, SemanticMode::Topic));
    }
}
