//! How well the sketch groups intents, on Banking77 (data/intent, CC-BY-4.0).
//!
//! Prints, per sketch version and semantic mode: 1-NN intent accuracy of test queries
//! against the train split as the store (the same protocol as the semantic-quality issue's
//! table), and the mean similarity of same-intent vs different-intent pairs. Asserts the
//! distilled sketch (version 2) stays near its measured accuracy (Banking77 was never part
//! of its training corpus), that the hashed one (version 1) is far from chance, and that
//! same-intent pairs are clearly closer than different-intent ones. Run with `--nocapture`
//! to see the numbers.

use cohort_fingerprint::{mask, normalize, IntentSketch, SemanticMode, Sketch};

struct Labelled {
    sketch: Sketch,
    label: String,
}

fn load(file: &str, version: u32, mode: SemanticMode, limit: usize) -> Vec<Labelled> {
    cohort_fingerprint::banking77::load(file)
        .into_iter()
        .take(limit)
        .map(|row| Labelled {
            sketch: Sketch::of_version(
                version,
                &mask::tokenize(&normalize::normalize(&row.text)),
                mode,
            )
            .expect("known version"),
            label: row.label,
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

/// Lowest 1-NN accuracy each (version, mode) may fall to on these 500 queries.
fn floor(version: u32, mode: SemanticMode) -> f64 {
    match (version, mode) {
        (2, SemanticMode::Intent) => V2_INTENT_FLOOR,
        (2, _) => 0.72,
        _ => 0.25,
    }
}

const V2_INTENT_FLOOR: f64 = 0.75;

#[test]
fn banking77_intents_group_together() {
    println!(
        "\nBanking77, 500 test queries vs 10,003 train entries (1-NN, cosine of int8 sketches)"
    );
    println!(
        "{:<10} {:>10} {:>14} {:>14}",
        "version", "1-NN acc", "same-intent", "diff-intent"
    );
    for version in [2, 1] {
        for mode in [
            SemanticMode::Intent,
            SemanticMode::Topic,
            SemanticMode::Hybrid,
        ] {
            let store = load("banking77_train.csv", version, mode, usize::MAX);
            let queries = every_nth(load("banking77_test.csv", version, mode, usize::MAX), 500);
            let accuracy = one_nn_accuracy(&store, &queries);
            let (same, diff) = same_vs_different(&queries);
            println!(
                "v{version} {:<7} {:>10.3} {:>14.3} {:>14.3}",
                mode.as_str(),
                accuracy,
                same,
                diff
            );
            assert!(
                accuracy > floor(version, mode),
                "v{version} {mode:?}: 1-NN accuracy {accuracy:.3} (chance 0.013)"
            );
            assert!(
                same > diff + 0.15,
                "v{version} {mode:?}: same-intent {same:.3} vs different {diff:.3}"
            );
        }
    }
}

const TEMPLATES: [&str; 5] = [
    "Hi, please refund order {num} for {name}, the receipt is at {url}",
    "Why was my payment of ${num} to {name} declined? Ticket {id}",
    "Can you send the invoice {id} to {email} before {date}?",
    "How do I reset the password for {email}? I tried {num} times from {url}",
    "Book a table for {num} people at {name} on {date} and text {name} the link {url}",
];
const NAMES: [&str; 5] = [
    "John",
    "Mary Ann Smith",
    "Lisbon",
    "Oleksandr Kovalenko",
    "Dr Zhou",
];
const NUMS: [&str; 5] = ["12", "1,299.50", "3", "40000", "7.5"];
const URLS: [&str; 5] = [
    "https://shop.example.com/r/12?x=1",
    "http://a.io",
    "www.bank.example/help",
    "https://x.y/z#frag",
    "ftp://files.example.org/a.pdf",
];
const EMAILS: [&str; 5] = [
    "jane@x.com",
    "bob.s@corp.co.uk",
    "a+b@c.io",
    "first.last@sub.example.org",
    "z@q.de",
];
const IDS: [&str; 5] = [
    "550e8400-e29b-41d4-a716-446655440000",
    "AB12CD9",
    "INV-2024-0042",
    "deadbeef1234",
    "X9Z8Y7",
];
const DATES: [&str; 5] = ["2024-06-14", "12/05/2024", "14.06.2024", "10:30", "3rd"];

fn fill(template: &str, i: usize) -> String {
    template
        .replacen("{name}", NAMES[i], 1)
        .replacen("{name}", NAMES[(i + 2) % 5], 1)
        .replace("{num}", NUMS[i])
        .replace("{url}", URLS[i])
        .replace("{email}", EMAILS[i])
        .replace("{id}", IDS[i])
        .replace("{date}", DATES[i])
}

#[test]
fn one_template_with_different_variables_gives_one_sketch() {
    println!("\nTemplates x 5 fillings (names, numbers, URLs, e-mails, ids, dates)");
    println!(
        "{:<8} {:>22} {:>26}",
        "mode", "within-template sims", "across-template sim max"
    );
    for mode in [
        SemanticMode::Intent,
        SemanticMode::Topic,
        SemanticMode::Hybrid,
    ] {
        let sketches: Vec<Vec<IntentSketch>> = TEMPLATES
            .iter()
            .map(|t| {
                (0..5)
                    .map(|i| IntentSketch::of_text(&fill(t, i), mode))
                    .collect()
            })
            .collect();
        for (template, fills) in TEMPLATES.iter().zip(&sketches) {
            for other in &fills[1..] {
                assert_eq!(
                    other.sketch,
                    fills[0].sketch,
                    "{template}: {:?} vs {:?}",
                    other.masked_text(),
                    fills[0].masked_text()
                );
            }
        }
        let mut across: f32 = -1.0;
        for (i, a) in sketches.iter().enumerate() {
            for b in &sketches[i + 1..] {
                across = across.max(a[0].sketch.similarity(&b[0].sketch));
            }
        }
        println!(
            "{:<8} {:>22} {:>26.3}",
            mode.as_str(),
            "1.000 (identical)",
            across
        );
        assert!(
            across < 0.8,
            "{mode:?}: different templates too close ({across:.3})"
        );
    }
}
