//! Behaviour of the CPU fingerprint store against its contract: TTL, CLOCK eviction,
//! ordering and ties, top-k against the plain-sort reference (proptest, adversarial
//! inputs), tenant isolation, and concurrent inserts and queries.

use cohort_batcher_core::store::{
    reference_top_k, Capacity, CpuStore, CpuStoreConfig, EntryMeta, Hit, SketchBytes, Store,
};
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;

fn meta(tenant: u32, expires_at_s: u32) -> EntryMeta {
    EntryMeta {
        tenant,
        cohort: tenant * 10,
        replica: 3,
        expires_at_s,
    }
}

fn one_shard(capacity: usize) -> CpuStore {
    CpuStore::new(CpuStoreConfig {
        capacity: Capacity::Entries(capacity),
        shards: 1,
    })
}

fn sketch(seed: u64) -> SketchBytes {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    std::array::from_fn(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 24) as i8
    })
}

#[test]
fn ttl_hides_then_expire_drops() {
    let store = CpuStore::with_capacity(100);
    store.upsert(1, &sketch(1), meta(7, 300), 0);
    store.upsert(2, &sketch(2), meta(7, 3600), 0);
    assert_eq!(store.top_k(7, &sketch(1), 10, 299).len(), 2);
    let late = store.top_k(7, &sketch(1), 10, 300);
    assert_eq!(late.iter().map(|h| h.key).collect::<Vec<_>>(), vec![2]);
    assert!(store.get(1, 300).is_none());
    assert_eq!(store.stats().entries, 2, "hidden, not yet dropped");
    assert_eq!(store.expire(300), 1);
    assert_eq!(store.stats().entries, 1);
    assert_eq!(store.stats().expirations, 1);
    // Refresh extends the TTL.
    store.upsert(2, &sketch(2), meta(7, 5000), 3000);
    assert!(store.get(2, 4000).is_some());
}

#[test]
fn eviction_follows_recency_under_capacity() {
    let store = one_shard(4);
    for key in 1..=4 {
        store.upsert(key, &sketch(key), meta(1, 10_000), 0);
    }
    // Use 1 (get) and 3 (refresh): recency order becomes 2, 4, 1, 3.
    assert!(store.get(1, 1).is_some());
    store.upsert(3, &sketch(33), meta(1, 10_000), 1);
    let held = |s: &CpuStore| {
        let mut keys: Vec<u64> = s.entries().iter().map(|e| e.0).collect();
        keys.sort();
        keys
    };
    store.upsert(5, &sketch(5), meta(1, 10_000), 2);
    assert_eq!(held(&store), vec![1, 3, 4, 5]);
    store.upsert(6, &sketch(6), meta(1, 10_000), 2);
    assert_eq!(held(&store), vec![1, 3, 5, 6]);
    store.upsert(7, &sketch(7), meta(1, 10_000), 2);
    assert_eq!(held(&store), vec![3, 5, 6, 7]);
    assert_eq!(store.stats().evictions, 3);
    assert_eq!(store.stats().entries, 4);
    // The refreshed sketch is the one held.
    assert_eq!(store.get(3, 2).map(|e| e.0), Some(sketch(33)));
}

#[test]
fn expired_entries_are_reclaimed_before_live_ones() {
    let store = one_shard(3);
    store.upsert(1, &sketch(1), meta(1, 10_000), 0);
    store.upsert(2, &sketch(2), meta(1, 50), 0);
    store.upsert(3, &sketch(3), meta(1, 10_000), 0);
    assert!(store.get(1, 0).is_some());
    store.upsert(4, &sketch(4), meta(1, 10_000), 100);
    let stats = store.stats();
    assert_eq!((stats.evictions, stats.expirations), (0, 1));
    assert!(store.get(2, 0).is_none());
}

#[test]
fn zero_capacity_holds_nothing() {
    let store = CpuStore::with_capacity(0);
    store.upsert(1, &sketch(1), meta(1, 10), 0);
    assert_eq!(store.stats().entries, 0);
    assert!(store.top_k(1, &sketch(1), 5, 0).is_empty());
}

#[test]
fn ties_break_by_smaller_key() {
    let store = CpuStore::with_capacity(1000);
    for key in [900u64, 5, 77, u64::MAX, 0, 31] {
        store.upsert(key, &[1; 32], meta(2, 100), 0);
    }
    let hits = store.top_k(2, &[1; 32], 4, 0);
    assert_eq!(
        hits.iter().map(|h| h.key).collect::<Vec<_>>(),
        vec![0, 5, 31, 77]
    );
    assert!(hits.iter().all(|h| h.score == 32 && h.meta == meta(2, 100)));
}

#[test]
fn tenants_never_see_each_other() {
    let store = CpuStore::with_capacity(10_000);
    for key in 0..3000u64 {
        store.upsert(key, &sketch(key), meta((key % 3) as u32, 100), 0);
    }
    for tenant in 0..3u32 {
        let queries: Vec<SketchBytes> = (0..5).map(|i| sketch(i * 7 + 1)).collect();
        for hits in store.top_k_batch(tenant, &queries, 3000, 0) {
            assert_eq!(hits.len(), 1000);
            assert!(hits
                .iter()
                .all(|h| h.meta.tenant == tenant && h.key % 3 == u64::from(tenant)));
        }
    }
    assert!(store.top_k(9, &sketch(1), 10, 0).is_empty());
}

