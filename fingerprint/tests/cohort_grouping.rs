//! How the codebook's cohort ids group intents, on Banking77's test split (data/intent,
//! CC-BY-4.0; never part of the codebook's corpus).
//!
//! For each batch threshold level: the number of cohorts, purity and the share of
//! same-intent pairs that share an id. Asserts that the threshold runs coarse to fine (more
//! cohorts, purer ones, fewer shared pairs), and that the default level groups: the
//! sketch's sign signature, the id before the codebook, gave 3,002 ids to these 3,080
//! prompts and 0.1% of same-intent pairs shared one. `scripts/eval-sketch --grouping` has the
//! full table beside MiniLM's own codebook.
//!
//! And learned cohorts ([`cohort_fingerprint::learned`]) beside the codebook on the paraphrase
//! set, the first 20 test prompts of each of the first 5 intents, interleaved: the least
//! share of an intent in its largest cohort at each threshold; at the default, at least 80%
//! where the codebook puts 20%. Run with `--nocapture` to see the numbers.

use cohort_fingerprint::banking77;
use cohort_fingerprint::learned::{scope, Capacity, LearnedCohorts};
use cohort_fingerprint::{Codebook, IntentSketch, SemanticMode, TenantSalt};
use std::collections::{HashMap, HashSet};

fn banking77_test() -> Vec<(String, String)> {
    banking77::test_split()
        .into_iter()
        .map(|row| (row.text, row.label))
        .collect()
}

/// (cohorts, purity, share of same-intent pairs sharing an id).
fn grouping(codes: &[u32], labels: &[String]) -> (usize, f64, f64) {
    let mut table: HashMap<(u32, &str), usize> = HashMap::new();
    let mut per_label: HashMap<&str, usize> = HashMap::new();
    for (code, label) in codes.iter().zip(labels) {
        *table.entry((*code, label.as_str())).or_default() += 1;
        *per_label.entry(label.as_str()).or_default() += 1;
    }
    let mut majority: HashMap<u32, usize> = HashMap::new();
    for (&(code, _), &n) in &table {
        let best = majority.entry(code).or_default();
        *best = (*best).max(n);
    }
    let pairs = |n: usize| (n * n.saturating_sub(1) / 2) as f64;
    let shared: f64 = table.values().map(|&n| pairs(n)).sum();
    let all: f64 = per_label.values().map(|&n| pairs(n)).sum();
    let purity = majority.values().sum::<usize>() as f64 / codes.len() as f64;
    (majority.len(), purity, shared / all)
}

#[test]
fn the_threshold_runs_coarse_to_fine_and_the_default_groups_intents() {
    let rows = banking77_test();
    let sketches: Vec<IntentSketch> = rows
        .iter()
        .map(|(text, _)| IntentSketch::of_text(text, SemanticMode::Intent))
        .collect();
    let labels: Vec<String> = rows.iter().map(|(_, label)| label.clone()).collect();
    let levels = Codebook::embedded().levels();
    let mut rows_out = Vec::new();
    for level in 0..levels {
        let threshold = 0.1 + 0.8 * level as f32 / (levels - 1) as f32;
        let codes: Vec<u32> = sketches.iter().map(|s| s.cohort(threshold)).collect();
        let (cohorts, purity, shared) = grouping(&codes, &labels);
        println!(
            "threshold {threshold:.2}: {cohorts} cohorts, purity {purity:.3}, \
             same-intent pairs sharing an id {shared:.3}"
        );
        rows_out.push((threshold, cohorts, purity, shared));
    }
    let (first, last) = (rows_out[0], rows_out[levels - 1]);
    assert!(first.1 < last.1, "more cohorts when finer");
    assert!(first.2 < last.2, "purer when finer");
    assert!(first.3 > last.3, "fewer shared pairs when finer");
    let default = rows_out
        .iter()
        .find(|r| (r.0 - 0.5).abs() < 1e-3)
        .expect("0.5 is a level");
    // Measured when the codebook was fitted: 60 cohorts, 0.33 of same-intent pairs.
    assert!(default.1 <= 128, "{} cohorts at the default", default.1);
    assert!(default.3 >= 0.25, "{:.3} of same-intent pairs", default.3);
}

#[test]
fn an_anchored_value_splits_the_cohort_and_a_masked_one_does_not() {
    // The recommendation template: the category selects the
    // behaviour, but a capitalised category mid-sentence is masked as a name.
    let categories = ["Electronics", "Gardening", "Books", "Toys", "Kitchen"];
    let cohorts = |anchored: bool| -> std::collections::BTreeSet<u32> {
        categories
            .iter()
            .map(|category| {
                let value = if anchored {
                    format!("\u{3010}{category}\u{3011}")
                } else {
                    (*category).to_owned()
                };
                let text = format!(
                    "Based on my purchase history of running shoes and socks, recommend {value} \
                     products I might like"
                );
                IntentSketch::of_text(&text, SemanticMode::Intent).cohort(0.5)
            })
            .collect()
    };
    assert_eq!(
        cohorts(false).len(),
        1,
        "one cohort: the category is masked"
    );
    assert_eq!(
        cohorts(true).len(),
        categories.len(),
        "one cohort per anchored category"
    );
    // The anchor's words count, not its spelling: case and spacing do not split a cohort.
    let a = IntentSketch::of_text(
        "recommend \u{3010}Home  Office\u{3011} desks",
        SemanticMode::Intent,
    );
    let b = IntentSketch::of_text(
        "recommend \u{3010}home office\u{3011} desks",
        SemanticMode::Intent,
    );
    assert_eq!(a.cohort(0.5), b.cohort(0.5));
    assert_ne!(
        a.cohort(0.5),
        cohort_fingerprint::sketch::codebook::NO_INTENT
    );
}

#[test]
fn cohorts_of_different_semantic_modes_are_kept_apart() {
    // `x-cohort-semantic-mode`: the codebook is one partition of sketch space, so a topic
    // sketch and an intent sketch can fall into one cell; the mode is mixed into the code
    // of topic and hybrid sketches (intent codes are the plain centroid codes, as before).
    let texts: Vec<String> = banking77_test()
        .into_iter()
        .take(200)
        .map(|(text, _)| text)
        .collect();
    let modes = [
        SemanticMode::Intent,
        SemanticMode::Topic,
        SemanticMode::Hybrid,
    ];
    let codes: Vec<std::collections::BTreeSet<u32>> = modes
        .iter()
        .map(|&mode| {
            texts
                .iter()
                .map(|t| IntentSketch::of_text(t, mode).cohort(0.5))
                .collect()
        })
        .collect();
    for i in 0..modes.len() {
        for j in i + 1..modes.len() {
            assert!(
                codes[i].is_disjoint(&codes[j]),
                "{:?} and {:?} share a cohort",
                modes[i],
                modes[j]
            );
        }
    }
    assert!(
        codes[0].iter().all(|c| c >> 31 == 0),
        "intent codes are centroid codes"
    );
    // Within a mode, grouping is unchanged: as many cohorts as centroids reached.
    assert!(codes[1].len() > 1 && codes[1].len() < texts.len());
}

/// The first `per` prompts of each of the first `intents` intents, interleaved as traffic
/// would bring them, with the intent's index (the paraphrase set: 5 × 20).
fn interleaved(intents: usize, per: usize) -> Vec<(usize, String)> {
    let mut by_label: Vec<(String, Vec<String>)> = Vec::new();
    for (text, label) in banking77_test() {
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
