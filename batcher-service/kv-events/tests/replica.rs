//! One replica's stream end to end, from msgpack payloads to the prefix it would hit: a gap
//! replayed in order, restarts, AllBlocksCleared, and bad streams (malformed payloads,
//! unknown event types, the wrong block size, silence) counted and degrading, never a panic.

mod common;

use cohort_kv_events::health::{Change, Problem, State};
use cohort_kv_events::replica::{ReplicaConfig, ReplicaEvents};
use cohort_kv_events::residency::prefix_keys;
use cohort_kv_events::stream::{ResetReason, END_OF_REPLAY};
use cohort_kv_events::testing::SplitMix64;
use common::*;
use rmpv::Value;
use std::time::{Duration, Instant};

const BS: u32 = 4;

fn config() -> ReplicaConfig {
    ReplicaConfig::new(BS)
}

fn hit(r: &ReplicaEvents, i: u32) -> usize {
    r.residency()
        .held_prefix_blocks(&prefix_keys(&prompt(i, BS), BS as usize))
}

#[test]
fn a_gap_is_replayed_in_order_and_the_residency_is_exact() {
    let now = Instant::now();
    let mut r = ReplicaEvents::new(&config(), now);
    r.on_live(0, store(0, BS), now);
    // 1 (store prompt 1) and 2 (remove prompt 0's second block) are missed.
    let removal = payload(vec![removed(Tagging::Array, &[1])]);
    let out = r.on_live(3, store(3, BS), now);
    assert_eq!(out.replay_from, Some(1));
    assert_eq!(hit(&r, 3), 0, "held until the replay is in");
    r.on_replay(1, store(1, BS), now);
    r.on_replay(2, removal, now);
    r.on_replay(3, store(3, BS), now);
    let out = r.on_replay(END_OF_REPLAY, Vec::new(), now);
    assert!(out.resets.is_empty());
    assert_eq!((hit(&r, 0), hit(&r, 1), hit(&r, 3)), (1, 2, 2));
    assert_eq!(r.counters().duplicates, 1);
    assert_eq!(r.counters().replays, 1);
    assert!(r.complete());
    assert!(r.health().is_healthy());
}

#[test]
fn a_restart_drops_the_residency() {
    let now = Instant::now();
    let mut r = ReplicaEvents::new(&config(), now);
    for seq in 0..3 {
        r.on_live(seq, store(seq as u32, BS), now);
    }
    assert_eq!(r.residency().len(), 6);
    let out = r.on_live(0, store(7, BS), now);
    assert_eq!(out.resets, vec![ResetReason::Restart]);
    assert_eq!((hit(&r, 0), hit(&r, 7)), (0, 2));
    assert_eq!(r.counters().restarts, 1);
}

#[test]
fn a_lost_gap_drops_the_residency_and_keeps_what_follows() {
    let now = Instant::now();
    let mut r = ReplicaEvents::new(&config(), now);
    r.on_live(0, store(0, BS), now);
    assert_eq!(r.on_live(5, store(5, BS), now).replay_from, Some(1));
    let out = r.replay_unavailable();
    assert_eq!(
        out.resets,
        vec![ResetReason::GapLost {
            from: 1,
            to: Some(5)
        }]
    );
    assert_eq!((hit(&r, 0), hit(&r, 5)), (0, 2));
    assert!(!r.complete());
    // The engine clears its cache: complete again.
    r.on_live(6, payload(vec![cleared(Tagging::Map)]), now);
    assert!(r.complete());
}

#[test]
fn all_blocks_cleared_drops_the_residency() {
    let now = Instant::now();
    let mut r = ReplicaEvents::new(&config(), now);
    r.on_live(0, store(0, BS), now);
    r.on_live(1, payload(vec![cleared(Tagging::Array)]), now);
    assert!(r.residency().is_empty());
    r.on_live(2, store(2, BS), now);
    assert_eq!((hit(&r, 0), hit(&r, 2)), (0, 2));
    assert_eq!(r.counters().blocks.cleared, 1);
}

