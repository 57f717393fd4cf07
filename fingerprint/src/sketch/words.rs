//! Word classes shared by both sketch versions: what a word contributes in each mode.
//!
//! The semantic mode ([`super::SemanticMode`]) decides how much asking words (question,
//! modal, negation), other function words, placeholders and symbols count next to
//! content words; this module only says which class a case-folded word is in.

use std::sync::OnceLock;
use xxhash_rust::xxh3::xxh3_64;

/// The class of one token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WordClass {
    Content,
    /// Question, modal and negation words: what the user asks or refuses.
    Asking,
    /// Other function words.
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

/// The class of a case-folded word.
pub fn classify(word: &str) -> WordClass {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
