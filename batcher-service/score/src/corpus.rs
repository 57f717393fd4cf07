//! Scoring a corpus of real prompts.
//!
//! Prompts are taken in order, as they would arrive. For each one:
//! - **prefix reuse**: its leading blocks (chained hashes of the canonical prompt, as the
//!   filter computes them; 64-byte blocks by default ≈ 16 tokens, vLLM's block size, finer
//!   than the filter's 256 bytes) that an earlier prompt already produced — what an engine
//!   with an unbounded prefix cache would not recompute — over all blocks;
//! - **cohort concentration**: whether its sketch joins an earlier prompt's cohort
//!   (cosine ≥ the join threshold, 0.5 as the filter's default `batch-threshold`).
//!
//! `score = 0.8 × prefix reuse + 0.2 × concentration`: prefix reuse is compute the engine
//! saves directly; concentration is what co-batching and prefetch can additionally
//! exploit (same intent, different prompt text).

use cohort_fingerprint::Sketch;
use serde::Serialize;
use std::collections::HashSet;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Default block size for scoring, bytes (≈ 16 tokens).
pub const DEFAULT_BLOCK_BYTES: usize = 64;

/// Chained hashes of `block_bytes` blocks of `canonical` (the last block may be short).
pub fn chained_blocks(canonical: &[u8], block_bytes: usize) -> Vec<u64> {
    let mut previous = 0;
    canonical
        .chunks(block_bytes.max(1))
        .map(|block| {
            previous = xxh3_64_with_seed(block, previous);
            previous
        })
        .collect()
}

/// Sketch similarity at which a prompt joins an existing cohort.
pub const JOIN_THRESHOLD: f32 = 0.5;
const PREFIX_WEIGHT: f64 = 0.8;

/// Accumulates prompts of one group (a file, a template, a service).
#[derive(Debug, Default)]
pub struct CorpusScorer {
    seen_blocks: HashSet<u64>,
    cohorts: Vec<Sketch>,
    prompts: usize,
    blocks: usize,
    reused_blocks: usize,
    /// Prompts that reused at least one block.
    hit_prompts: usize,
    joined: usize,
}

/// The result for one group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CorpusScore {
    pub prompts: usize,
    pub blocks: usize,
    pub reused_blocks: usize,
    pub cohorts: usize,
    /// Share of blocks an earlier prompt already computed.
    pub prefix_reuse: f64,
    /// Share of prompts that reused at least one block.
    pub hit_ratio: f64,
    /// Share of prompts that joined an earlier cohort.
    pub concentration: f64,
    pub score: f64,
}

impl CorpusScorer {
    /// Adds one prompt: its chained block hashes and its sketch (`None` when it has no
    /// intent text).
    pub fn add(&mut self, blocks: &[u64], sketch: Option<&Sketch>) {
        self.prompts += 1;
        self.blocks += blocks.len();
        // Chained hashes: a block is reusable only if every block before it is.
        let reused = blocks
            .iter()
            .take_while(|b| self.seen_blocks.contains(b))
            .count();
        self.reused_blocks += reused;
        self.hit_prompts += usize::from(reused > 0);
        self.seen_blocks.extend(blocks.iter().copied());
        if let Some(sketch) = sketch.filter(|s| !s.is_zero()) {
            if self
                .cohorts
                .iter()
                .any(|c| c.similarity(sketch) >= JOIN_THRESHOLD)
            {
                self.joined += 1;
            } else {
                self.cohorts.push(*sketch);
            }
        }
    }

    pub fn finish(&self) -> CorpusScore {
        let ratio = |a: usize, b: usize| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        let prefix_reuse = ratio(self.reused_blocks, self.blocks);
        let concentration = ratio(self.joined, self.prompts);
        CorpusScore {
            prompts: self.prompts,
            blocks: self.blocks,
            reused_blocks: self.reused_blocks,
            cohorts: self.cohorts.len(),
            prefix_reuse,
            hit_ratio: ratio(self.hit_prompts, self.prompts),
            concentration,
            score: PREFIX_WEIGHT * prefix_reuse + (1.0 - PREFIX_WEIGHT) * concentration,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_fingerprint::{IntentSketch, SemanticMode};

    fn add(scorer: &mut CorpusScorer, prompt: &str, question: &str) {
        let sketch = IntentSketch::of_text(question, SemanticMode::Intent).sketch;
        scorer.add(&chained_blocks(prompt.as_bytes(), 256), Some(&sketch));
    }

    #[test]
    fn a_shared_instruction_first_scores_high_and_variable_first_low() {
        let instruction = "You are the support assistant of the Example Bank. ".repeat(20);
        let questions = [
            "how do I reset my card pin",
            "how can I reset the pin of my card",
            "my card is blocked, how do I unblock it",
            "reset card pin please",
        ];
        let mut first = CorpusScorer::default();
        let mut last = CorpusScorer::default();
        for q in questions {
            add(&mut first, &format!("{instruction}\n{q}"), q);
            add(&mut last, &format!("{q}\n{instruction}"), q);
        }
        let (good, bad) = (first.finish(), last.finish());
        assert!(good.prefix_reuse >= 0.5, "{good:?}");
        assert_eq!(bad.prefix_reuse, 0.0, "{bad:?}");
        assert!(good.score > 0.5 && bad.score < 0.3, "{good:?} {bad:?}");
        assert_eq!(good.concentration, bad.concentration, "same questions");
        assert!(good.cohorts < 4);
    }

    #[test]
    fn an_empty_corpus_scores_zero() {
        let score = CorpusScorer::default().finish();
        assert_eq!((score.prompts, score.score), (0, 0.0));
    }
}
