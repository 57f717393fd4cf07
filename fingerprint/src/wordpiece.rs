//! The uncased BERT WordPiece tokenizer of all-MiniLM-L6-v2, for the distilled sketch.
//!
//! The distilled sketch ([`crate::sketch`], version 2) has one table row per token of the
//! teacher model's vocabulary, so it must split text exactly as the teacher's
//! `tokenizer.json` does (HF `tokenizers`: BertNormalizer with clean_text,
//! handle_chinese_chars, lowercase and accent stripping; BertPreTokenizer; WordPiece with
//! `##` continuations, `[UNK]` for words it cannot cover or of more than 100 characters).
//! `tests/wordpiece_parity.rs` checks the ids against `tokenizers` on a fixture of real
//! sentences.
//!
//! The vocabulary lookup is an open-addressing table of xxh3 hashes over the embedded
//! vocabulary strings (word-initial and `##` pieces hashed with different seeds, so a
//! continuation is looked up without building a `##` string); each slot carries the first
//! bytes of its key, so a short piece is matched without reading the token string. Plain lowercase ASCII words —
//! most of every prompt — skip normalisation.

use crate::bert_unicode::{contains, NONSPACING_MARK, OTHER, PUNCTUATION};
use unicode_normalization::UnicodeNormalization;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Words longer than this many characters become `[UNK]`, as in the teacher.
pub const MAX_CHARS_PER_WORD: usize = 100;

const CONTINUATION: &str = "##";
const EMPTY: u32 = u32::MAX;
const SEED_START: u64 = 0;
const SEED_CONTINUATION: u64 = 1;

/// Bytes of a key kept in its slot: a piece of up to this length (nearly all) is compared
/// in the slot, without reading the token string elsewhere in memory.
const SLOT_KEY: usize = 10;

/// One slot of the hash index (16 bytes: four per cache line). Inside Envoy the tables are
/// mostly out of cache when a request arrives, so each memory location a lookup touches
/// costs; a slot answers a short key alone.
#[derive(Debug, Clone, Copy)]
struct Slot {
    id: u32,
    /// Key length, or `SLOT_KEY + 1` for any longer key.
    len: u8,
    continuation: bool,
    /// The key's first bytes (all of it when short), zero-padded.
    key: [u8; SLOT_KEY],
}

const EMPTY_SLOT: Slot = Slot {
    id: EMPTY,
    len: 0,
    continuation: false,
    key: [0; SLOT_KEY],
};

/// A WordPiece vocabulary: token strings (ids are positions) and their hash index.
#[derive(Debug, Clone)]
pub struct Vocab<'a> {
    tokens: Vec<&'a str>,
    slots: Vec<Slot>,
    unk: u32,
}

