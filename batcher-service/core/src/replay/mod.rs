//! Prefix-routing replay: how much of the achievable KV-cache hit ratio a router keeps,
//! and at what load balance, on a real trace, in process.
//!
//! The Mooncake conversation trace (`data/traces/mooncake_conversation_trace.jsonl`) gives
//! each request's arrival, prompt and output lengths and its 512-token prefix blocks. The
//! replay ([`sim`]) runs a router over it against per-replica ground-truth caches with a
//! finite budget and reports the hit ratio (in blocks) and the windowed max/mean work.
//!
//! Two references: the **infinite-cache oracle** (every block seen before is a hit: what
//! no finite fleet reaches) and the **pooled bound**: one LRU cache with the fleet's total
//! capacity serving everything. Splitting that capacity over replicas can only duplicate
//! blocks, so with a finite budget capacity, not routing, is the ceiling, and "fraction of
//! the pooled bound kept" is the router's score.
//!
//! [`compare`] runs the contenders for one fleet (replica count × total capacity as a
//! fraction of the trace's distinct blocks); [`frontier`] tightens the Cohort policy's
//! balance bound; [`shard_sweep`] splits the policy over independent batcher shards.
//! Everything returns plain result structs; printing is the `replay` example's job.

pub mod sim;
pub mod trace;

pub use sim::{
    distinct_blocks, oracle_hit_ratio, pooled_hit_ratio, simulate, windowed_max_over_mean,
    Contender, KvCache, RunResult, SimConfig,
};
pub use trace::{load_trace, parse_trace, TraceError, TraceRequest, MOONCAKE_BLOCK_TOKENS};

/// Shard key depth for Mooncake's 512-token blocks: block 0 is the trunk every request
/// shares, block 1 opens the conversation (see [`crate::policy::SHARD_KEY_DEPTH`]).
pub const MOONCAKE_SHARD_KEY_DEPTH: usize = 2;

/// Balance settings of the frontier, loosest first.
pub const FRONTIER_BALANCES: [f64; 9] = [f64::INFINITY, 2.0, 1.5, 1.3, 1.2, 1.15, 1.1, 1.05, 1.02];

/// One fleet: replicas and total cache capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fleet {
    /// Engine replicas.
    pub replicas: usize,
    /// Total capacity as a fraction of the trace's distinct blocks.
    pub capacity_fraction: f64,
}

/// The references for one fleet.
#[derive(Debug, Clone, PartialEq)]
pub struct Bounds {
    /// The fleet.
    pub fleet: Fleet,
    /// Distinct blocks in the trace.
    pub distinct_blocks: usize,
    /// Per-replica budget: `distinct × fraction / replicas`.
    pub blocks_per_replica: usize,
    /// Infinite-cache hit ratio.
    pub oracle: f64,
    /// One LRU of `replicas × blocks_per_replica` blocks.
    pub pooled: f64,
}

impl Bounds {
    /// Computes the oracle and the pooled bound for `fleet`.
    pub fn new(trace: &[TraceRequest], fleet: Fleet) -> Self {
        let distinct = distinct_blocks(trace);
        let replicas = fleet.replicas.max(1);
        let frac = if fleet.capacity_fraction.is_finite() {
            fleet.capacity_fraction.max(0.0)
        } else {
            1.0
        };
        let blocks_per_replica = ((distinct as f64 * frac) / replicas as f64).round() as usize;
        Self {
            fleet,
            distinct_blocks: distinct,
            blocks_per_replica: blocks_per_replica.max(1),
            oracle: oracle_hit_ratio(trace),
            pooled: pooled_hit_ratio(trace, blocks_per_replica.max(1) * replicas),
        }
    }

    /// The replay settings for this fleet.
    pub fn sim_config(&self) -> SimConfig {
        SimConfig::new(self.fleet.replicas, self.blocks_per_replica)
    }

    /// `hit / pooled` (0 when the bound is 0).
    pub fn of_pooled(&self, hit: f64) -> f64 {
        if self.pooled > 0.0 {
            hit / self.pooled
        } else {
            0.0
        }
    }

    /// `hit / oracle` (0 when the oracle is 0).
    pub fn of_oracle(&self, hit: f64) -> f64 {
        if self.oracle > 0.0 {
            hit / self.oracle
        } else {
            0.0
        }
    }
}

/// A fleet's references and its contenders' results.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// Oracle and pooled bound.
    pub bounds: Bounds,
    /// One per contender, in the order given.
    pub runs: Vec<RunResult>,
}

/// The standard contenders: round-robin, hash of the first block, least-loaded, and the
/// Cohort policy at balance 1.2 and 1.1.
pub fn standard_contenders() -> Vec<Contender> {
    vec![
        Contender::RoundRobin,
        Contender::FirstBlockHash,
        Contender::LeastLoaded,
        Contender::Cohort { balance: 1.2 },
        Contender::Cohort { balance: 1.1 },
    ]
}

/// Runs `contenders` on `fleet`.
pub fn compare(trace: &[TraceRequest], fleet: Fleet, contenders: &[Contender]) -> Comparison {
    let bounds = Bounds::new(trace, fleet);
    let cfg = bounds.sim_config();
    let runs = contenders
        .iter()
        .map(|&c| simulate(trace, &cfg, c))
        .collect();
    Comparison { bounds, runs }
}

/// The Cohort policy at each balance bound in `balances` on `fleet`.
pub fn frontier(trace: &[TraceRequest], fleet: Fleet, balances: &[f64]) -> Comparison {
    let c: Vec<Contender> = balances
        .iter()
        .map(|&balance| Contender::Cohort { balance })
        .collect();
    compare(trace, fleet, &c)
}

/// The Cohort policy at `balance` split over each shard count in `shards`, keyed at
/// [`MOONCAKE_SHARD_KEY_DEPTH`].
pub fn shard_sweep(
    trace: &[TraceRequest],
    fleet: Fleet,
    balance: f64,
    shards: &[u32],
) -> Comparison {
    let c: Vec<Contender> = shards
        .iter()
        .map(|&s| Contender::CohortSharded {
            balance,
            shards: s,
            depth: MOONCAKE_SHARD_KEY_DEPTH,
        })
        .collect();
    compare(trace, fleet, &c)
}
