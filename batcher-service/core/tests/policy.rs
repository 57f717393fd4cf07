//! The replica-choice policy's rules, one test each (see `src/policy/mod.rs`).

use cohort_batcher_core::policy::{
    shard_key, ChoiceReason, Observed, Policy, PolicyConfig, RouteRequest,
};

fn req(blocks: &[u64], cost: u32, now_ms: u64) -> RouteRequest<'_> {
    RouteRequest {
        blocks,
        cohort: None,
        similar: None,
        resident_ms: u64::MAX,
        cost,
        now_ms,
        track: false,
        observed: &[],
    }
}

#[test]
fn longest_prefix_wins() {
    let mut p = Policy::new(PolicyConfig {
        balance: f64::INFINITY,
        ..PolicyConfig::new(3, 1000)
    });
    let a = p.choose(&req(&[1, 2, 3, 4], 400, 0));
    // Another request sharing only block 1, then one sharing 1..3 with the first.
    let b = p.choose(&req(&[1, 9], 200, 1));
    assert_eq!(b.replica, a.replica);
    let c = p.choose(&req(&[1, 2, 3, 7], 400, 2));
    assert_eq!(c.replica, a.replica);
    assert_eq!(c.matched_blocks, 3);
    assert_eq!(c.reason, ChoiceReason::Prefix);
}

#[test]
fn spills_when_over_the_balance_bound() {
    let mut p = Policy::new(PolicyConfig {
        balance: 1.2,
        ..PolicyConfig::new(2, 1000)
    });
    let hot = [42u64, 43, 44, 45];
    let first = p.choose(&req(&hot, 4000, 0)).replica;
    let mut spilled = None;
    for t in 1..20 {
        let c = p.choose(&req(&hot, 4000, t));
        if c.replica != first {
            spilled = Some(c);
            break;
        }
    }
    let c = spilled.expect("a hot prefix spills to the second replica");
    assert_eq!(c.reason, ChoiceReason::LoadSpill);
    // Once there, the prefix is held by both and shared between them.
    let mut seen = [0u32; 2];
    for t in 100..140 {
        let c = p.choose(&req(&hot, 4000, t));
        assert_eq!(c.matched_blocks, hot.len());
        seen[c.replica] += 1;
    }
    assert!(seen[0] > 0 && seen[1] > 0, "{seen:?}");
    let s = p.snapshot(140);
    let (l0, l1) = (s.replicas[0].load, s.replicas[1].load);
    assert!(l0.max(l1) <= 1.2 * (l0 + l1) / 2.0 + 4256.0, "{l0} {l1}");
}

#[test]
fn ties_do_not_always_go_to_replica_0() {
    let mut p = Policy::new(PolicyConfig::new(4, 1000));
    let mut firsts = [0u32; 4];
    // Fresh policy each time: the very first decision on an empty fleet.
    for k in 0..64u64 {
        let mut fresh = Policy::new(PolicyConfig::new(4, 1000));
        firsts[fresh.choose(&req(&[k * 7919 + 1], 100, 0)).replica] += 1;
    }
    assert!(firsts.iter().all(|&n| n > 0), "{firsts:?}");
    // Equal, empty requests at equal time spread over all replicas.
    let mut counts = [0u32; 4];
    for _ in 0..8 {
        let c = p.choose(&req(&[], 100, 0));
        assert_eq!(c.reason, ChoiceReason::LeastLoaded);
        counts[c.replica] += 1;
    }
    assert_eq!(counts, [2, 2, 2, 2]);
}

#[test]
fn state_stays_bounded_under_a_long_stream() {
    let cap = 500;
    let mut p = Policy::new(PolicyConfig::new(3, cap));
    let mut x = 1u64;
    for t in 0..20_000u64 {
        let blocks: Vec<u64> = (0..8)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                x
            })
            .collect();
        p.choose(&req(&blocks, 512, t));
        if t % 997 == 0 {
            for r in p.snapshot(t).replicas {
                assert!(r.blocks_held <= cap);
            }
        }
    }
    let s = p.snapshot(20_000);
    assert!(s
        .replicas
        .iter()
        .all(|r| r.blocks_held <= cap && r.evictions > 0));
    assert_eq!(s.reasons.iter().sum::<u64>(), 20_000);
}

