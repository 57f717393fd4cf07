//! The residency index: Cohort's keys chain like the router's, prefix hits before and after
//! evictions, idempotent stores, what is skipped, and what drops everything.

mod common;

use cohort_kv_events::decode::{decode, KvEvent};
use cohort_kv_events::residency::{
    chain_seed, prefix_keys, prefix_keys_from, ApplyReport, Residency,
};
use common::*;
use rmpv::Value;

const BS: u32 = 4;

/// Decodes `events` (map-tagged) and applies them.
fn apply(residency: &mut Residency, events: Vec<Value>) -> ApplyReport {
    let batch = decode(&payload(events)).unwrap();
    let mut report = ApplyReport::default();
    for event in &batch.events {
        residency.apply(event, &mut report);
    }
    report
}

fn residency() -> Residency {
    Residency::new(BS, "GPU")
}

#[test]
fn the_router_s_prefix_keys_match_the_stored_blocks() {
    let mut r = residency();
    let prompt = tokens(1000, 3, BS);
    // Blocks 0-1 in one event, block 2 as a child in another.
    apply(
        &mut r,
        vec![stored(Tagging::Map, &[1, 2], None, &prompt[..8], BS)],
    );
    apply(
        &mut r,
        vec![stored(Tagging::Map, &[3], Some(2), &prompt[8..], BS)],
    );
    assert_eq!(r.len(), 3);
    let mut with_tail = prompt.clone();
    with_tail.extend([7, 7]); // a partial block: no key
    let keys = prefix_keys(&with_tail, BS as usize);
    assert_eq!(keys.len(), 3);
    assert_eq!(r.held_prefix_blocks(&keys), 3);
    // A prompt that diverges in its second block shares only the first.
    let mut other = prompt.clone();
    other[5] = 1;
    assert_eq!(r.held_prefix_blocks(&prefix_keys(&other, BS as usize)), 1);
    // Same tokens, another first block: the chain differs from there on.
    let mut shifted = prompt.clone();
    shifted[0] = 1;
    assert_eq!(r.held_prefix_blocks(&prefix_keys(&shifted, BS as usize)), 0);
    assert_eq!(r.held_prefix_blocks(&[]), 0);
    assert!(prefix_keys(&prompt, 0).is_empty());
}

#[test]
fn evictions_cut_the_prefix_at_the_first_missing_block() {
    let mut r = residency();
    let prompt = tokens(0, 4, BS);
    apply(
        &mut r,
        vec![stored(Tagging::Array, &[1, 2, 3, 4], None, &prompt, BS)],
    );
    let keys = prefix_keys(&prompt, BS as usize);
    assert_eq!(r.held_prefix_blocks(&keys), 4);
    let report = apply(&mut r, vec![removed(Tagging::Array, &[4])]);
    assert_eq!(report.removed, 1);
    assert_eq!(r.held_prefix_blocks(&keys), 3);
    apply(&mut r, vec![removed(Tagging::Map, &[2])]);
    assert_eq!(r.held_prefix_blocks(&keys), 1);
    assert_eq!(r.len(), 2);
    // Removing what is not held changes nothing.
    let report = apply(&mut r, vec![removed(Tagging::Map, &[99, 2])]);
    assert_eq!(report.removed, 0);
    assert_eq!(r.len(), 2);
    // Block 2 stored again (recomputed): the prefix is back to where block 4 is missing.
    apply(
        &mut r,
        vec![stored(Tagging::Map, &[2], Some(1), &prompt[4..8], BS)],
    );
    assert_eq!(r.held_prefix_blocks(&keys), 3);
}

#[test]
fn stores_are_idempotent_across_repeats_and_counted_groups() {
    let mut r = residency();
    let prompt = tokens(50, 2, BS);
    let event = stored(Tagging::Map, &[1, 2], None, &prompt, BS);
    apply(&mut r, vec![event.clone(), event]);
    // The same blocks in a second full-attention group.
    apply(
        &mut r,
        vec![stored_in(
            Tagging::Map,
            &[1, 2],
            None,
            &prompt,
            BS,
            "GPU",
            1,
            "full_attention",
        )],
    );
    assert_eq!(r.len(), 2);
    assert_eq!(r.held_prefix_blocks(&prefix_keys(&prompt, BS as usize)), 2);
    let bytes = r.heap_bytes();
    assert!(bytes > 0);
}

