//! Sketch version 2: a static token table distilled from a sentence-embedding model.
//!
//! Each masked token is split into the teacher's WordPiece pieces ([`crate::wordpiece`]);
//! each piece (and each mask placeholder) has one row of the embedded table
//! ([`super::table`]): a learned 32-dim direction and weight. The sketch is the weighted
//! sum of the rows, scaled to int8 by [`super::quantize`]. The table was fitted offline
//! (`scripts/distill-sketch`, docs/SKETCH.md) so that these sums reproduce the sentence
//! embeddings of all-MiniLM-L6-v2 (projected to 32 dimensions) on a broad corpus of
//! prompts; the sum costs one table lookup and 32 multiply-adds per piece.
//!
//! The semantic mode scales rows by word class (see [`super::words`]):
//! - `intent`: every row at its learned weight — the teacher's view, which groups
//!   requests by the action asked ("cancel my card" vs "order a new card");
//! - `topic`: content words only (question, modal, negation and function words and
//!   placeholders drop out), so requests about one domain meet whatever they ask;
//! - `hybrid`: content words at full weight, asking and function words and placeholders
//!   at half.
//!
//! Symbols the vocabulary does not know (most emoji: `[UNK]` to the teacher) keep the
//! foundation's promise that emoji are tokens: each adds a hashed ±1 row (as in version 1)
//! at half the table's median row weight, so "🔥🚀" and "🙏" differ and are not zero.
//!
//! Integer arithmetic only: the bytes are identical on every platform, wasm32 included.

use super::table::Table;
use super::words::{classify, WordClass};
use super::{quantize, SemanticMode, Sketch, SKETCH_DIMS};
use crate::mask::Token;
use xxhash_rust::xxh3::xxh3_64_with_seed;

const SYMBOL_SEED: u64 = 0x5eed_0003;

/// Multiplier of each word class in one mode (2 = learned weight, 1 = half, 0 = dropped).
fn multiplier(mode: SemanticMode, class: WordClass) -> i64 {
    match (mode, class) {
        (SemanticMode::Intent, _) => 2,
        (SemanticMode::Topic, WordClass::Content | WordClass::Symbol) => 2,
        (SemanticMode::Topic, _) => 0,
        (SemanticMode::Hybrid, WordClass::Content | WordClass::Symbol) => 2,
        (SemanticMode::Hybrid, _) => 1,
    }
}

/// Appends the table rows of one token to `ids` (its WordPiece pieces, or its mask row).
fn token_rows(table: &Table<'_>, token: &Token, ids: &mut Vec<u32>) {
    match token {
        Token::Word(word) => table.vocab.encode_into(word, ids),
        Token::Symbol(c) => table.vocab.encode_into(c.encode_utf8(&mut [0; 4]), ids),
        Token::Mask(mask) => ids.push(table.mask_row(*mask)),
    }
}

/// The word class of one token.
fn token_class(token: &Token) -> WordClass {
    match token {
        Token::Word(word) => classify(word),
        Token::Symbol(_) => WordClass::Symbol,
        Token::Mask(_) => WordClass::Mask,
    }
}

/// Calls `f(row id, class)` for every table row the tokens select, in order.
pub fn for_each_row(table: &Table<'_>, tokens: &[Token], mut f: impl FnMut(u32, WordClass)) {
    let mut ids = Vec::with_capacity(8);
    for token in tokens {
        ids.clear();
        token_rows(table, token, &mut ids);
        let class = token_class(token);
        for id in &ids {
            f(*id, class);
        }
    }
}

/// The version-2 sketch of masked, folded tokens (zero when the table is unavailable).
///
/// One pass over the tokens. The sum is of integers (no overflow: at most 4,096 tokens of
/// at most 100 pieces, each adding under 2^25 per dimension), so its order does not
/// matter; a token's class is looked up only when the mode weighs classes differently.
pub fn sketch(tokens: &[Token], mode: SemanticMode) -> Sketch {
    let Some(table) = Table::embedded() else {
        return Sketch::default();
    };
    let mut acc = [0i64; SKETCH_DIMS];
    let unk = table.vocab.unk();
    let mut ids = Vec::with_capacity(8);
    for token in tokens {
        let scale = match mode {
            // Intent weighs every class alike: no class lookup.
            SemanticMode::Intent => multiplier(mode, WordClass::Content),
            _ => multiplier(mode, token_class(token)),
        };
        if scale == 0 {
            continue;
        }
        ids.clear();
        token_rows(table, token, &mut ids);
        if let (Token::Symbol(c), [only]) = (token, ids.as_slice()) {
            if *only == unk {
                add_symbol(&mut acc, *c, table.median_weight() / 2 * scale);
                continue;
            }
        }
        for id in &ids {
            if *id != unk {
                let (weight, row) = table.row(*id);
                let weight = weight * scale;
                for (value, direction) in acc.iter_mut().zip(row) {
                    *value += weight * i64::from(*direction as i8);
                }
            }
        }
    }
    quantize(&acc)
}

