//! The simulation: routers decide, per-replica ground-truth KV caches score.
//!
//! Each replica has a ground-truth cache ([`KvCache`]): an LRU set of blocks with a finite
//! budget, touched last block first (leaves are evicted before trunks, as engines do).
//! A request's hit is the longest prefix of its blocks present in the chosen replica's
//! cache *at arrival*; then all its blocks are inserted. The routers never read these
//! caches: the Cohort policy keeps its own approximate view, the baselines none.
//!
//! Work of a request = uncached prompt tokens + output tokens: a cached prefix costs
//! (almost) nothing to prefill, the rest is prefilled, and every output token is a decode
//! step. Both are what a replica spends GPU time on, in one unit, and the uncached part
//! depends on the routing, so a router cannot look balanced by throwing hits away
//! unnoticed. **Windowed max/mean**: the trace is cut into fixed windows (60 s); in each,
//! the busiest replica's work over the mean replica's work; the figure is
//! `Σ_w max_r work(w, r) / Σ_w mean_r work(w, r)`, the work-weighted mean of that ratio:
//! how much longer the fleet takes than a perfectly balanced one, since a window is done
//! when its busiest replica is. The worst single window is reported too.

use std::collections::HashSet;
use std::num::NonZeroUsize;

use cohort_fingerprint::shard::jump_hash;
use lru::LruCache;

use super::trace::{TraceRequest, MOONCAKE_BLOCK_TOKENS};
use crate::policy::{mix64, shard_key, Policy, PolicyConfig, RouteRequest};

/// Ground-truth KV cache of one replica (or the pooled one): LRU blocks, finite budget.
#[derive(Debug)]
pub struct KvCache {
    blocks: LruCache<u64, ()>,
}

impl KvCache {
    /// A cache of `capacity` blocks (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self {
            blocks: LruCache::new(NonZeroUsize::new(capacity.max(1)).unwrap_or(NonZeroUsize::MIN)),
        }
    }

    /// Longest cached prefix of `blocks`, then inserts them all (last first).
    pub fn access(&mut self, blocks: &[u64]) -> usize {
        let hit = blocks
            .iter()
            .take_while(|b| self.blocks.contains(*b))
            .count();
        for &b in blocks.iter().rev() {
            self.blocks.put(b, ());
        }
        hit
    }
}

/// A routing rule under test.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Contender {
    /// Replicas in turn.
    RoundRobin,
    /// Consistent hash (jump hash) of the first block.
    FirstBlockHash,
    /// Least decayed assigned work, prefix-blind (the Cohort policy with no prefix state).
    LeastLoaded,
    /// The Cohort policy with this `balance` bound, one batcher.
    Cohort {
        /// The policy's balance bound.
        balance: f64,
    },
    /// The Cohort policy split over `shards` batchers sharing nothing, keyed by
    /// [`shard_key`] at `depth` blocks.
    CohortSharded {
        /// The policy's balance bound.
        balance: f64,
        /// Batcher shards.
        shards: u32,
        /// Shard key depth in blocks.
        depth: usize,
    },
}

impl Contender {
    /// Short label for tables.
    pub fn label(&self) -> String {
        match *self {
            Self::RoundRobin => "round-robin".into(),
            Self::FirstBlockHash => "hash(first block)".into(),
            Self::LeastLoaded => "least-loaded".into(),
            Self::Cohort { balance } => format!("cohort (balance {})", fmt_balance(balance)),
            Self::CohortSharded {
                balance, shards, ..
            } => format!("cohort ×{shards} shards (balance {})", fmt_balance(balance)),
        }
    }
}

fn fmt_balance(b: f64) -> String {
    if b.is_finite() {
        format!("{b}")
    } else {
        "∞".into()
    }
}

/// Replay settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimConfig {
    /// Engine replicas.
    pub replicas: usize,
    /// Ground-truth KV budget of each replica, in blocks.
    pub blocks_per_replica: usize,
    /// Balance window.
    pub window_ms: u64,
    /// Tokens per trace block.
    pub block_tokens: u32,
    /// Half-life of the policy's load estimate.
    pub load_half_life_ms: u64,
    /// The policy's per-request (decode) work estimate, tokens.
    pub per_request_work: f64,
}

