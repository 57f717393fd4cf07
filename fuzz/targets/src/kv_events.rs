//! A payload of vLLM's KV events stream as `cohort_kv_events` decodes and applies it, and
//! the same bytes cut into a stream of payloads with arbitrary sequence numbers.
//!
//! Invariants: decoding never panics and is deterministic; every block of a decoded
//! `BlockStored` is either held or counted as skipped, and the index never holds more
//! blocks than were stored; a prompt's held prefix is at most its block count; a clear
//! empties the index; through the replica, a health change is reported exactly when the
//! state changes, and the index never holds more than it stored.

use cohort_kv_events::decode::{decode, KvEvent};
use cohort_kv_events::replica::{ReplicaConfig, ReplicaEvents};
use cohort_kv_events::residency::{prefix_keys, ApplyReport, Residency};
use cohort_kv_events::stream::END_OF_REPLAY;
use std::time::{Duration, Instant};

/// The fuzz target.
pub fn kv_events(data: &[u8]) {
    let decoded = decode(data);
    assert_eq!(
        format!("{decoded:?}"),
        format!("{:?}", decode(data)),
        "deterministic"
    );
    if let Ok(batch) = &decoded {
        let block_size = batch
            .events
            .iter()
            .find_map(|e| match e {
                KvEvent::Stored(s) => Some(s.block_size),
                _ => None,
            })
            .unwrap_or(16);
        let mut residency = Residency::new(block_size, "GPU");
        let mut report = ApplyReport::default();
        let mut stored_blocks = 0u64;
        for event in &batch.events {
            if let KvEvent::Stored(s) = event {
                stored_blocks += s.block_hashes.len() as u64;
            }
            residency.apply(event, &mut report);
        }
        assert!(
            report.stored + report.wrong_block_size + report.wrong_token_count + report.orphans
                <= stored_blocks,
            "{report:?} of {stored_blocks}"
        );
        assert!(residency.len() as u64 <= report.stored, "{report:?}");
        for event in &batch.events {
            if let KvEvent::Stored(s) = event {
                let keys = prefix_keys(&s.token_ids, block_size as usize);
                assert!(residency.held_prefix_blocks(&keys) <= keys.len());
            }
        }
        residency.clear();
        assert!(residency.is_empty());
    }
    stream(data);
}

/// The bytes as a stream: 48-byte payloads, each numbered by its first byte relative to
/// the one before (on, back, far back, ahead), some of them replay replies.
fn stream(data: &[u8]) {
    let start = Instant::now();
    let mut replica = ReplicaEvents::new(&ReplicaConfig::new(16), start);
    let mut seq = 0u64;
    for (i, chunk) in data.chunks(48).enumerate() {
        let now = start + Duration::from_millis(i as u64 * 500);
        let step = chunk[0];
        seq = match step % 5 {
            0 | 1 => seq + 1,
            2 => seq.saturating_sub(u64::from(step)),
            3 => seq + u64::from(step),
            _ => 0,
        };
        let before = replica.health();
        let outcome = match step % 7 {
            5 => replica.on_replay(seq, chunk.to_vec(), now),
            6 => replica.on_replay(END_OF_REPLAY, Vec::new(), now),
            _ if step == 0xff => replica.tick(now + Duration::from_secs(3600)),
            _ => replica.on_live(seq, chunk.to_vec(), now),
        };
        let after = replica.health();
        assert_eq!(outcome.health.is_some(), before != after, "{outcome:?}");
        if let Some(change) = outcome.health {
            assert_eq!((change.from, change.to), (before, after));
        }
        assert!(replica.residency().len() as u64 <= replica.counters().blocks.stored);
    }
    let outcome = replica.replay_unavailable();
    assert_eq!(outcome.replay_from, None);
    assert!(!replica.replaying());
}