#[test]
fn malformed_payloads_degrade_and_drop_until_good_payloads_return() {
    let now = Instant::now();
    let config = config();
    let mut r = ReplicaEvents::new(&config, now);
    r.on_live(0, store(0, BS), now);
    let out = r.on_live(1, vec![0x93, 0xff, 0x00], now);
    assert_eq!(
        out.health,
        Some(Change {
            from: State::HEALTHY,
            to: degraded(Problem::Malformed)
        })
    );
    assert_eq!(out.resets.len(), 1, "its removals are unknown");
    assert!(r.residency().is_empty());
    assert_eq!(r.counters().malformed, 1);
    // Garbage of every kind: never a panic, each counted.
    let garbage: Vec<Vec<u8>> = vec![
        vec![],
        vec![0xc1],
        b"not msgpack at all".to_vec(),
        encode(&Value::from("a string")),
        payload(vec![Value::Array(vec![
            Value::from("BlockStored"),
            Value::from(1),
        ])]),
    ];
    for (i, bytes) in garbage.into_iter().enumerate() {
        let out = r.on_live(2 + i as u64, bytes, now);
        assert_eq!(out.health, None, "reported once");
    }
    assert_eq!(r.counters().malformed, 6);
    let mut changes = Vec::new();
    for seq in 7..7 + u64::from(config.health.recover_after) {
        changes.extend(r.on_live(seq, store(seq as u32, BS), now).health);
    }
    assert_eq!(
        changes,
        vec![Change {
            from: degraded(Problem::Malformed),
            to: State::HEALTHY
        }]
    );
}

fn degraded(problem: Problem) -> State {
    // The state with exactly this problem, read back from a stream that has it.
    let now = Instant::now();
    let mut r = ReplicaEvents::new(&config(), now);
    match problem {
        Problem::Malformed => r.on_live(0, vec![0xc1], now),
        Problem::BlockSize => r.on_live(
            0,
            payload(vec![stored(Tagging::Map, &[1], None, &tokens(0, 1, 8), 8)]),
            now,
        ),
        Problem::Silent => r.tick(now + Duration::from_secs(3600)),
    };
    let state = r.health();
    assert_eq!(state.problems().collect::<Vec<_>>(), vec![problem]);
    state
}

#[test]
fn unknown_event_types_are_counted_and_do_not_degrade() {
    let now = Instant::now();
    let mut r = ReplicaEvents::new(&config(), now);
    let bytes = payload(vec![
        Value::Map(vec![(s("type"), s("BlockPinned")), (s("x"), Value::Nil)]),
        stored(Tagging::Map, &[1, 2], None, &prompt(0, BS), BS),
    ]);
    let out = r.on_live(0, bytes, now);
    assert_eq!(out.health, None);
    assert_eq!(r.counters().unknown_events, 1);
    assert_eq!(hit(&r, 0), 2);
}

#[test]
fn another_block_size_than_configured_degrades_until_the_right_size_returns() {
    let now = Instant::now();
    let config = config();
    let mut r = ReplicaEvents::new(&config, now);
    let wrong = payload(vec![stored(
        Tagging::Map,
        &[1],
        None,
        &tokens(0, 1, 16),
        16,
    )]);
    let out = r.on_live(0, wrong, now);
    assert_eq!(out.health.map(|c| c.to), Some(degraded(Problem::BlockSize)));
    assert_eq!(r.counters().blocks.wrong_block_size, 1);
    assert!(r.residency().is_empty());
    let mut recovered = None;
    for seq in 1..=u64::from(config.health.recover_after) {
        if let Some(change) = r.on_live(seq, store(seq as u32, BS), now).health {
            recovered = Some((seq, change.to));
        }
    }
    assert_eq!(
        recovered,
        Some((u64::from(config.health.recover_after), State::HEALTHY))
    );
}

#[test]
fn a_silent_stream_degrades_once_and_recovers_on_the_next_payload() {
    let now = Instant::now();
    let config = config();
    let mut r = ReplicaEvents::new(&config, now);
    assert_eq!(r.tick(now + config.health.silence / 2).health, None);
    let late = now + config.health.silence + Duration::from_secs(1);
    let out = r.tick(late);
    assert_eq!(out.health.map(|c| c.to), Some(degraded(Problem::Silent)));
    assert_eq!(r.tick(late + Duration::from_secs(5)).health, None, "once");
    let out = r.on_live(0, store(0, BS), late + Duration::from_secs(6));
    assert_eq!(out.health.map(|c| c.to), Some(State::HEALTHY));
    assert_eq!(
        format!("{}", degraded(Problem::Silent)),
        "degraded (silent)"
    );
}