impl SimConfig {
    /// Mooncake defaults for `replicas` replicas of `blocks_per_replica` blocks.
    pub fn new(replicas: usize, blocks_per_replica: usize) -> Self {
        let d = PolicyConfig::default();
        Self {
            replicas: replicas.max(1),
            blocks_per_replica,
            window_ms: 60_000,
            block_tokens: MOONCAKE_BLOCK_TOKENS,
            load_half_life_ms: d.load_half_life_ms,
            per_request_work: d.per_request_work,
        }
    }
}

/// One contender's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct RunResult {
    /// What ran.
    pub contender: Contender,
    /// Blocks served from the chosen replica's cache.
    pub hit_blocks: u64,
    /// Blocks requested.
    pub total_blocks: u64,
    /// `hit_blocks / total_blocks`.
    pub hit_ratio: f64,
    /// Windowed max/mean work (see the module docs).
    pub balance: f64,
    /// The worst single window's max/mean.
    pub worst_window: f64,
    /// Work per replica over the whole trace.
    pub work_per_replica: Vec<u64>,
    /// Cohort policy decisions by reason (prefix, cohort, load_spill, least_loaded),
    /// summed over shards; zero for the baselines.
    pub reasons: [u64; 4],
}

enum Router {
    RoundRobin(usize),
    FirstBlock,
    Policies {
        policies: Vec<Policy>,
        depth: usize,
        prefix_blind: bool,
    },
}

impl Router {
    fn new(c: Contender, cfg: &SimConfig) -> Self {
        let pc = |balance: f64, blocks: usize| PolicyConfig {
            replicas: cfg.replicas,
            blocks_per_replica: blocks,
            balance,
            load_half_life_ms: cfg.load_half_life_ms,
            per_request_work: cfg.per_request_work,
            ..PolicyConfig::default()
        };
        match c {
            Contender::RoundRobin => Self::RoundRobin(0),
            Contender::FirstBlockHash => Self::FirstBlock,
            Contender::LeastLoaded => Self::Policies {
                policies: vec![Policy::new(pc(f64::INFINITY, 1))],
                depth: 1,
                prefix_blind: true,
            },
            Contender::Cohort { balance } => Self::Policies {
                policies: vec![Policy::new(pc(balance, cfg.blocks_per_replica))],
                depth: 1,
                prefix_blind: false,
            },
            Contender::CohortSharded {
                balance,
                shards,
                depth,
            } => {
                let s = shards.max(1);
                // Each shard sees about 1/s of every replica's traffic, so its view of a
                // replica's cache gets 1/s of the budget.
                let share = (cfg.blocks_per_replica / s as usize).max(1);
                Self::Policies {
                    policies: (0..s).map(|_| Policy::new(pc(balance, share))).collect(),
                    depth,
                    prefix_blind: false,
                }
            }
        }
    }

    fn route(&mut self, req: &TraceRequest, replicas: usize) -> usize {
        match self {
            Self::RoundRobin(next) => {
                let r = *next % replicas;
                *next = next.wrapping_add(1);
                r
            }
            Self::FirstBlock => {
                let key = mix64(req.blocks.first().copied().unwrap_or(0));
                jump_hash(key, replicas as u32) as usize
            }
            Self::Policies {
                policies,
                depth,
                prefix_blind,
            } => {
                let shard = jump_hash(shard_key(&req.blocks, *depth), policies.len() as u32);
                let blocks: &[u64] = if *prefix_blind { &[] } else { &req.blocks };
                match policies.get_mut(shard as usize) {
                    Some(p) => {
                        p.choose(&RouteRequest {
                            blocks,
                            cohort: None,
                            cost: req.input_length,
                            now_ms: req.timestamp_ms,
                        })
                        .replica
                    }
                    None => 0,
                }
            }
        }
    }