#[test]
fn cohort_owner_takes_requests_without_a_distinguishing_prefix() {
    // A large slack takes load out of this test.
    let mut p = Policy::new(PolicyConfig {
        balance_slack: 1e9,
        ..PolicyConfig::new(4, 1000)
    });
    let first = p.choose(&RouteRequest {
        blocks: &[100, 101],
        cohort: Some(7),
        similar: None,
        resident_ms: u64::MAX,
        cost: 100,
        now_ms: 0,
        track: false,
        observed: &[],
    });
    // Different prompts, same cohort: no prefix distinguishes replicas, the owner does.
    for (i, b) in [200u64, 300, 400].iter().enumerate() {
        let c = p.choose(&RouteRequest {
            blocks: &[*b, b + 1],
            cohort: Some(7),
            similar: None,
            resident_ms: u64::MAX,
            cost: 100,
            now_ms: 1 + i as u64,
            track: false,
            observed: &[],
        });
        assert_eq!(c.replica, first.replica);
        assert_eq!(c.reason, ChoiceReason::Cohort);
    }
    // A longer cached prefix elsewhere beats cohort ownership.
    let other = p.choose(&req(&[900, 901, 902], 100, 10)).replica;
    if other != first.replica {
        let c = p.choose(&RouteRequest {
            blocks: &[900, 901, 902, 903],
            cohort: Some(7),
            similar: None,
            resident_ms: u64::MAX,
            cost: 100,
            now_ms: 11,
            track: false,
            observed: &[],
        });
        assert_eq!(c.replica, other);
        assert_eq!(c.reason, ChoiceReason::Prefix);
    }
    assert_eq!(p.snapshot(11).cohorts, 1);
}

#[test]
fn the_similar_replica_breaks_ties_only_among_equally_cheap_replicas_of_an_ownerless_cohort() {
    let route = |blocks: &'static [u64], cohort, similar, cost, now_ms| RouteRequest {
        blocks,
        cohort,
        similar,
        resident_ms: u64::MAX,
        cost,
        now_ms,
        track: false,
        observed: &[],
    };
    // A large slack keeps every replica eligible; the order among them is the test.
    let config = |replicas| PolicyConfig {
        balance_slack: 1e9,
        ..PolicyConfig::new(replicas, 1000)
    };
    // An idle fleet: every replica costs the same, so where similar requests went decides.
    let mut p = Policy::new(config(4));
    let c = p.choose(&route(&[1], None, Some(2), 100, 0));
    assert_eq!((c.replica, c.reason), (2, ChoiceReason::Similar));
    // A loaded similar replica does not win against an idle one: cost comes first.
    let mut p = Policy::new(config(2));
    let busy = p.choose(&route(&[10], None, None, 5_000, 0)).replica;
    let c = p.choose(&route(&[20], None, Some(busy), 100, 1));
    assert_ne!(c.replica, busy);
    assert_ne!(c.reason, ChoiceReason::Similar);
    // A cohort with an owner follows its owner, not the similar replica.
    let mut p = Policy::new(config(4));
    let owner = p.choose(&route(&[30], Some(7), None, 100, 0)).replica;
    let elsewhere = (owner + 1) % 4;
    let c = p.choose(&route(&[40], Some(7), Some(elsewhere), 100, 1));
    assert_eq!((c.replica, c.reason), (owner, ChoiceReason::Cohort));
    // A cached prefix beats it too; an out-of-range replica is ignored.
    let c = p.choose(&route(&[30], None, Some(elsewhere), 100, 2));
    assert_eq!((c.replica, c.reason), (owner, ChoiceReason::Prefix));
    let c = p.choose(&route(&[50], None, Some(99), 100, 3));
    assert_ne!(c.reason, ChoiceReason::Similar);
}

#[test]
fn odd_inputs_do_not_panic() {
    let mut p = Policy::new(PolicyConfig {
        replicas: 0,
        blocks_per_replica: 0,
        balance: f64::NAN,
        balance_slack: f64::INFINITY,
        per_request_work: f64::NAN,
        max_cohorts: 0,
        ..PolicyConfig::default()
    });
    assert_eq!(p.replicas(), 1);
    let c = p.choose(&req(&[], u32::MAX, u64::MAX));
    assert_eq!(c.replica, 0);
    p.choose(&req(&[1, 2, 3], 0, 0));
    assert!(!p.report_engine_load(5, 1, 1, 0));
    assert!(p.report_engine_load(0, u32::MAX, u32::MAX, 0));
    assert_eq!(shard_key(&[], 16), 0);
    assert_eq!(shard_key(&[5, 6, 7], 2), 6);
    assert_eq!(shard_key(&[5], 16), 5);
}

#[test]
fn engine_reports_raise_load_while_fresh() {
    let mut p = Policy::new(PolicyConfig {
        report_ttl_ms: 1000,
        ..PolicyConfig::new(2, 100)
    });
    p.report_engine_load(0, 50, 50, 0);
    // Replica 0 reports a deep queue: new work goes to replica 1.
    assert_eq!(p.choose(&req(&[1], 100, 10)).replica, 1);
    assert_eq!(p.choose(&req(&[2], 100, 20)).replica, 1);
    assert!(p.snapshot(20).replicas[0].load > p.snapshot(20).replicas[1].load);
    // Stale after the TTL.
    assert!(p.snapshot(5000).replicas[0].load < 1.0);
}

