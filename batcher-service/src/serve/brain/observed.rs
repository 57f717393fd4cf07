//! The engines' own account of their caches, in decisions (docs/KV-EVENTS.md, "Exact
//! residency in decisions").
//!
//! - **Held prefixes.** Where the batcher has the request's block keys (the endpoint
//!   picker, [`cohort_prompt_tokens`]), each slot whose replica has a healthy KV events
//!   stream answers how many of them its engine holds as a leading run. The policy counts
//!   in the fingerprint's blocks (bytes of the canonical prompt), so the engine's answer
//!   becomes the same share of those: all of them when the engine holds every full block
//!   of the prompt (its partial last block is never cached), else the held tokens' share
//!   (of the estimated total, for a prompt keyed by its beginning only).
//! - **Clears.** Every decision (every mode) first drops the modelled residency of a
//!   replica whose engine cleared its whole cache (`AllBlocksCleared`, a restart) since the
//!   last decision: what was sent there before is gone.

use super::{lock, read, Brain};
use cohort_batcher_core::policy::Policy;
use cohort_prompt_tokens::PromptKeys;
use std::sync::atomic::Ordering;

impl Brain {
    /// Per slot, the request's leading fingerprint blocks (`blocks` of them) that the
    /// slot's engine holds by its healthy stream, `None` where the modelled residency
    /// stands. Empty without the prompt's keys or without streams.
    pub(super) fn observed(
        &self,
        prompt: Option<&PromptKeys>,
        blocks: usize,
    ) -> Vec<Option<usize>> {
        let Some(prompt) = prompt else {
            return Vec::new();
        };
        if self.kv_events.is_empty() {
            return Vec::new();
        }
        let members = read(&self.members);
        let mut observed = vec![None; members.slots()];
        for (slot, member) in members.held() {
            observed[slot] = self
                .kv_events
                .get(&member.name)
                .and_then(|stream| stream.held_prefix(&prompt.keys))
                .map(|held| fingerprint_blocks(prompt, held, blocks));
        }
        let counter = if observed.iter().any(Option::is_some) {
            &self.counters.decisions_observed
        } else {
            &self.counters.decisions_modelled
        };
        counter.fetch_add(1, Ordering::Relaxed);
        observed
    }

    /// Drops the modelled residency of every slot whose engine cleared its cache since
    /// the last call.
    pub(super) fn apply_engine_clears(&self, policy: &mut Policy) {
        if self.kv_events.is_empty() {
            return;
        }
        let members = read(&self.members);
        let mut seen = lock(&self.engine_clears);
        for (slot, member) in members.held() {
            let Some(stream) = self.kv_events.get(&member.name) else {
                continue;
            };
            let clears = stream.engine_clears();
            let last = seen.entry(member.name.clone()).or_insert(0);
            if clears > *last {
                *last = clears;
                policy.cleared(slot);
            }
        }
    }
}

/// The engine's `held` leading blocks of `prompt`, as a count of the fingerprint's
/// `blocks`.
fn fingerprint_blocks(prompt: &PromptKeys, held: usize, blocks: usize) -> usize {
    if prompt.whole && held > 0 && held >= prompt.keys.len() {
        blocks
    } else {
        (blocks as f64 * prompt.share_of(held)).floor() as usize
    }
}

#[cfg(test)]
mod tests {
    use super::fingerprint_blocks;
    use cohort_prompt_tokens::PromptKeys;

    #[test]
    fn the_engines_blocks_become_the_same_share_of_the_fingerprints() {
        // 100 tokens in blocks of 16: 6 full blocks (96 tokens), 4 tokens never cached.
        let prompt = PromptKeys {
            keys: (0..6).collect(),
            tokens: 100,
            block_size: 16,
            whole: true,
        };
        assert_eq!(fingerprint_blocks(&prompt, 0, 10), 0);
        assert_eq!(
            fingerprint_blocks(&prompt, 3, 10),
            4,
            "48 of 100 tokens: 4.8 of 10 blocks"
        );
        assert_eq!(
            fingerprint_blocks(&prompt, 6, 10),
            10,
            "every full block: all of it"
        );
        let short = PromptKeys {
            keys: Vec::new(),
            tokens: 10,
            block_size: 16,
            whole: true,
        };
        assert_eq!(
            fingerprint_blocks(&short, 0, 1),
            0,
            "no full block: nothing held"
        );
        // Keys of a prompt's beginning only: holding them all is their share, not all.
        let cut = PromptKeys {
            whole: false,
            tokens: 960,
            ..prompt
        };
        assert_eq!(fingerprint_blocks(&cut, 6, 10), 1, "96 of 960 tokens");
    }
}