    fn reasons(&self) -> [u64; 4] {
        let mut out = [0; 4];
        if let Self::Policies { policies, .. } = self {
            for p in policies {
                let s = p.snapshot(0);
                for (o, x) in out.iter_mut().zip(s.reasons) {
                    *o += x;
                }
            }
        }
        out
    }
}

/// Replays `trace` under `contender`.
pub fn simulate(trace: &[TraceRequest], cfg: &SimConfig, contender: Contender) -> RunResult {
    let n = cfg.replicas.max(1);
    let mut router = Router::new(contender, cfg);
    let mut caches: Vec<KvCache> = (0..n)
        .map(|_| KvCache::new(cfg.blocks_per_replica))
        .collect();
    let mut windows: Vec<Vec<f64>> = Vec::new();
    let mut work_per_replica = vec![0u64; n];
    let (mut hit_blocks, mut total_blocks) = (0u64, 0u64);
    let window_ms = cfg.window_ms.max(1);
    for req in trace {
        let r = router.route(req, n).min(n - 1);
        let hit = caches[r].access(&req.blocks);
        hit_blocks += hit as u64;
        total_blocks += req.blocks.len() as u64;
        let hit_tokens =
            (hit as u64 * u64::from(cfg.block_tokens)).min(u64::from(req.input_length));
        let work = u64::from(req.input_length) - hit_tokens + u64::from(req.output_length);
        work_per_replica[r] += work;
        let w = usize::try_from(req.timestamp_ms / window_ms).unwrap_or(usize::MAX);
        if w >= windows.len() {
            if w > 10_000_000 {
                continue;
            }
            windows.resize(w + 1, vec![0.0; n]);
        }
        windows[w][r] += work as f64;
    }
    let (balance, worst_window) = windowed_max_over_mean(&windows);
    RunResult {
        contender,
        hit_blocks,
        total_blocks,
        hit_ratio: ratio(hit_blocks, total_blocks),
        balance,
        worst_window,
        work_per_replica,
        reasons: router.reasons(),
    }
}

/// `(Σ_w max / Σ_w mean, worst window's max/mean)` over windows with any work.
pub fn windowed_max_over_mean(windows: &[Vec<f64>]) -> (f64, f64) {
    let (mut sum_max, mut sum_mean, mut worst) = (0.0, 0.0, 1.0f64);
    for w in windows {
        let total: f64 = w.iter().sum();
        if total <= 0.0 || w.is_empty() {
            continue;
        }
        let mean = total / w.len() as f64;
        let max = w.iter().copied().fold(0.0, f64::max);
        sum_max += max;
        sum_mean += mean;
        worst = worst.max(max / mean);
    }
    if sum_mean > 0.0 {
        (sum_max / sum_mean, worst)
    } else {
        (1.0, 1.0)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// Hit ratio of an infinite cache shared by all: every block seen before is a hit.
pub fn oracle_hit_ratio(trace: &[TraceRequest]) -> f64 {
    let mut seen: HashSet<u64> = HashSet::new();
    let (mut hit, mut total) = (0u64, 0u64);
    for req in trace {
        hit += req.blocks.iter().take_while(|b| seen.contains(*b)).count() as u64;
        total += req.blocks.len() as u64;
        seen.extend(req.blocks.iter().copied());
    }
    ratio(hit, total)
}

/// Hit ratio of one LRU cache of `capacity` blocks serving everything (the pooled bound).
pub fn pooled_hit_ratio(trace: &[TraceRequest], capacity: usize) -> f64 {
    let mut cache = KvCache::new(capacity);
    let (mut hit, mut total) = (0u64, 0u64);
    for req in trace {
        hit += cache.access(&req.blocks) as u64;
        total += req.blocks.len() as u64;
    }
    ratio(hit, total)
}

/// Distinct blocks in the trace.
pub fn distinct_blocks(trace: &[TraceRequest]) -> usize {
    trace
        .iter()
        .flat_map(|r| r.blocks.iter().copied())
        .collect::<HashSet<u64>>()
        .len()
}
