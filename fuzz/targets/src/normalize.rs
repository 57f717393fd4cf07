//! Intent-text normalisation and masking on arbitrary text (invalid UTF-8 is replaced, as
//! the JSON layer would refuse it before).
//!
//! Invariants: no invisible format character and no control character but `\n` survives;
//! normalisation is idempotent (normalised text normalises to itself), so a front end that
//! normalises before Cohort does cannot change a cohort; ASCII keeps its length; masking
//! is deterministic, bounded in tokens, and yields no empty word.

use cohort_fingerprint::mask::{tokenize, Token, MAX_TOKENS};
use cohort_fingerprint::normalize::{is_invisible, normalize as normalize_text, HALF_WINDOW};

/// The fuzz target.
pub fn normalize(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let once = normalize_text(&text);
    assert!(
        !once
            .chars()
            .any(|c| is_invisible(c) || (c.is_control() && c != '\n')),
        "invisible or control character left in {once:?}"
    );
    if once.len() <= 2 * HALF_WINDOW {
        let twice = normalize_text(&once);
        assert_eq!(twice, once, "normalisation is not idempotent for {text:?}");
    }
    if text.is_ascii() && text.len() <= 2 * HALF_WINDOW {
        assert_eq!(once.len(), text.len());
    }
    let tokens = tokenize(&once);
    assert_eq!(tokens, tokenize(&once), "masking is deterministic");
    assert!(tokens.len() <= MAX_TOKENS);
    for token in &tokens {
        if let Token::Word(word) = token {
            assert!(!word.is_empty(), "empty word in {tokens:?}");
        }
    }
}
