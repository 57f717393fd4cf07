//! Prefix-routing replay of a Mooncake trace, printed as markdown tables.
//!
//! ```sh
//! cargo run --release -p cohort-replay --example replay -- data/traces/mooncake_conversation_trace.jsonl
//! ```
//!
//! For 4 and 8 replicas × total capacity 25% and 50% of the trace's distinct blocks: the
//! contenders side by side, the Cohort policy's frontier (hit ratio against balance as the
//! bound is tightened) and the batcher-shard table (1, 2, 4 shards, without and with 1 s
//! engine load reports). Balance is printed both ways: *arrival* max/mean (work in its
//! arrival window) and *served* max/mean (work executed per window by FIFO servers at
//! the fleet's service rate μ, utilisation 0.7 at the pooled bound's work), with the mean
//! and p99 queueing delay (see `cohort_replay::sim`).

use cohort_batcher_core::policy::ChoiceReason;
use std::path::PathBuf;
use std::process::ExitCode;

use cohort_replay::{
    compare, frontier, load_trace, shard_sweep, standard_contenders, Bounds, Comparison, Fleet,
    FRONTIER_BALANCES, TARGET_UTILISATION,
};

const FLEETS: [(usize, f64); 4] = [(4, 0.25), (4, 0.5), (8, 0.25), (8, 0.5)];
const SHARDS: [u32; 3] = [1, 2, 4];
const SHARD_BALANCE: f64 = 1.2;

fn header(b: &Bounds) {
    println!(
        "\n### {} replicas, total capacity {:.0}% of {} distinct blocks ({} per replica)\n",
        b.fleet.replicas,
        b.fleet.capacity_fraction * 100.0,
        b.distinct_blocks,
        b.blocks_per_replica
    );
    println!(
        "oracle (infinite cache) {:.4}, pooled bound (one LRU, same total) {:.4}; service rate μ = {:.0} tokens/s per replica (utilisation {TARGET_UTILISATION} at the pooled bound's work)\n",
        b.oracle, b.pooled, b.service_rate
    );
}

fn table(c: &Comparison, first_col: &str) {
    println!("| {first_col} | hit ratio | / pooled | / oracle | arrival max/mean | arrival worst | served max/mean | served worst | utilisation | mean wait s | p99 wait s | prefix / spill / least-loaded |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for r in &c.runs {
        let reasons = if r.reasons.iter().sum::<u64>() > 0 {
            let n = |reason: ChoiceReason| r.reasons[reason as usize];
            format!(
                "{} / {} / {}",
                n(ChoiceReason::Prefix),
                n(ChoiceReason::LoadSpill),
                n(ChoiceReason::LeastLoaded)
            )
        } else {
            "".into()
        };
        println!(
            "| {} | {:.4} | {:.3} | {:.3} | {:.3} | {:.2} | {:.3} | {:.2} | {:.3} | {} | {} | {} |",
            r.contender.label(),
            r.hit_ratio,
            c.bounds.of_pooled(r.hit_ratio),
            c.bounds.of_oracle(r.hit_ratio),
            r.balance,
            r.worst_window,
            r.served_balance,
            r.served_worst_window,
            r.utilisation,
            fmt_s(r.mean_delay_s),
            fmt_s(r.p99_delay_s),
            reasons
        );
    }
}

fn fmt_s(s: f64) -> String {
    if s >= 100.0 {
        format!("{s:.0}")
    } else {
        format!("{s:.2}")
    }
}

fn main() -> ExitCode {
    let path = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("data/traces/mooncake_conversation_trace.jsonl"));
    let trace = match load_trace(&path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("replay: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "# Prefix-routing replay: {} ({} requests)",
        path.display(),
        trace.len()
    );
    println!("\nHit ratio in blocks; work = uncached prompt tokens + output tokens; windowed max/mean = Σ over 60 s windows of the busiest replica's work / Σ of the mean replica's work. Arrival: a request's work counted in its arrival window. Served: the work each replica executes in the window, as a FIFO server at μ tokens/s (μ sized so the pooled bound's work runs the fleet at utilisation {TARGET_UTILISATION}); utilisation = this run's work / (replicas × μ × trace span); wait = arrival to start of service.");

    println!("\n## Contenders");
    for (replicas, capacity_fraction) in FLEETS {
        let fleet = Fleet {
            replicas,
            capacity_fraction,
        };
        let c = compare(&trace, fleet, &standard_contenders());
        header(&c.bounds);
        table(&c, "router");
    }

    println!("\n## Frontier: the Cohort policy as the balance bound is tightened");
    for (replicas, capacity_fraction) in FLEETS {
        let fleet = Fleet {
            replicas,
            capacity_fraction,
        };
        let c = frontier(&trace, fleet, &FRONTIER_BALANCES);
        header(&c.bounds);
        table(&c, "setting");
    }

    println!("\n## Batcher shards (balance {SHARD_BALANCE}; shard key = chained hash at depth min(len, 2) Mooncake blocks); without and with engine reports (ground-truth requests running + queued per replica, fed to every shard's policy every 1 s)");
    for (replicas, capacity_fraction) in FLEETS {
        let fleet = Fleet {
            replicas,
            capacity_fraction,
        };
        let plain = shard_sweep(&trace, fleet, SHARD_BALANCE, &SHARDS, false);
        let reported = shard_sweep(&trace, fleet, SHARD_BALANCE, &SHARDS, true);
        header(&plain.bounds);
        let single = plain.runs.first().map_or(0.0, |r| r.hit_ratio);
        let vs = |h: f64| {
            if single > 0.0 {
                (h / single - 1.0) * 100.0
            } else {
                0.0
            }
        };
        println!("| shards | reports | hit ratio | vs 1 shard | / pooled | arrival max/mean | served max/mean | mean wait s | p99 wait s |");
        println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|");
        for (s, (a, b)) in SHARDS.iter().zip(plain.runs.iter().zip(&reported.runs)) {
            for (label, r) in [("no", a), ("1 s", b)] {
                println!(
                    "| {s} | {label} | {:.4} | {:+.2}% | {:.3} | {:.3} | {:.3} | {} | {} |",
                    r.hit_ratio,
                    vs(r.hit_ratio),
                    plain.bounds.of_pooled(r.hit_ratio),
                    r.balance,
                    r.served_balance,
                    fmt_s(r.mean_delay_s),
                    fmt_s(r.p99_delay_s),
                );
            }
        }
    }
    ExitCode::SUCCESS
}