#[test]
fn saturated_values_score_exactly() {
    let store = CpuStore::with_capacity(100);
    store.upsert(1, &[-128; 32], meta(1, 100), 0);
    store.upsert(2, &[127; 32], meta(1, 100), 0);
    let hits = store.top_k(1, &[-128; 32], 2, 0);
    assert_eq!((hits[0].key, hits[0].score), (1, 32 * 128 * 128));
    assert_eq!((hits[1].key, hits[1].score), (2, -32 * 128 * 127));
}

#[test]
fn bytes_are_reported_and_bounded() {
    let store = CpuStore::with_capacity(200_000);
    let empty = store.stats().bytes;
    for key in 0..100_000u64 {
        store.upsert(key, &sketch(key), meta(1, 100), 0);
    }
    let full = store.stats();
    let per_entry = (full.bytes - empty) as f64 / full.entries as f64;
    assert!(
        per_entry > 55.0 && per_entry < 70.0,
        "{per_entry} bytes per entry"
    );
    for key in 0..100_000u64 {
        store.remove(key);
    }
    assert!(store.stats().bytes < full.bytes / 10);
}

#[test]
fn concurrent_inserts_and_queries() {
    let store = Arc::new(CpuStore::with_capacity(100_000));
    let writers: Vec<_> = (0..4u64)
        .map(|w| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                for i in 0..5000u64 {
                    let key = w * 1_000_000 + i;
                    store.upsert(key, &sketch(key), meta((w % 2) as u32, 100), 0);
                    if i % 10 == 0 {
                        store.remove(key);
                    }
                }
            })
        })
        .collect();
    let readers: Vec<_> = (0..2u32)
        .map(|tenant| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                for i in 0..50u64 {
                    for hits in store.top_k_batch(tenant, &[sketch(i), sketch(i + 1)], 16, 0) {
                        assert!(hits.len() <= 16);
                        assert!(hits.iter().all(|h| h.meta.tenant == tenant));
                        assert!(hits.windows(2).all(|w| (w[0].score, u64::MAX - w[0].key)
                            > (w[1].score, u64::MAX - w[1].key)));
                    }
                }
            })
        })
        .collect();
    for t in writers.into_iter().chain(readers) {
        assert!(t.join().is_ok());
    }
    assert_eq!(store.stats().entries, 4 * 4500);
    let entries = store.entries();
    for tenant in 0..2 {
        let q = sketch(99);
        let want = reference_top_k(
            entries.iter().map(|(k, s, m)| (*k, s, *m)),
            tenant,
            &q,
            25,
            0,
        );
        assert_eq!(store.top_k(tenant, &q, 25, 0), want);
    }
}

/// Sketches drawn to make ties and extremes likely.
fn arb_sketch() -> impl Strategy<Value = SketchBytes> {
    prop_oneof![
        proptest::array::uniform32(any::<i8>()),
        Just([0i8; 32]),
        Just([1i8; 32]),
        Just([127i8; 32]),
        Just([-128i8; 32]),
        proptest::array::uniform32(prop_oneof![Just(-128i8), Just(127i8), Just(-127i8)]),
        proptest::array::uniform32(-2i8..=2),
    ]
}

fn arb_entry() -> impl Strategy<Value = (u64, SketchBytes, u32, u32)> {
    (
        prop_oneof![0u64..64, any::<u64>()],
        arb_sketch(),
        0u32..3,
        0u32..20,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]

    #[test]
    fn top_k_matches_reference(
        entries in proptest::collection::vec(arb_entry(), 0..1500),
        queries in proptest::collection::vec(arb_sketch(), 1..9),
        tenant in 0u32..4,
        k in prop_oneof![0usize..12, 1000usize..3000],
        now in 0u32..21,
        shards in 1usize..9,
    ) {
        let store = CpuStore::new(CpuStoreConfig { capacity: Capacity::Entries(10_000), shards });
        let mut model: HashMap<u64, (SketchBytes, EntryMeta)> = HashMap::new();
        for (key, s, t, exp) in &entries {
            store.upsert(*key, s, meta(*t, *exp), 0);
            model.insert(*key, (*s, meta(*t, *exp)));
        }
        prop_assert_eq!(store.stats().entries, model.len() as u64);
        let reference = |q: &SketchBytes| -> Vec<Hit> {
            reference_top_k(model.iter().map(|(k, (s, m))| (*k, s, *m)), tenant, q, k, now)
        };
        let batch = store.top_k_batch(tenant, &queries, k, now);
        prop_assert_eq!(batch.len(), queries.len());
        for (q, got) in queries.iter().zip(&batch) {
            let want = reference(q);
            prop_assert_eq!(got, &want);
            prop_assert_eq!(&store.top_k(tenant, q, k, now), &want);
        }
    }
}

#[test]
fn batch_of_64_matches_reference_on_clustered_data() {
    // Clustered sketches make the AVX2 kernel's bound-and-prune path both prune and pass.
    let centres: Vec<SketchBytes> = (0..16).map(|c| sketch(1000 + c)).collect();
    let store = CpuStore::with_capacity(50_000);
    for key in 0..20_000u64 {
        let c = centres[(key % 16) as usize];
        let noise = sketch(key);
        let s: SketchBytes = std::array::from_fn(|i| (c[i] / 2).saturating_add(noise[i] / 8));
        store.upsert(key, &s, meta((key % 2) as u32, 100), 0);
    }
    let queries: Vec<SketchBytes> = (0..64).map(|i| centres[i % 16]).collect();
    let entries = store.entries();
    let got = store.top_k_batch(1, &queries, 8, 0);
    for (q, hits) in queries.iter().zip(&got) {
        let want = reference_top_k(entries.iter().map(|(k, s, m)| (*k, s, *m)), 1, q, 8, 0);
        assert_eq!(hits, &want);
    }
}