impl<'a> Vocab<'a> {
    /// Indexes `tokens`; `unk` is the id of `[UNK]`. Returns `None` when `unk` is not an id.
    pub fn new(tokens: Vec<&'a str>, unk: u32) -> Option<Vocab<'a>> {
        if unk as usize >= tokens.len() || tokens.len() >= EMPTY as usize / 2 {
            return None;
        }
        let slots_len = (tokens.len() * 2).next_power_of_two().max(16);
        let mut vocab = Vocab {
            slots: vec![EMPTY_SLOT; slots_len],
            tokens,
            unk,
        };
        for id in 0..vocab.tokens.len() {
            let token = vocab.tokens[id];
            let (key, seed) = match token.strip_prefix(CONTINUATION) {
                Some(rest) if !rest.is_empty() => (rest, SEED_CONTINUATION),
                _ => (token, SEED_START),
            };
            let continuation = seed == SEED_CONTINUATION;
            let mut slot = vocab.slot_of(key, seed);
            while vocab.slots[slot].id != EMPTY {
                if vocab.slot_matches(&vocab.slots[slot], key, continuation) {
                    break; // a duplicate string keeps its first id
                }
                slot = (slot + 1) & (vocab.slots.len() - 1);
            }
            if vocab.slots[slot].id == EMPTY {
                let mut inline = [0; SLOT_KEY];
                let short = key.len().min(SLOT_KEY);
                inline[..short].copy_from_slice(&key.as_bytes()[..short]);
                vocab.slots[slot] = Slot {
                    id: id as u32,
                    len: key.len().min(SLOT_KEY + 1) as u8,
                    continuation,
                    key: inline,
                };
            }
        }
        Some(vocab)
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when the vocabulary has no tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The id of `[UNK]`.
    pub fn unk(&self) -> u32 {
        self.unk
    }

    /// The token string of `id`.
    pub fn token(&self, id: u32) -> Option<&'a str> {
        self.tokens.get(id as usize).copied()
    }

    fn slot_of(&self, key: &str, seed: u64) -> usize {
        xxh3_64_with_seed(key.as_bytes(), seed) as usize & (self.slots.len() - 1)
    }

    /// True when `slot` holds `key` of this kind: compared in the slot for a short key; a
    /// long key also compares the token string.
    fn slot_matches(&self, slot: &Slot, key: &str, continuation: bool) -> bool {
        let bytes = key.as_bytes();
        if slot.continuation != continuation {
            return false;
        }
        if bytes.len() <= SLOT_KEY {
            return usize::from(slot.len) == bytes.len() && slot.key[..bytes.len()] == *bytes;
        }
        usize::from(slot.len) > SLOT_KEY
            && slot.key == bytes[..SLOT_KEY]
            && self.matches(slot.id, key, continuation)
    }

    fn matches(&self, id: u32, key: &str, continuation: bool) -> bool {
        let token = self.tokens[id as usize];
        if continuation {
            token.len() == key.len() + 2 && token.starts_with(CONTINUATION) && &token[2..] == key
        } else {
            token == key
        }
    }

    /// The id of a piece: word-initial, or a continuation (looked up as `##piece`). A
    /// word-initial lookup never answers with a `##` token, nor the reverse.
    pub fn lookup(&self, piece: &str, continuation: bool) -> Option<u32> {
        let seed = if continuation {
            SEED_CONTINUATION
        } else {
            SEED_START
        };
        let mut slot = self.slot_of(piece, seed);
        loop {
            let entry = &self.slots[slot];
            if entry.id == EMPTY {
                return None;
            }
            if self.slot_matches(entry, piece, continuation) {
                return Some(entry.id);
            }
            slot = (slot + 1) & (self.slots.len() - 1);
        }
    }

    /// Token ids of `text` as the teacher's tokenizer gives them, without `[CLS]`/`[SEP]`.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        self.encode_into(text, &mut out);
        out
    }

    /// Appends the token ids of `text` to `out`.
    pub fn encode_into(&self, text: &str, out: &mut Vec<u32>) {
        if is_plain(text) {
            self.word_pieces(text, out);
            return;
        }
        let normalized = normalize(text);
        for word in pre_tokenize(&normalized) {
            self.word_pieces(word, out);
        }
    }

    /// Greedy longest-match-first WordPiece of one pre-tokenised word.
    fn word_pieces(&self, word: &str, out: &mut Vec<u32>) {
        // Bytes bound characters: count them only for a long word.
        if word.len() > MAX_CHARS_PER_WORD && word.chars().count() > MAX_CHARS_PER_WORD {
            out.push(self.unk);
            return;
        }
        let mark = out.len();
        let mut start = 0;
        while start < word.len() {
            let mut end = word.len();
            let mut found = None;
            while end > start {
                if let Some(id) = self.lookup(&word[start..end], start > 0) {
                    found = Some(id);
                    break;
                }
                end = previous_boundary(word, end);
            }
            match found {
                Some(id) => {
                    out.push(id);
                    start = end;
                }
                None => {
                    out.truncate(mark);
                    out.push(self.unk);
                    return;
                }
            }
        }
    }
}

