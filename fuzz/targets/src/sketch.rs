//! The semantic sketch, both versions, every mode (the first byte picks the mode), with the
//! WordPiece tokenizer and the table format it reads.
//!
//! Invariants: each version is deterministic and quantised (±127, peak 127 unless zero);
//! no tokens means the zero sketch; unknown versions are refused; similarity is symmetric
//! and within [-1, 1]; WordPiece ids and the rows the sketch selects lie inside the table;
//! a well-formed table built from the input always parses, and arbitrary bytes parsed as a
//! table are either refused or safe to read.

use crate::check::{assert_sketch, split_first, MODES};
use cohort_fingerprint::mask::tokenize;
use cohort_fingerprint::normalize::normalize;
use cohort_fingerprint::sketch::distilled::for_each_row;
use cohort_fingerprint::sketch::table::{Table, MASK_ROWS};
use cohort_fingerprint::sketch::SKETCH_DIMS;
use cohort_fingerprint::{Sketch, Token};

/// The fuzz target.
pub fn sketch(data: &[u8]) {
    let (selector, rest) = split_first(data);
    let mode = MODES[selector % MODES.len()];
    let other_mode = MODES[(selector + 1) % MODES.len()];
    let text = String::from_utf8_lossy(rest);
    let tokens = tokenize(&normalize(&text));
    let mut sketches = Vec::new();
    for version in [1, 2] {
        let sketch = Sketch::of_version(version, &tokens, mode).expect("known version");
        assert_eq!(Some(sketch), Sketch::of_version(version, &tokens, mode));
        assert_sketch(&sketch);
        if tokens.is_empty() {
            assert!(sketch.is_zero(), "no tokens, yet {sketch:?}");
        }
        sketches.push(sketch);
    }
    assert_eq!(Sketch::from_tokens(&tokens, mode), sketches[1]);
    assert!(Sketch::of_version(0, &tokens, mode).is_none());
    assert!(Sketch::of_version(3, &tokens, mode).is_none());
    let other = Sketch::from_tokens(&tokens, other_mode);
    let similarity = sketches[1].similarity(&other);
    assert!((-1.0001..=1.0001).contains(&similarity), "{similarity}");
    assert_eq!(similarity, other.similarity(&sketches[1]));
    if let Some(decoded) = Sketch::from_base64url(&text) {
        assert_eq!(
            Sketch::from_base64url(&decoded.to_base64url()),
            Some(decoded)
        );
    }

    let table = Table::embedded().expect("the embedded table parses");
    assert_table_reads(table, &text, &tokens);
    let built = table_from(rest);
    let parsed =
        Table::parse(&built).unwrap_or_else(|e| panic!("a well-formed table was refused: {e}"));
    assert_table_reads(&parsed, &text, &tokens);
    if let Ok(raw) = Table::parse(rest) {
        assert_table_reads(&raw, &text, &tokens);
    }
}

/// WordPiece ids and selected rows stay inside the table, and reading them is safe.
fn assert_table_reads(table: &Table<'_>, text: &str, tokens: &[Token]) {
    let rows = table.vocab.len() + MASK_ROWS;
    let ids = table.vocab.encode(text);
    assert_eq!(ids, table.vocab.encode(text), "WordPiece is deterministic");
    assert!(ids.iter().all(|id| (*id as usize) < table.vocab.len()));
    for_each_row(table, tokens, |id, _| {
        assert!((id as usize) < rows, "row {id} outside {rows} rows");
        let (_, direction) = table.row(id);
        assert_eq!(direction.len(), SKETCH_DIMS);
    });
}

/// A small well-formed table: `[UNK]` and the input's words as the vocabulary, weights and
/// directions cycled from the input bytes.
fn table_from(data: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(data);
    let mut vocab = vec!["[UNK]"];
    vocab.extend(text.split_whitespace().take(64));
    let vocab_text = vocab.join("\n");
    let rows = vocab.len() + MASK_ROWS;
    let mut out = Vec::new();
    out.extend_from_slice(b"CSKT");
    for field in [1, SKETCH_DIMS, vocab.len(), MASK_ROWS, 0, vocab_text.len()] {
        out.extend_from_slice(&(field as u32).to_le_bytes());
    }
    out.extend_from_slice(vocab_text.as_bytes());
    let filler = |i: usize| data.get(i % data.len().max(1)).copied().unwrap_or(1);
    out.extend((0..2 * rows).map(filler));
    out.extend((0..SKETCH_DIMS * rows).map(|i| filler(i + 7)));
    out
}
