//! Prefix-routing replay of a Mooncake trace, printed as markdown tables.
//!
//! ```sh
//! cargo run --release -p cohort-batcher-core --example replay -- data/traces/mooncake_conversation_trace.jsonl
//! ```
//!
//! For 4 and 8 replicas × total capacity 25% and 50% of the trace's distinct blocks: the
//! contenders side by side, the Cohort policy's frontier (hit ratio against balance as the
//! bound is tightened) and the batcher-shard table (1, 2, 4 shards).

use std::path::PathBuf;
use std::process::ExitCode;

use cohort_batcher_core::replay::{
    compare, frontier, load_trace, shard_sweep, standard_contenders, Bounds, Comparison, Fleet,
    FRONTIER_BALANCES,
};

const FLEETS: [(usize, f64); 4] = [(4, 0.25), (4, 0.5), (8, 0.25), (8, 0.5)];

fn header(b: &Bounds) {
    println!(
        "\n### {} replicas, total capacity {:.0}% of {} distinct blocks ({} per replica)\n",
        b.fleet.replicas,
        b.fleet.capacity_fraction * 100.0,
        b.distinct_blocks,
        b.blocks_per_replica
    );
    println!(
        "oracle (infinite cache) {:.4}, pooled bound (one LRU, same total) {:.4}\n",
        b.oracle, b.pooled
    );
}

fn table(c: &Comparison, first_col: &str) {
    println!("| {first_col} | hit ratio | / pooled | / oracle | windowed max/mean | worst window | prefix / spill / least-loaded |");
    println!("|---|---:|---:|---:|---:|---:|---|");
    for r in &c.runs {
        let reasons = if r.reasons.iter().sum::<u64>() > 0 {
            format!("{} / {} / {}", r.reasons[0], r.reasons[2], r.reasons[3])
        } else {
            "".into()
        };
        println!(
            "| {} | {:.4} | {:.3} | {:.3} | {:.3} | {:.2} | {} |",
            r.contender.label(),
            r.hit_ratio,
            c.bounds.of_pooled(r.hit_ratio),
            c.bounds.of_oracle(r.hit_ratio),
            r.balance,
            r.worst_window,
            reasons
        );
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
    println!("\nHit ratio in blocks; work = uncached prompt tokens + output tokens; windowed max/mean = Σ over 60 s windows of the busiest replica's work / Σ of the mean replica's work.");

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

    println!("\n## Batcher shards (balance 1.2; shard key = chained hash at depth min(len, 2) Mooncake blocks)");
    for (replicas, capacity_fraction) in FLEETS {
        let fleet = Fleet {
            replicas,
            capacity_fraction,
        };
        let c = shard_sweep(&trace, fleet, 1.2, &[1, 2, 4]);
        header(&c.bounds);
        let single = c.runs.first().map_or(0.0, |r| r.hit_ratio);
        println!("| shards | hit ratio | vs 1 shard | / pooled | windowed max/mean |");
        println!("|---:|---:|---:|---:|---:|");
        for (s, r) in [1, 2, 4].iter().zip(&c.runs) {
            println!(
                "| {s} | {:.4} | {:+.2}% | {:.3} | {:.3} |",
                r.hit_ratio,
                if single > 0.0 {
                    (r.hit_ratio / single - 1.0) * 100.0
                } else {
                    0.0
                },
                c.bounds.of_pooled(r.hit_ratio),
                r.balance
            );
        }
    }
    ExitCode::SUCCESS
}
