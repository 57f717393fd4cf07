//! A real vLLM's KV events stream, replayed: `tests/fixtures/vllm/` holds what vLLM 0.32.0 on
//! CPU published for Gemma 3 270M (`scripts/vllm-kv-events`: a shared prefix stored, hit,
//! evicted by other prompts in a 64-block cache, stored again; `reset_prefix_cache`; one more
//! request), the replay socket's answer from seq 0, and the same batches in the array-tagged
//! encoding of vLLM <= 0.23 written from vLLM's own event classes.
//!
//! Checked on the recording: both encodings decode to the same events; the shared prefix's
//! blocks are held after it is stored, gone once evicted, held again when stored again; the
//! reset drops everything; a gap is filled from the real replay socket's answer to the same
//! residency; a restart drops the residency.
#![cfg(feature = "testing")]

use cohort_kv_events::decode::{decode, KvEvent};
use cohort_kv_events::frames;
use cohort_kv_events::replica::{ReplicaConfig, ReplicaEvents};
use cohort_kv_events::residency::prefix_keys;
use cohort_kv_events::testing::recording as messages;
use std::time::Instant;

const BLOCK_SIZE: u32 = 128;

/// The live messages as (seq, payload).
fn live(name: &str) -> Vec<(u64, Vec<u8>)> {
    messages(name)
        .iter()
        .map(|m| {
            let (seq, payload) = frames::live(m).expect("a live message");
            (seq, payload.to_vec())
        })
        .collect()
}

/// The tokens of the recording's first stored chain: the shared prefix.
fn shared_prefix(stream: &[(u64, Vec<u8>)]) -> Vec<u64> {
    let batch = decode(&stream[0].1).unwrap();
    let tokens = batch
        .events
        .iter()
        .find_map(|e| match e {
            KvEvent::Stored(s) if s.spec_kind.as_deref() == Some("full_attention") => {
                Some(s.token_ids.clone())
            }
            _ => None,
        })
        .expect("a full-attention store");
    prefix_keys(&tokens, BLOCK_SIZE as usize)
}

fn replica() -> ReplicaEvents {
    ReplicaEvents::new(&ReplicaConfig::new(BLOCK_SIZE), Instant::now())
}

#[test]
fn both_encodings_of_the_recording_decode_to_the_same_events() {
    let (maps, arrays) = (live("stream.jsonl"), live("array-tagged.jsonl"));
    assert_eq!(maps.len(), arrays.len());
    let mut kinds = [0usize; 3];
    for ((seq_a, a), (seq_b, b)) in maps.iter().zip(&arrays) {
        assert_eq!(seq_a, seq_b);
        let (a, b) = (decode(a).unwrap(), decode(b).unwrap());
        assert_eq!(a.events, b.events, "seq {seq_a}");
        for event in &a.events {
            kinds[match event {
                KvEvent::Stored(s) => {
                    assert_eq!(s.block_size, BLOCK_SIZE);
                    assert_eq!(
                        s.medium.as_deref(),
                        Some("GPU"),
                        "the CPU engine's own tier"
                    );
                    assert_eq!(
                        s.token_ids.len(),
                        s.block_hashes.len() * BLOCK_SIZE as usize
                    );
                    0
                }
                KvEvent::Removed(_) => 1,
                KvEvent::AllCleared => 2,
            }] += 1;
        }
    }
    let [stored, removed, cleared] = kinds;
    assert!(stored > 0 && removed > 0, "{kinds:?}");
    assert_eq!(cleared, 1, "{kinds:?}");
}

#[test]
fn the_shared_prefix_is_held_evicted_held_again_and_cleared() {
    let stream = live("stream.jsonl");
    let keys = shared_prefix(&stream);
    assert_eq!(
        keys.len(),
        3,
        "384 of the prompt's tokens fill three blocks"
    );
    let mut replica = replica();
    let mut held = Vec::new();
    let mut cleared_at = None;
    for (seq, payload) in &stream {
        if decode(payload)
            .unwrap()
            .events
            .contains(&KvEvent::AllCleared)
        {
            cleared_at = Some(held.len());
        }
        let outcome = replica.on_live(*seq, payload.clone(), Instant::now());
        assert_eq!(outcome.replay_from, None, "seq {seq}");
        held.push(replica.residency().held_prefix_blocks(&keys));
    }
    assert!(replica.health().is_healthy() && replica.complete());
    // Stored by the leader (the followers hit it and publish nothing) ...
    assert_eq!(held[0], 3, "{held:?}");
    // ... evicted by the distinct prompts ...
    let evicted = held.iter().position(|&n| n == 0).expect("evicted");
    // ... stored again by the shared prefix's return, and by the request after the reset.
    assert!(held[evicted..].contains(&3), "{held:?}");
    assert_eq!(*held.last().unwrap(), 3, "{held:?}");
    // The reset dropped everything else: the last batch clears, then stores one prompt.
    let cleared_at = cleared_at.expect("AllBlocksCleared");
    assert_eq!(cleared_at, stream.len() - 1);
    assert_eq!(
        replica.residency().len(),
        3,
        "only the last prompt's blocks"
    );
}

#[test]
fn a_gap_is_filled_from_the_real_replay_sockets_answer() {
    let stream = live("stream.jsonl");
    let replies: Vec<(u64, Vec<u8>)> = messages("replay.jsonl")
        .iter()
        .map(|m| {
            let (seq, payload) = frames::replay(m).expect("a replay reply");
            (seq, payload.to_vec())
        })
        .collect();
    assert_eq!(
        replies.last().unwrap().0,
        cohort_kv_events::stream::END_OF_REPLAY
    );
    let mut whole = replica();
    for (seq, payload) in &stream {
        whole.on_live(*seq, payload.clone(), Instant::now());
    }
    // Seq 1 lost on the way: the next one asks for a replay from 1.
    let mut gapped = replica();
    gapped.on_live(stream[0].0, stream[0].1.clone(), Instant::now());
    let outcome = gapped.on_live(stream[2].0, stream[2].1.clone(), Instant::now());
    assert_eq!(outcome.replay_from, Some(1));
    for (seq, payload) in &stream[3..] {
        gapped.on_live(*seq, payload.clone(), Instant::now());
    }
    // vLLM answers from the first seq it still has (0 here: the buffer holds them all).
    for (seq, payload) in &replies {
        gapped.on_replay(*seq, payload.clone(), Instant::now());
    }
    assert!(!gapped.replaying() && gapped.complete());
    let keys = shared_prefix(&stream);
    assert_eq!(
        gapped.residency().held_prefix_blocks(&keys),
        whole.residency().held_prefix_blocks(&keys)
    );
    assert_eq!(gapped.residency().len(), whole.residency().len());
    assert_eq!(gapped.counters().replays, 1);
}

#[test]
fn a_restart_drops_the_residency() {
    let stream = live("stream.jsonl");
    let keys = shared_prefix(&stream);
    let mut replica = replica();
    replica.on_live(stream[0].0, stream[0].1.clone(), Instant::now());
    replica.on_live(stream[1].0, stream[1].1.clone(), Instant::now());
    assert_eq!(replica.residency().held_prefix_blocks(&keys), 3);
    // The engine restarted: its stream begins at 0 again, with another prompt's blocks.
    let outcome = replica.on_live(0, stream[1].1.clone(), Instant::now());
    assert!(!outcome.resets.is_empty(), "{outcome:?}");
    assert_eq!(replica.residency().held_prefix_blocks(&keys), 0);
    assert_eq!(replica.counters().restarts, 1);
}
