//! The prefix-routing goals on the Mooncake conversation trace (see `src/replay`).
//!
//! Goals (issue): ≥ 99% of the pooled bound at windowed max/mean ≤ 1.2 (4 and 8 replicas,
//! total capacity 25% and 50% of the distinct blocks); ≥ 90% of it at ≤ 1.1 with 8
//! replicas; 1, 2 and 4 batcher shards within 2% of the single-batcher hit ratio.
//!
//! Balance is asserted on the **served** windowed max/mean (`RunResult::served_balance`:
//! the work each replica executes per 60 s window as a FIFO server at the fleet's service
//! rate μ, sized for utilisation 0.7). On the **arrival** metric (`RunResult::balance`: work
//! counted in its arrival window) the 8-replica goals are not met (best 0.984 of pooled at
//! ≤ 1.2; no router reaches ≤ 1.1): see the report in `src/replay/mod.rs`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cohort_replay::{
    compare, frontier, load_trace, shard_sweep, Comparison, Contender, Fleet, TraceRequest,
    FRONTIER_BALANCES,
};

fn trace() -> &'static [TraceRequest] {
    static T: OnceLock<Vec<TraceRequest>> = OnceLock::new();
    T.get_or_init(|| {
        let p: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../data/traces/mooncake_conversation_trace.jsonl");
        load_trace(&p).expect("the bundled Mooncake trace loads")
    })
}

fn fleet(replicas: usize, capacity_fraction: f64) -> Fleet {
    Fleet {
        replicas,
        capacity_fraction,
    }
}

/// Best fraction of the pooled bound among runs with served windowed max/mean ≤ `limit`.
fn best_within(c: &Comparison, limit: f64) -> f64 {
    c.runs
        .iter()
        .filter(|r| r.served_balance <= limit)
        .map(|r| c.bounds.of_pooled(r.hit_ratio))
        .fold(0.0, f64::max)
}

#[test]
fn four_replicas_keep_the_pooled_bound_at_balance_1_2() {
    for f in [0.25, 0.5] {
        let c = compare(
            trace(),
            fleet(4, f),
            &[
                Contender::RoundRobin,
                Contender::FirstBlockHash,
                Contender::Cohort { balance: 1.2 },
            ],
        );
        assert!(
            (c.bounds.oracle - 0.366).abs() < 0.001,
            "{}",
            c.bounds.oracle
        );
        let (rr, hash, cohort) = (&c.runs[0], &c.runs[1], &c.runs[2]);
        // Every request shares block 0: hashing it puts everything on one replica.
        assert!((hash.balance - 4.0).abs() < 1e-9, "{}", hash.balance);
        assert!(
            (hash.served_balance - 4.0).abs() < 1e-9,
            "{}",
            hash.served_balance
        );
        let kept = c.bounds.of_pooled(cohort.hit_ratio);
        assert!(kept >= 0.99, "f={f}: kept {kept}");
        assert!(cohort.served_balance <= 1.2, "f={f}: {cohort:?}");
        assert!(cohort.balance <= 1.2, "f={f}: arrival {}", cohort.balance);
        assert!(cohort.hit_ratio > 1.5 * rr.hit_ratio);
        // Keeping the hits lowers the work, hence the queueing delay users feel.
        assert!(
            cohort.p99_delay_s < rr.p99_delay_s,
            "f={f}: {cohort:?} {rr:?}"
        );
    }
}

#[test]
fn issue_goals_at_eight_replicas_on_the_served_metric() {
    for f in [0.25, 0.5] {
        let c = frontier(trace(), fleet(8, f), &FRONTIER_BALANCES);
        let loose = best_within(&c, 1.2);
        let tight = best_within(&c, 1.1);
        assert!(loose >= 0.99, "f={f}: {loose} of pooled at served ≤ 1.2");
        assert!(tight >= 0.90, "f={f}: {tight} of pooled at served ≤ 1.1");
    }
}

#[test]
fn served_utilisation_is_the_documented_target_at_the_pooled_work() {
    // μ is sized so the pooled bound's work runs the fleet at 0.7; a router that keeps
    // (almost) all of the pooled bound's hits runs it at about that.
    let c = compare(
        trace(),
        fleet(8, 0.5),
        &[Contender::Cohort { balance: 2.0 }],
    );
    let u = c.runs[0].utilisation;
    assert!((0.69..=0.72).contains(&u), "{u}");
}

#[test]
fn batcher_shards_keep_the_single_batcher_hit_ratio() {
    for (replicas, f) in [(4, 0.25), (4, 0.5), (8, 0.25), (8, 0.5)] {
        let single = shard_sweep(trace(), fleet(replicas, f), 1.2, &[1], false).runs[0].hit_ratio;
        for reports in [false, true] {
            let c = shard_sweep(trace(), fleet(replicas, f), 1.2, &[1, 2, 4], reports);
            for r in &c.runs {
                let rel = (r.hit_ratio / single - 1.0).abs();
                assert!(
                    rel <= 0.02,
                    "{replicas} replicas {f}: {:?} {rel}",
                    r.contender
                );
            }
        }
    }
}
