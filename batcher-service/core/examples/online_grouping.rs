//! How the batcher's online clustering (assign mode's cohorts, [`Cohorts::observe`])
//! groups paraphrases of one intent, beside the same question asked of the filter's
//! global codebook: what share of each intent's prompts lands in its largest cohort.
//!
//! ```sh
//! cargo run --release -p cohort-batcher-core --example online_grouping
//! ```
//!
//! Banking77's test prompts (`data/intent/banking77_test.csv`), intents interleaved as
//! traffic would be, one tenant, at each threshold: the first 5 intents × 20 prompts (the
//! issue's end-to-end set) and all 77 × 40. Prints the number of cohorts and, over the
//! intents, the least, median and mean share of an intent in its largest cohort, for the
//! online clustering and for the filter's codebook ids at the same threshold.

use cohort_batcher_core::cohorts::Cohorts;
use cohort_batcher_core::store::CpuStore;
use cohort_fingerprint::{IntentSketch, SemanticMode};
use std::collections::{BTreeSet, HashMap};

fn by_intent() -> Vec<Vec<String>> {
    cohort_fingerprint::banking77::test_by_intent()
        .into_iter()
        .map(|(_, texts)| texts)
        .collect()
}

/// Cohorts, then the least, median and mean share of an intent in its largest cohort.
fn summary(joined: &[(usize, u32)], intents: usize) -> String {
    let mut shares: Vec<f64> = (0..intents)
        .map(|intent| {
            let mut sizes: HashMap<u32, usize> = HashMap::new();
            for (_, cohort) in joined.iter().filter(|(i, _)| *i == intent) {
                *sizes.entry(*cohort).or_default() += 1;
            }
            let total: usize = sizes.values().sum();
            *sizes.values().max().unwrap_or(&0) as f64 / total.max(1) as f64
        })
        .collect();
    shares.sort_by(f64::total_cmp);
    let distinct: BTreeSet<u32> = joined.iter().map(|(_, c)| *c).collect();
    format!(
        "{} | {:.2} | {:.2} | {:.2}",
        distinct.len(),
        shares[0],
        shares[shares.len() / 2],
        shares.iter().sum::<f64>() / shares.len() as f64
    )
}

fn main() {
    let intents = by_intent();
    println!("| threshold | intents × prompts | online: cohorts | least | median | mean share | codebook: cohorts | least | median | mean share |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for threshold in [0.3f32, 0.4, 0.5, 0.6, 0.7] {
        for (count, per) in [(5usize, 20usize), (77, 40)] {
            let mut cohorts = Cohorts::new(CpuStore::with_capacity(100_000), 3600);
            let mut online: Vec<(usize, u32)> = Vec::new();
            let mut codebook: Vec<(usize, u32)> = Vec::new();
            for k in 0..per {
                for (intent, texts) in intents.iter().take(count).enumerate() {
                    if let Some(text) = texts.get(k) {
                        let intent_sketch = IntentSketch::of_text(text, SemanticMode::Intent);
                        let membership = cohorts.observe(1, &intent_sketch.sketch.0, threshold, 10);
                        online.push((intent, membership.cohort));
                        codebook.push((intent, intent_sketch.cohort(threshold)));
                    }
                }
            }
            println!(
                "| {threshold} | {count} × {per} | {} | {} |",
                summary(&online, count),
                summary(&codebook, count)
            );
        }
    }
}
