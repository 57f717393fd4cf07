//! The Rust WordPiece tokenizer gives the teacher tokenizer's ids, text for text.
//!
//! `data/sketch/wordpiece_parity.jsonl` holds 2,500 real prompt segments and a dozen
//! edge cases (accents, CJK, emoji, combining marks, invisible characters, long words)
//! with the ids HF `tokenizers` gave for all-MiniLM-L6-v2's tokenizer.json
//! (`cohort_tools/distill/parity_fixture.py`). Every text must match exactly.

use cohort_fingerprint::sketch::table::Table;
use std::path::Path;

#[derive(serde::Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
}

#[test]
fn wordpiece_matches_the_teacher_tokenizer() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/sketch/wordpiece_parity.jsonl");
    let fixture = std::fs::read_to_string(&path).expect("fixture is part of the repository");
    let vocab = &Table::embedded().expect("embedded table").vocab;
    let mut mismatches = Vec::new();
    let mut count = 0;
    let mut pieces = 0;
    for line in fixture.lines() {
        let case: Case = serde_json::from_str(line).expect("fixture line");
        let got = vocab.encode(&case.text);
        if got != case.ids {
            mismatches.push(case.text.chars().take(80).collect::<String>());
        }
        count += 1;
        pieces += case.ids.len();
    }
    assert!(count >= 2_500, "fixture has {count} texts");
    assert!(pieces > 40_000, "fixture has only {pieces} pieces");
    assert!(
        mismatches.is_empty(),
        "{} of {count} texts differ, e.g. {:?}",
        mismatches.len(),
        &mismatches[..mismatches.len().min(5)]
    );
}