fn previous_boundary(word: &str, end: usize) -> usize {
    let mut i = end - 1;
    while !word.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Lowercase ASCII letters and digits only: normalisation and splitting change nothing.
fn is_plain(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

fn is_whitespace(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r') || c.is_whitespace()
}

fn is_control(c: char) -> bool {
    !matches!(c, '\t' | '\n' | '\r') && contains(OTHER, c)
}

fn is_chinese(c: char) -> bool {
    matches!(u32::from(c),
        0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F | 0x2B920..=0x2CEAF | 0xF900..=0xFAFF | 0x2F800..=0x2FA1F)
}

fn is_punctuation(c: char) -> bool {
    c.is_ascii_punctuation() || contains(PUNCTUATION, c)
}

/// BertNormalizer: clean text, space around CJK ideographs, strip accents, lowercase.
fn normalize(text: &str) -> String {
    let mut cleaned = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c == '\0' || c == '\u{fffd}' || is_control(c) {
            continue;
        }
        if is_whitespace(c) {
            cleaned.push(' ');
        } else if is_chinese(c) {
            cleaned.push(' ');
            cleaned.push(c);
            cleaned.push(' ');
        } else {
            cleaned.push(c);
        }
    }
    let mut out = String::with_capacity(cleaned.len());
    for c in cleaned.nfd().filter(|c| !contains(NONSPACING_MARK, *c)) {
        out.extend(c.to_lowercase());
    }
    out
}

/// BertPreTokenizer: split on whitespace (dropped) and punctuation (kept, one per token).
fn pre_tokenize(text: &str) -> impl Iterator<Item = &str> {
    let mut pieces = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        if is_whitespace(c) || is_punctuation(c) {
            if let Some(s) = start.take() {
                pieces.push(&text[s..i]);
            }
            if !is_whitespace(c) {
                pieces.push(&text[i..i + c.len_utf8()]);
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        pieces.push(&text[s..]);
    }
    pieces.into_iter()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab() -> Vocab<'static> {
        let tokens = vec![
            "[PAD]", "[UNK]", "un", "##aff", "##able", "hello", "!", "cafe", "的", "##s", "a",
        ];
        Vocab::new(tokens, 1).unwrap()
    }

    #[test]
    fn greedy_longest_match_with_continuations() {
        let v = vocab();
        assert_eq!(v.encode("unaffable"), vec![2, 3, 4]);
        assert_eq!(v.encode("Hello!"), vec![5, 6]);
        assert_eq!(v.encode("unknown"), vec![1]);
    }

    #[test]
    fn accents_case_and_cjk() {
        let v = vocab();
        assert_eq!(v.encode("CAFÉ"), vec![7]);
        assert_eq!(v.encode("a的a"), vec![10, 8, 10]);
        assert_eq!(v.encode("  \u{200b}hello\u{0}  "), vec![5]);
    }

    #[test]
    fn long_words_are_unknown() {
        let v = vocab();
        assert_eq!(v.encode(&"a".repeat(101)), vec![1]);
        assert_eq!(v.encode(""), Vec::<u32>::new());
    }

    /// Every token of the embedded vocabulary is found under its own id (the first one
    /// for a string listed twice), word-initial or `##`, and near misses are not found.
    #[test]
    fn every_embedded_token_is_found() {
        let table = crate::sketch::table::Table::embedded().expect("embedded table");
        let v = &table.vocab;
        let mut longest_probe = 0;
        for id in 0..v.len() as u32 {
            let token = v.token(id).unwrap();
            let (key, continuation) = match token.strip_prefix(CONTINUATION) {
                Some(rest) if !rest.is_empty() => (rest, true),
                _ => (token, false),
            };
            let found = v.lookup(key, continuation).expect(token);
            assert_eq!(v.token(found), Some(token));
            assert!(found <= id);
            let mut probe = 0;
            let mut slot = v.slot_of(
                key,
                if continuation {
                    SEED_CONTINUATION
                } else {
                    SEED_START
                },
            );
            while v.slots[slot].id != found {
                slot = (slot + 1) & (v.slots.len() - 1);
                probe += 1;
            }
            longest_probe = probe.max(longest_probe);
            assert_eq!(v.lookup(&format!("{key}\u{1}"), continuation), None);
            // The other kind (word-initial vs `##`) never answers with this token.
            assert_ne!(v.lookup(key, !continuation), Some(found));
        }
        // Linear probing at load 1/2 stays short with a well-mixed hash.
        assert!(longest_probe < 64, "longest probe {longest_probe}");
    }

    #[test]
    fn bad_unk_is_refused() {
        assert!(Vocab::new(vec!["a"], 3).is_none());
    }
}
