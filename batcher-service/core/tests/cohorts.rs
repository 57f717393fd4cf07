//! Online cohorts over the CPU store: same-intent requests join, different ones split,
//! conflicts are counted, idle cohorts expire.

use cohort_batcher_core::cohorts::{Cohorts, NO_COHORT};
use cohort_batcher_core::store::{CpuStore, SketchBytes, Store};
use cohort_fingerprint::sketch::SemanticMode;
use cohort_fingerprint::IntentSketch;

fn text(t: &str) -> SketchBytes {
    IntentSketch::of_text(t, SemanticMode::Intent).sketch.0
}

fn axis(dims: &[(usize, i8)]) -> SketchBytes {
    let mut s = [0i8; 32];
    for &(d, v) in dims {
        s[d] = v;
    }
    s
}

fn cohorts(ttl: u32) -> Cohorts<CpuStore> {
    Cohorts::new(CpuStore::with_capacity(10_000), ttl)
}

#[test]
fn same_intent_joins_and_different_intent_splits() {
    let mut c = cohorts(600);
    let a = c.observe(
        1,
        &text("Please transfer 100 dollars to John Smith"),
        0.5,
        0,
    );
    assert!(a.new);
    let b = c.observe(
        1,
        &text("Please transfer 250 dollars to Mary Jones"),
        0.5,
        1,
    );
    assert_eq!(b.cohort, a.cohort);
    assert!(!b.new);
    assert!(b.similarity > 0.9, "{}", b.similarity);
    let w = c.observe(
        1,
        &text("What will the weather be like in Paris tomorrow?"),
        0.5,
        2,
    );
    assert!(w.new);
    assert_ne!(w.cohort, a.cohort);
    let counters = c.counters();
    assert_eq!((counters.live, counters.created), (2, 2));
    // Another tenant never joins tenant 1's cohorts.
    let other = c.observe(
        2,
        &text("Please transfer 100 dollars to John Smith"),
        0.5,
        3,
    );
    assert!(other.new);
}

#[test]
fn assign_does_not_update() {
    let mut c = cohorts(600);
    let first = c.observe(1, &axis(&[(0, 127)]), 0.5, 0);
    let before = c.centroid(first.cohort);
    let m = c.assign(1, &axis(&[(0, 100), (1, 60)]), 0.5, 5);
    assert_eq!(m.map(|m| m.cohort), Some(first.cohort));
    assert_eq!(c.assign(1, &axis(&[(2, 100)]), 0.5, 5), None);
    assert_eq!(c.centroid(first.cohort), before);
    assert_eq!(c.counters().created, 1);
}

#[test]
fn centroid_follows_members() {
    let mut c = cohorts(600);
    let id = c.observe(1, &axis(&[(0, 127)]), 0.3, 0).cohort;
    assert_eq!(c.observe(1, &axis(&[(1, 127)]), 0.0, 1).cohort, id);
    let (_, unit, members) = c.centroid(id).unwrap_or((0, [0.0; 32], 0));
    assert_eq!(members, 2);
    assert!(
        (unit[0] - unit[1]).abs() < 1e-6
            && (unit[0] - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-3
    );
    // The store holds the requantised centroid (norm 127).
    let (stored, meta) = c
        .store()
        .get(u64::from(id), 1)
        .unwrap_or(([0; 32], meta_zero()));
    assert_eq!((stored[0], stored[1], meta.cohort), (90, 90, id));
}

fn meta_zero() -> cohort_batcher_core::store::EntryMeta {
    cohort_batcher_core::store::EntryMeta {
        tenant: 0,
        cohort: 0,
        replica: 0,
        expires_at_s: 0,
    }
}

#[test]
fn conflict_when_two_cohorts_are_equally_close() {
    let mut c = cohorts(600);
    let x = c.observe(1, &axis(&[(0, 127)]), 0.5, 0);
    let y = c.observe(1, &axis(&[(1, 127)]), 0.5, 0);
    assert!(x.new && y.new && x.cohort != y.cohort);
    let m = c.observe(1, &axis(&[(0, 90), (1, 88)]), 0.5, 1);
    assert!(m.conflict);
    assert_eq!(m.cohort, x.cohort);
    // Clearly closer to one: no conflict.
    let n = c.observe(1, &axis(&[(1, 120), (0, 20)]), 0.5, 2);
    assert!(!n.conflict);
    assert_eq!(n.cohort, y.cohort);
    assert_eq!(c.counters().conflicts, 1);
}

#[test]
fn idle_cohorts_expire() {
    let mut c = cohorts(60);
    let id = c.observe(1, &axis(&[(3, 127)]), 0.5, 0).cohort;
    assert_eq!(
        c.assign(1, &axis(&[(3, 127)]), 0.5, 59).map(|m| m.cohort),
        Some(id)
    );
    c.observe(1, &axis(&[(3, 120)]), 0.5, 59);
    assert_eq!(c.expire(100), 0, "refreshed at 59");
    let probe = axis(&[(3, 127)]);
    assert_eq!(c.assign(1, &probe, 0.5, 118).map(|m| m.cohort), Some(id));
    assert_eq!(c.assign(1, &probe, 0.5, 119), None, "idle for the TTL");
    assert_eq!(c.expire(119), 1);
    let counters = c.counters();
    assert_eq!((counters.live, counters.expired), (0, 1));
    assert_eq!(c.store().stats().entries, 0);
    assert!(c.observe(1, &probe, 0.5, 121).new);
}

#[test]
fn zero_sketch_answers_no_cohort() {
    let mut c = cohorts(60);
    assert_eq!(c.observe(1, &[0; 32], 0.5, 0).cohort, NO_COHORT);
    assert_eq!(c.counters().created, 0);
    assert_eq!(c.store().stats().entries, 0);
}

#[test]
fn the_inspector_lists_live_cohorts_and_ranks_the_nearest() {
    let mut c = cohorts(600);
    let x = axis(&[(0, 100)]);
    let y = axis(&[(1, 100)]);
    let a = c.observe(1, &x, 0.5, 0).cohort;
    c.observe(1, &x, 0.5, 1);
    let b = c.observe(1, &y, 0.5, 2).cohort;
    c.observe(2, &x, 0.5, 3);
    let live = c.live(10);
    assert_eq!(live.len(), 3);
    assert_eq!(
        (live[0].0, live[0].1, live[0].2),
        (a, 1, 2),
        "most members first"
    );
    let near = c.nearest_cohorts(1, &axis(&[(0, 90), (1, 30)]), 5, 10);
    assert_eq!(near.iter().map(|n| n.0).collect::<Vec<_>>(), vec![a, b]);
    assert!(near[0].1 > 0.9 && near[1].1 < 0.5, "{near:?}");
    assert!(
        c.nearest_cohorts(3, &x, 5, 10).is_empty(),
        "other tenants' cohorts stay hidden"
    );
    assert!(c.nearest_cohorts(1, &[0; 32], 5, 10).is_empty());
    assert!(c.live(10_000).is_empty(), "idle cohorts are not live");
}
