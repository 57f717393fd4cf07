//! Banking77 (`data/intent`, CC-BY-4.0): labelled banking questions, the intent corpus that
//! the sketch, cohort and end-to-end tests measure grouping on. Read with the `csv` crate
//! (questions may hold commas and quotes). Behind the `banking77` feature: file input for
//! tests and examples only, never part of the filter.

use std::path::{Path, PathBuf};

/// One labelled question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub text: String,
    /// The intent, e.g. `card_arrival`.
    pub label: String,
}

/// `data/intent/<file>` in this repository (e.g. `banking77_test.csv`).
pub fn path(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../data/intent")
        .join(file)
}

/// Every row of `data/intent/<file>`, in file order (the files are sorted by intent).
pub fn load(file: &str) -> Vec<Row> {
    let path = path(file);
    let mut reader = csv::Reader::from_path(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (data/intent is part of the repository)",
            path.display()
        )
    });
    reader
        .records()
        .map(|record| {
            let record = record.unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            Row {
                text: record[0].to_owned(),
                label: record[1].to_owned(),
            }
        })
        .collect()
}

/// The test split (3,080 questions, 77 intents × 40).
pub fn test_split() -> Vec<Row> {
    load("banking77_test.csv")
}

/// The test split's questions grouped by intent, intents in file order.
pub fn test_by_intent() -> Vec<(String, Vec<String>)> {
    let mut by: Vec<(String, Vec<String>)> = Vec::new();
    for row in test_split() {
        match by.iter_mut().find(|(label, _)| *label == row.label) {
            Some((_, texts)) => texts.push(row.text),
            None => by.push((row.label, vec![row.text])),
        }
    }
    by
}
