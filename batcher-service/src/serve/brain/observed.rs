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
//! - **Pending.** What the batcher sent a replica counts there too, where longer, until
//!   its engine can have published it: within the replica's own time to first byte (p95
//!   of its recent reports, [`super::replica_stats`]) plus [`PUBLISH_GRACE_MS`], once it
//!   has [`PENDING_MIN_SAMPLES`] reports; `[kv_events] pending_ms` before that, and as the
//!   longest window. The windows are recomputed at most every [`PENDING_REFRESH_MS`].
//! - **Clears.** Every decision (every mode) first drops the modelled residency of a
//!   replica whose engine cleared its whole cache (`AllBlocksCleared`, a restart) since the
//!   last decision: what was sent there before is gone.

use super::{lock, read, Brain};
use cohort_batcher_core::policy::{Observed, Policy};
use cohort_prompt_tokens::PromptKeys;
use std::sync::atomic::Ordering;

/// Beyond a replica's time to first byte, how long its engine may take to publish the
/// blocks it prefilled (a scheduler step and the events' way here).
pub const PUBLISH_GRACE_MS: u64 = 250;
/// First-byte reports a replica needs before its own times set its pending window.
pub const PENDING_MIN_SAMPLES: usize = 20;
/// How often the pending windows are recomputed from the reports.
pub const PENDING_REFRESH_MS: u64 = 1_000;

/// The pending window of each slot, as last computed.
#[derive(Debug, Default)]
pub(super) struct PendingWindows {
    computed_ms: Option<u64>,
    per_slot: Vec<u64>,
}

impl Brain {
    /// Per slot, the request's leading fingerprint blocks (`blocks` of them) that the
    /// slot's engine holds by its healthy stream, with the slot's pending window; `None`
    /// where the modelled residency stands. Empty without the prompt's keys or without
    /// streams.
    pub(super) fn observed(
        &self,
        prompt: Option<&PromptKeys>,
        blocks: usize,
        now_ms: u64,
    ) -> Vec<Option<Observed>> {
        let Some(prompt) = prompt else {
            return Vec::new();
        };
        if self.kv_events.is_empty() {
            return Vec::new();
        }
        let windows = self.pending_windows(now_ms);
        let members = read(&self.members);
        let mut observed = vec![None; members.slots()];
        for (slot, member) in members.held() {
            let window = windows.get(slot).copied().unwrap_or(self.kv_pending_ms);
            observed[slot] = self
                .kv_events
                .get(&member.name)
                .and_then(|stream| stream.held_prefix(&prompt.keys))
                .map(|held| Observed {
                    held: fingerprint_blocks(prompt, held, blocks),
                    pending_since_ms: now_ms.saturating_sub(window),
                });
        }
        let counter = if observed.iter().any(Option::is_some) {
            &self.counters.decisions_observed
        } else {
            &self.counters.decisions_modelled
        };
        counter.fetch_add(1, Ordering::Relaxed);
        observed
    }

    /// Each slot's pending window at `now_ms`, ms (see the module documentation).
    fn pending_windows(&self, now_ms: u64) -> Vec<u64> {
        let mut pending = lock(&self.pending);
        let fresh = pending
            .computed_ms
            .is_some_and(|at| now_ms < at.saturating_add(PENDING_REFRESH_MS));
        if !fresh {
            let slots = read(&self.members).slots();
            let stats = lock(&self.replica_stats);
            pending.per_slot = (0..slots)
                .map(|slot| {
                    let ttft = stats.figures(slot, now_ms).ttft;
                    pending_window(ttft.map(|t| (t.p95_ms, t.samples)), self.kv_pending_ms)
                })
                .collect();
            pending.computed_ms = Some(now_ms);
        }
        pending.per_slot.clone()
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

/// A replica's pending window: its time to first byte (p95, with the reports it came from)
/// plus [`PUBLISH_GRACE_MS`] once it has enough reports, at most `cap_ms`.
fn pending_window(ttft: Option<(u32, usize)>, cap_ms: u64) -> u64 {
    match ttft {
        Some((p95_ms, samples)) if samples >= PENDING_MIN_SAMPLES => {
            (u64::from(p95_ms) + PUBLISH_GRACE_MS).min(cap_ms)
        }
        _ => cap_ms,
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
    use super::{fingerprint_blocks, pending_window, PENDING_MIN_SAMPLES, PUBLISH_GRACE_MS};

    #[test]
    fn a_replicas_pending_window_is_its_time_to_first_byte_once_it_has_reports() {
        assert_eq!(pending_window(None, 5_000), 5_000);
        assert_eq!(
            pending_window(Some((300, PENDING_MIN_SAMPLES - 1)), 5_000),
            5_000
        );
        assert_eq!(
            pending_window(Some((300, PENDING_MIN_SAMPLES)), 5_000),
            300 + PUBLISH_GRACE_MS
        );
        assert_eq!(
            pending_window(Some((9_000, 100)), 5_000),
            5_000,
            "at most the cap"
        );
    }

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
