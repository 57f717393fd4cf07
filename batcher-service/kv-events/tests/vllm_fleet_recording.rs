//! The vLLM fleet's streams, replayed: `tests/fixtures/vllm/fleet/replica-<i>.jsonl` hold what
//! each of the two vLLM 0.32.0 CPU replicas of `scripts/bench-peers --preset vllm` published
//! while the cohort-epp-events contender ran (Gemma 3 270M, block size 32, 576 KV blocks:
//! real traffic under cache pressure, from the reset before the contender to its end).
//!
//! Checked on each replica's stream: the sequence numbers run without a gap from the
//! recording's first; every payload decodes, every store is of 32-token blocks in the main
//! tier and every full-attention store is keyed (a sliding-window group's stores may carry
//! more tokens than hashes: skipped with their group); the contender's run starts with the
//! reset (`AllBlocksCleared`); the fleet evicts (its caches are under pressure); and after
//! every batch the residency index holds exactly the blocks an independent replay of the
//! engine's own hashes says the full-attention group holds.
#![cfg(feature = "testing")]

use cohort_kv_events::decode::{decode, KvEvent};
use cohort_kv_events::frames;
use cohort_kv_events::residency::{ApplyReport, Residency};
use cohort_kv_events::testing::recording;
use std::collections::{HashMap, HashSet};

const BLOCK_SIZE: u32 = 32;
const REPLICAS: [&str; 2] = ["fleet/replica-0.jsonl", "fleet/replica-1.jsonl"];

/// The engine's own account, from its hashes alone: the full-attention groups' blocks stored
/// (on a parent held, or at a prompt's start) and not removed since, emptied by a reset.
#[derive(Default)]
struct EngineHashes {
    held: HashSet<u64>,
    sliding: HashSet<u32>,
}

impl EngineHashes {
    fn apply(&mut self, event: &KvEvent) {
        match event {
            KvEvent::Stored(s) => {
                let group = s.group_idx.unwrap_or(0);
                if s.sliding_window.is_some()
                    || s.spec_kind
                        .as_deref()
                        .is_some_and(|k| k.contains("sliding") || k.contains("local"))
                {
                    self.sliding.insert(group);
                    return;
                }
                if s.parent.is_none_or(|p| self.held.contains(&p)) {
                    self.held.extend(&s.block_hashes);
                }
            }
            KvEvent::Removed(r) => {
                if !self.sliding.contains(&r.group_idx.unwrap_or(0)) {
                    for hash in &r.block_hashes {
                        self.held.remove(hash);
                    }
                }
            }
            KvEvent::AllCleared => self.held.clear(),
        }
    }
}

#[test]
fn each_replicas_stream_replays_to_the_blocks_its_engine_holds() {
    let mut evictions = 0;
    for name in REPLICAS {
        let messages = recording(name);
        assert!(messages.len() > 10, "{name}: {} messages", messages.len());
        let mut residency = Residency::new(BLOCK_SIZE, "GPU");
        let mut engine = EngineHashes::default();
        let mut report = ApplyReport::default();
        let mut counts: HashMap<&str, usize> = HashMap::new();
        let mut previous: Option<u64> = None;
        for (i, message) in messages.iter().enumerate() {
            let (seq, payload) = frames::live(message).expect("a live message");
            if let Some(previous) = previous {
                assert_eq!(seq, previous + 1, "{name}: a gap before message {i}");
            }
            previous = Some(seq);
            let batch = decode(payload).unwrap_or_else(|e| panic!("{name} seq {seq}: {e}"));
            for event in &batch.events {
                match event {
                    KvEvent::Stored(s) => {
                        assert_eq!(s.block_size, BLOCK_SIZE, "{name} seq {seq}");
                        assert_eq!(s.medium.as_deref(), Some("GPU"));
                        if s.spec_kind.as_deref() == Some("full_attention") {
                            // (A sliding-window group's store may carry the tokens of the
                            // blocks outside its window too, with no hash for them.)
                            assert_eq!(
                                s.token_ids.len(),
                                s.block_hashes.len() * BLOCK_SIZE as usize,
                                "{name} seq {seq}"
                            );
                            *counts.entry("stored").or_default() += 1;
                        }
                    }
                    KvEvent::Removed(_) => *counts.entry("removed").or_default() += 1,
                    KvEvent::AllCleared => {
                        assert!(
                            i < 3,
                            "{name}: the reset comes before the contender's traffic"
                        );
                        *counts.entry("cleared").or_default() += 1;
                    }
                }
                residency.apply(event, &mut report);
                engine.apply(event);
            }
            assert_eq!(
                residency.len(),
                engine.held.len(),
                "{name} seq {seq}: the index and the engine's own hashes disagree"
            );
        }
        assert_eq!(counts.get("cleared"), Some(&1), "{name}: {counts:?}");
        evictions += counts.get("removed").copied().unwrap_or(0);
        assert!(
            report.sliding_group > 0,
            "{name}: Gemma's sliding-window groups are skipped"
        );
        assert_eq!(
            (report.wrong_token_count, report.wrong_block_size),
            (0, 0),
            "{name}: every full-attention store is keyed"
        );
        assert!(!residency.is_empty(), "{name}: holds blocks at the end");
    }
    assert!(
        evictions > 0,
        "the fleet's caches are under pressure: some blocks are evicted"
    );
}