#[test]
fn sliding_window_groups_and_other_tiers_do_not_count() {
    let mut r = residency();
    let prompt = tokens(0, 2, BS);
    let report = apply(
        &mut r,
        vec![
            stored_in(
                Tagging::Map,
                &[1, 2],
                None,
                &prompt,
                BS,
                "GPU",
                0,
                "full_attention",
            ),
            stored_in(
                Tagging::Map,
                &[1, 2],
                None,
                &prompt,
                BS,
                "GPU",
                1,
                "sliding_window",
            ),
            stored_in(
                Tagging::Map,
                &[8, 9],
                None,
                &tokens(90, 2, BS),
                BS,
                "CPU",
                0,
                "full_attention",
            ),
        ],
    );
    assert_eq!(report.stored, 2);
    assert_eq!(report.sliding_group, 2);
    assert_eq!(report.other_medium, 2);
    assert_eq!(r.len(), 2);
    // The sliding-window group evicts its copy: the full-attention copy is still held.
    let report = apply(&mut r, vec![removed_in(Tagging::Map, &[1, 2], 1)]);
    assert_eq!(report.sliding_group, 2);
    assert_eq!(r.held_prefix_blocks(&prefix_keys(&prompt, BS as usize)), 2);
    // The full-attention group evicts it: gone.
    apply(&mut r, vec![removed_in(Tagging::Map, &[1], 0)]);
    assert_eq!(r.held_prefix_blocks(&prefix_keys(&prompt, BS as usize)), 0);
}

#[test]
fn orphans_wrong_sizes_and_wrong_token_counts_are_skipped_and_counted() {
    let mut r = residency();
    let report = apply(
        &mut r,
        vec![
            stored(Tagging::Map, &[5], Some(404), &tokens(0, 1, BS), BS),
            stored(Tagging::Map, &[6], None, &tokens(0, 1, 8), 8),
            stored(Tagging::Map, &[7, 8], None, &tokens(0, 1, BS), BS),
        ],
    );
    assert_eq!(report.orphans, 1);
    assert_eq!(report.wrong_block_size, 1);
    assert_eq!(report.wrong_token_count, 2);
    assert_eq!(report.stored, 0);
    assert!(r.is_empty());
}

#[test]
fn all_blocks_cleared_drops_everything() {
    let mut r = residency();
    let prompt = tokens(0, 3, BS);
    apply(
        &mut r,
        vec![stored(Tagging::Map, &[1, 2, 3], None, &prompt, BS)],
    );
    let report = apply(&mut r, vec![cleared(Tagging::Array)]);
    assert_eq!(report.cleared, 1);
    assert!(r.is_empty());
    assert_eq!(r.held_prefix_blocks(&prefix_keys(&prompt, BS as usize)), 0);
    // A child of a cleared block is an orphan.
    let report = apply(
        &mut r,
        vec![stored(Tagging::Map, &[4], Some(3), &tokens(0, 1, BS), BS)],
    );
    assert_eq!(report.orphans, 1);
}

#[test]
fn a_lora_adapter_s_blocks_key_apart_from_the_base_model_s() {
    let mut r = residency();
    let prompt = tokens(0, 2, BS);
    let mut event = decode(&payload(vec![stored(
        Tagging::Map,
        &[1, 2],
        None,
        &prompt,
        BS,
    )]))
    .unwrap()
    .events
    .remove(0);
    if let KvEvent::Stored(stored) = &mut event {
        stored.lora_name = Some("sql-adapter".into());
    }
    r.apply(&event, &mut ApplyReport::default());
    assert_eq!(r.held_prefix_blocks(&prefix_keys(&prompt, BS as usize)), 0);
    let seed = chain_seed(Some("sql-adapter"));
    assert_eq!(
        r.held_prefix_blocks(&prefix_keys_from(seed, &prompt, BS as usize)),
        2
    );
}