/// The engine's batches for `seed`, and the residency they build applied in order.
fn simulation(seed: u64) -> (SplitMix64, Vec<Vec<u8>>, ReplicaEvents) {
    let mut rng = SplitMix64(seed);
    // The engine's batches: stores, removals, now and then a clear.
    let batches: Vec<Vec<u8>> = (0..60)
        .map(|_| match rng.below(10) {
            0 => payload(vec![cleared(Tagging::Array)]),
            1..=3 => payload(vec![removed(Tagging::Map, &[rng.below(200)])]),
            _ => store(rng.below(20) as u32, BS),
        })
        .collect();
    let now = Instant::now();
    let mut reference = ReplicaEvents::new(&config(), now);
    for (seq, batch) in batches.iter().enumerate() {
        reference.on_live(seq as u64, batch.clone(), now);
    }
    (rng, batches, reference)
}

/// Delivers `batches` with live messages dropped at random (never the last, which no later
/// message would reveal), each replay answered after a few more live messages from a
/// buffer that keeps the last `kept` batches.
fn deliver(rng: &mut SplitMix64, batches: &[Vec<u8>], kept: usize) -> ReplicaEvents {
    let now = Instant::now();
    let mut r = ReplicaEvents::new(&config(), now);
    let mut pending: Option<(u64, u64, usize)> = None; // (from, messages to wait, published)
    let drop_percent = rng.below(60);
    let last = batches.len() - 1;
    let serve = |r: &mut ReplicaEvents, from: u64, published: usize| {
        let oldest = published.saturating_sub(kept).max(from as usize);
        for (seq, batch) in batches.iter().enumerate().take(published).skip(oldest) {
            let out = r.on_replay(seq as u64, batch.clone(), now);
            assert_eq!(out.replay_from, None);
        }
        r.on_replay(END_OF_REPLAY, Vec::new(), now);
    };
    for (seq, batch) in batches.iter().enumerate() {
        if let Some((from, wait, _)) = pending {
            if wait == 0 {
                pending = None;
                serve(&mut r, from, seq);
            } else {
                pending = Some((from, wait - 1, seq));
            }
        }
        if seq != last && rng.below(100) < drop_percent {
            continue;
        }
        let out = r.on_live(seq as u64, batch.clone(), now);
        if let Some(from) = out.replay_from {
            assert!(pending.is_none(), "one replay at a time");
            pending = Some((from, rng.below(4), seq + 1));
        }
    }
    if let Some((from, _, _)) = pending {
        serve(&mut r, from, batches.len());
    }
    assert!(!r.replaying());
    r
}

#[test]
fn whatever_the_live_stream_drops_replays_rebuild_the_same_residency() {
    for seed in 0..150 {
        let (mut rng, batches, reference) = simulation(seed);
        let r = deliver(&mut rng, &batches, usize::MAX);
        assert_eq!(r.counters().gaps_lost, 0, "seed {seed}");
        assert_eq!(
            r.residency().len(),
            reference.residency().len(),
            "seed {seed}"
        );
        for i in 0..20 {
            assert_eq!(hit(&r, i), hit(&reference, i), "seed {seed}, prompt {i}");
        }
    }
}

#[test]
fn a_lost_gap_leaves_a_residency_that_never_claims_more_than_the_engine_holds() {
    let mut lost = 0;
    for seed in 0..150 {
        let (mut rng, batches, reference) = simulation(seed);
        let r = deliver(&mut rng, &batches, 3);
        lost += r.counters().gaps_lost;
        assert!(
            r.residency().len() <= reference.residency().len(),
            "seed {seed}"
        );
        for i in 0..20 {
            assert!(hit(&r, i) <= hit(&reference, i), "seed {seed}, prompt {i}");
        }
    }
    assert!(lost > 0, "the short buffer loses gaps");
}