/// A symbol the vocabulary does not know: a hashed ±1 row of `weight`.
fn add_symbol(acc: &mut [i64; SKETCH_DIMS], c: char, weight: i64) {
    let mut utf8 = [0; 4];
    let text = c.encode_utf8(&mut utf8);
    let signs = xxh3_64_with_seed(text.as_bytes(), SYMBOL_SEED) as u32;
    for (d, value) in acc.iter_mut().enumerate() {
        *value += if signs >> d & 1 == 1 { weight } else { -weight } * 127;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mask::tokenize;

    /// The two-pass sketch as it was before the one-pass rewrite (commit 0f41482): the
    /// oracle the property test compares [`sketch`] with.
    fn reference_sketch(tokens: &[Token], mode: SemanticMode) -> Sketch {
        let Some(table) = Table::embedded() else {
            return Sketch::default();
        };
        let mut acc = [0i64; SKETCH_DIMS];
        let unk = table.vocab.unk();
        let symbol_scale = multiplier(mode, WordClass::Symbol);
        for token in tokens {
            if let (Token::Symbol(c), true) = (token, symbol_scale > 0) {
                let mut utf8 = [0; 4];
                let text = c.encode_utf8(&mut utf8);
                if table.vocab.encode(text) == [unk] {
                    let signs = xxh3_64_with_seed(text.as_bytes(), SYMBOL_SEED) as u32;
                    let weight = table.median_weight() / 2 * symbol_scale;
                    for (d, value) in acc.iter_mut().enumerate() {
                        *value += if signs >> d & 1 == 1 { weight } else { -weight } * 127;
                    }
                }
            }
        }
        for_each_row(table, tokens, |id, class| {
            let scale = multiplier(mode, class);
            if scale == 0 || id == unk {
                return;
            }
            let (weight, row) = table.row(id);
            let weight = weight * scale;
            for (value, direction) in acc.iter_mut().zip(row) {
                *value += weight * i64::from(*direction as i8);
            }
        });
        quantize(&acc)
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 1024, ..Default::default() })]

        /// The one-pass sketch equals the two-pass original in every mode.
        #[test]
        fn sketch_matches_the_reference(text in crate::test_text::any_text()) {
            let tokens = tokenize(&crate::normalize::normalize(&text));
            for mode in [SemanticMode::Intent, SemanticMode::Topic, SemanticMode::Hybrid] {
                proptest::prop_assert_eq!(sketch(&tokens, mode), reference_sketch(&tokens, mode));
            }
        }
    }

    fn of(text: &str, mode: SemanticMode) -> Sketch {
        sketch(&tokenize(text), mode)
    }

    #[test]
    fn modes_weigh_classes_differently() {
        let text = "how can i cancel the card payment";
        let intent = of(text, SemanticMode::Intent);
        assert_ne!(intent, of(text, SemanticMode::Topic));
        assert_ne!(intent, of(text, SemanticMode::Hybrid));
        // Topic ignores asking and function words entirely.
        assert_eq!(
            of(text, SemanticMode::Topic),
            of("cancel card payment", SemanticMode::Topic)
        );
    }

    #[test]
    fn rows_follow_wordpiece_and_masks() {
        let table = Table::embedded().expect("embedded table");
        let mut rows = Vec::new();
        for_each_row(table, &tokenize("Refund order 1234 please"), |id, class| {
            rows.push((id, class))
        });
        // "refund" is two pieces in the teacher's vocabulary: "ref", "##und".
        let refund = table.vocab.encode("refund");
        assert_eq!(refund.len(), 2);
        assert_eq!(rows[0], (refund[0], WordClass::Content));
        assert_eq!(rows[1], (refund[1], WordClass::Content));
        assert!(rows.contains(&(table.mask_row(crate::mask::Mask::Number), WordClass::Mask)));
        assert_eq!(rows.last().map(|r| r.1), Some(WordClass::Function));
    }
}