#[test]
fn draining_load_model_counts_outstanding_work() {
    let mut p = Policy::new(PolicyConfig {
        drain_rate_per_s: Some(1000.0),
        per_request_work: 0.0,
        ..PolicyConfig::new(2, 100)
    });
    let a = p.choose(&req(&[1], 2000, 0)).replica;
    // Replica `a` holds 2 s of work: the next request goes to the other one.
    assert_ne!(p.choose(&req(&[2], 100, 10)).replica, a);
    let s = p.snapshot(1000);
    assert!((s.replicas[a].load - 1000.0).abs() < 1e-6, "{s:?}");
    assert_eq!(p.snapshot(5000).replicas[a].load, 0.0);
}

#[test]
fn a_warmed_prefix_counts_as_held_for_its_ttl_and_routes_there() {
    // Assign mode's prefetch: a warm-up's blocks count as held on its replica for the
    // request's cache TTL (so the next warm-up waits for the TTL to run out), and the
    // cohort's next request finds them there.
    let mut p = Policy::new(PolicyConfig::new(3, 1_000));
    let blocks = [11, 12, 13];
    assert!(!p.holds(2, &blocks, 0));
    p.warmed(2, &blocks, 1_000, 300_000);
    assert!(p.holds(2, &blocks, 300_999));
    assert!(
        !p.holds(2, &blocks, 301_000),
        "the TTL ran out: warm it again"
    );
    assert!(!p.holds(1, &blocks, 2_000), "only where it was warmed");
    assert!(
        !p.holds(2, &[11, 12, 14], 2_000),
        "every block must be held"
    );
    let choice = p.choose(&req(&[11, 12, 13, 99], 400, 2_000));
    assert_eq!((choice.replica, choice.matched_blocks), (2, 3));
}

/// Where an engine publishes its cache, its own account replaces the modelled prefix,
/// except for what was sent there too recently to be published yet (per replica).
#[test]
fn the_engines_own_account_of_its_cache_overrides_the_model() {
    let mut p = Policy::new(PolicyConfig {
        balance: f64::INFINITY,
        ..PolicyConfig::new(2, 1000)
    });
    let prompt = [1u64, 2, 3, 4];
    let home = p.choose(&req(&prompt, 400, 0)).replica;
    let other = 1 - home;
    let seen = |held, pending_since_ms| {
        Some(Observed {
            held,
            pending_since_ms,
        })
    };
    // Per slot: `home`'s account, the other's.
    let by_slot = |home_says: Option<Observed>, other_says: Option<Observed>| {
        if home == 0 {
            vec![home_says, other_says]
        } else {
            vec![other_says, home_says]
        }
    };
    let choose = |p: &mut Policy, observed: &[Option<Observed>], now| {
        p.choose(&RouteRequest {
            observed,
            ..req(&prompt, 400, now)
        })
    };
    // The model says `home` holds all four blocks; its engine says it evicted them, and the
    // other engine holds two (another router's traffic, a warm-up).
    let moved = choose(&mut p, &by_slot(seen(0, 90_000), seen(2, 90_000)), 100_000);
    assert_eq!((moved.replica, moved.matched_blocks), (other, 2));
    assert_eq!(moved.reason, ChoiceReason::Prefix);
    // `home`'s window reaching back to its record (at 0): what was sent there counts again.
    let c = choose(&mut p, &by_slot(seen(0, 0), seen(0, 200_000)), 100_001);
    assert_eq!((c.replica, c.matched_blocks), (home, 4));
    // No account from either engine: the model alone, as without events.
    let c = choose(&mut p, &[None, None], 100_002);
    assert_eq!(c.matched_blocks, 4);
    // An engine's account beyond the request's blocks is cut to them.
    let long = by_slot(seen(9, u64::MAX), seen(9, u64::MAX));
    assert_eq!(choose(&mut p, &long, 100_003).matched_blocks, 4);
}

/// A cleared engine (a cache reset, a restart) holds nothing in the model either.
#[test]
fn a_cleared_replica_holds_nothing() {
    let mut p = Policy::new(PolicyConfig {
        balance: f64::INFINITY,
        ..PolicyConfig::new(2, 1000)
    });
    let prompt = [7u64, 8, 9];
    let home = p.choose(&req(&prompt, 300, 0)).replica;
    assert!(p.holds(home, &prompt, 1));
    p.cleared(home);
    p.cleared(99);
    assert!(!p.holds(home, &prompt, 1));
    assert_eq!(p.choose(&req(&prompt, 300, 2)).matched_blocks, 0);
}
