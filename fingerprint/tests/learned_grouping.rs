//! How learned cohorts ([`cohort_fingerprint::learned`]) group a tenant's bare prompts,
//! beside the codebook's ids, on Banking77's test split (data/intent, CC-BY-4.0).
//!
//! The set is issue 20's: the first 20 test prompts of each of the first 5 intents, the
//! intents interleaved as traffic would be, one tenant. The share of an intent in its
//! largest cohort, least over the intents, at each threshold; and at the default, the
//! learned cohorts put at least 80% of every intent in one cohort where the codebook puts
//! 20%. Run with `--nocapture` to see the table.

use cohort_fingerprint::learned::{scope, Capacity, LearnedCohorts};
use cohort_fingerprint::{IntentSketch, SemanticMode, TenantSalt};
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// The first `per` prompts of each of the first `intents` intents, interleaved, with the
/// intent's index.
fn interleaved(intents: usize, per: usize) -> Vec<(usize, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/intent/banking77_test.csv");
    let mut reader = csv::Reader::from_path(&path).expect("data/intent is part of the repository");
    let mut by_label: Vec<(String, Vec<String>)> = Vec::new();
    for row in reader.records() {
        let row = row.expect("valid CSV");
        let (text, label) = (row[0].to_owned(), row[1].to_owned());
        match by_label.iter_mut().find(|(l, _)| *l == label) {
            Some((_, texts)) => texts.push(text),
            None => by_label.push((label, vec![text])),
        }
    }
    let mut out = Vec::new();
    for k in 0..per {
        for (intent, (_, texts)) in by_label.iter().take(intents).enumerate() {
            out.push((intent, texts[k].clone()));
        }
    }
    out
}

/// Cohorts, and the least share of an intent in its largest cohort.
fn least_share(placed: &[(usize, u32)], intents: usize) -> (usize, f64) {
    let mut cohorts: HashSet<u32> = HashSet::new();
    let mut least = f64::MAX;
    for intent in 0..intents {
        let mut sizes: HashMap<u32, usize> = HashMap::new();
        for (_, code) in placed.iter().filter(|(i, _)| *i == intent) {
            *sizes.entry(*code).or_default() += 1;
            cohorts.insert(*code);
        }
        let total: usize = sizes.values().sum();
        least = least.min(*sizes.values().max().unwrap() as f64 / total as f64);
    }
    (cohorts.len(), least)
}

/// Places the prompts in order in a fresh table: each prompt's cohort code.
fn learned(prompts: &[(usize, String)], threshold: f32) -> Vec<(usize, u32)> {
    let salt = TenantSalt::default();
    let mut table = LearnedCohorts::default();
    prompts
        .iter()
        .map(|(intent, text)| {
            let sketch = IntentSketch::of_text(text, SemanticMode::Intent);
            let placed = table
                .place(
                    scope(salt, &sketch, threshold),
                    &sketch.sketch,
                    threshold,
                    Capacity::default(),
                    || sketch.cohort(threshold),
                )
                .expect("every prompt has intent words");
            (*intent, placed.code)
        })
        .collect()
}

#[test]
fn learned_cohorts_keep_each_intent_together_where_the_codebook_splits_it() {
    let prompts = interleaved(5, 20);
    println!("| threshold | learned: cohorts | least share | codebook: cohorts | least share |");
    println!("|---|---|---|---|---|");
    let mut cohorts_by_threshold = Vec::new();
    for threshold in [0.3f32, 0.4, 0.5, 0.6, 0.7] {
        let (learned_cohorts, learned_least) = least_share(&learned(&prompts, threshold), 5);
        let codebook: Vec<(usize, u32)> = prompts
            .iter()
            .map(|(intent, text)| {
                let sketch = IntentSketch::of_text(text, SemanticMode::Intent);
                (*intent, sketch.cohort(threshold))
            })
            .collect();
        let (codebook_cohorts, codebook_least) = least_share(&codebook, 5);
        println!(
            "| {threshold} | {learned_cohorts} | {learned_least:.2} | {codebook_cohorts} | {codebook_least:.2} |"
        );
        cohorts_by_threshold.push(learned_cohorts);
        if threshold == 0.5 {
            assert!(
                learned_least >= 0.8,
                "at the default, every intent ≥ 80% in one cohort: {learned_least:.2}"
            );
            assert!(
                codebook_least < learned_least,
                "the codebook splits more: {codebook_least:.2}"
            );
        }
    }
    // A higher threshold gives more, smaller cohorts.
    assert!(
        cohorts_by_threshold.windows(2).all(|w| w[0] <= w[1]),
        "{cohorts_by_threshold:?}"
    );
    assert!(cohorts_by_threshold[0] < cohorts_by_threshold[4]);
}
