//! How well the sketch groups intents, on Banking77 (data/intent, CC-BY-4.0).
//!
//! Prints, per semantic mode: 1-NN intent accuracy of test queries against the train
//! split as the store (the same protocol as the semantic-quality issue's table), and the
//! mean similarity of same-intent vs different-intent pairs. Asserts the sketch is far
//! from chance and that same-intent pairs are clearly closer than different-intent ones.
//! Run with `--nocapture` to see the numbers.

use cohort_fingerprint::{IntentSketch, SemanticMode, Sketch};
use std::path::Path;

struct Labelled {
    sketch: Sketch,
    label: String,
}

fn load(file: &str, mode: SemanticMode, limit: usize) -> Vec<Labelled> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../data/intent")
        .join(file);
    let mut reader = csv::Reader::from_path(&path).expect("data/intent is part of the repository");
    reader
        .records()
        .take(limit)
        .map(|row| {
            let row = row.expect("valid CSV");
            Labelled {
                sketch: IntentSketch::of_text(&row[0], mode).sketch,
                label: row[1].to_owned(),
            }
        })
        .collect()
}

/// Spreads `limit` queries over the whole test file (it is sorted by intent).
fn every_nth(items: Vec<Labelled>, limit: usize) -> Vec<Labelled> {
    let step = (items.len() / limit).max(1);
    items.into_iter().step_by(step).take(limit).collect()
}

fn one_nn_accuracy(store: &[Labelled], queries: &[Labelled]) -> f64 {
    let hits = queries
        .iter()
        .filter(|q| {
            let best = store
                .iter()
                .max_by(|a, b| {
                    q.sketch
                        .similarity(&a.sketch)
                        .total_cmp(&q.sketch.similarity(&b.sketch))
                })
                .expect("non-empty store");
            best.label == q.label
        })
        .count();
    hits as f64 / queries.len() as f64
}

fn same_vs_different(items: &[Labelled]) -> (f64, f64) {
    let (mut same, mut same_n, mut diff, mut diff_n) = (0.0, 0usize, 0.0, 0usize);
    for (i, a) in items.iter().enumerate() {
        for b in &items[i + 1..] {
            let s = f64::from(a.sketch.similarity(&b.sketch));
            if a.label == b.label {
                same += s;
                same_n += 1;
            } else {
                diff += s;
                diff_n += 1;
            }
        }
    }
    (same / same_n as f64, diff / diff_n as f64)
}

#[test]
fn banking77_intents_group_together() {
    println!(
        "\nBanking77, 500 test queries vs 10,003 train entries (1-NN, cosine of int8 sketches)"
    );
    println!(
        "{:<8} {:>10} {:>14} {:>14}",
        "mode", "1-NN acc", "same-intent", "diff-intent"
    );
    for mode in [
        SemanticMode::Intent,
        SemanticMode::Topic,
        SemanticMode::Hybrid,
    ] {
        let store = load("banking77_train.csv", mode, usize::MAX);
        let queries = every_nth(load("banking77_test.csv", mode, usize::MAX), 500);
        let accuracy = one_nn_accuracy(&store, &queries);
        let (same, diff) = same_vs_different(&queries);
        println!(
            "{:<8} {:>10.3} {:>14.3} {:>14.3}",
            mode.as_str(),
            accuracy,
            same,
            diff
        );
        assert!(
            accuracy > 0.25,
            "{mode:?}: 1-NN accuracy {accuracy:.3} is near chance (0.013)"
        );
        assert!(
            same > diff + 0.15,
            "{mode:?}: same-intent {same:.3} vs different {diff:.3}"
        );
    }
}
