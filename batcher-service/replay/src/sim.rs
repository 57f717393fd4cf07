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
//! unnoticed. Two balance metrics, both `Σ_w max_r work(w, r) / Σ_w mean_r work(w, r)`
//! over fixed 60 s windows with any work (the work-weighted mean of the per-window ratio:
//! how much longer the fleet takes than a perfectly balanced one, since a window is done
//! when its busiest replica is; the worst single window is reported too):
//!
//! - **Arrival** (`RunResult::balance`): a request's whole work counts in the window of its
//!   arrival. Simple, but not physical: a 126k-token prompt lands in one window although
//!   no replica could execute it there, so even an oracle balancer stays near 1.17 at 8
//!   replicas.
//! - **Served** (`RunResult::served_balance`): each replica is a server executing work at a
//!   fixed rate μ tokens/s (`SimConfig::service_rate`), in **FIFO** order; `work(w, r)` is
//!   the work replica `r` *executes* during window `w` (a request's service interval is
//!   split over the windows it overlaps; the drain after the last arrival is included).
//!   The executed work per window is the same under every work-conserving discipline
//!   (FIFO, processor sharing, ...), so the metric does not depend on that choice; FIFO is
//!   chosen because it gives the **queueing delay** (arrival to start of service,
//!   `mean_delay_s`, `p99_delay_s`) a meaning, like an engine's FCFS waiting queue, where
//!   processor sharing would start every request at once and report 0. μ is set per fleet
//!   ([`super::Bounds::service_rate`]) so that the pooled bound's work would run the fleet
//!   at mean utilisation [`super::TARGET_UTILISATION`] (0.7) over the trace's span; every
//!   contender of that fleet gets the same μ, so one that loses hits does more work, runs
//!   hotter (`utilisation`) and queues longer.
//!
//! Contenders with engine reports get, every `report_interval_ms` (1 s) of trace time, the
//! ground-truth requests running (0 or 1) + queued on each replica of this model, fed to
//! every batcher shard's policy through `Policy::report_engine_load` (what the live batcher
//! will scrape from the engines).

use std::collections::{HashSet, VecDeque};
use std::num::NonZeroUsize;

use cohort_fingerprint::shard::jump_hash;
use lru::LruCache;

use super::trace::{TraceRequest, MOONCAKE_BLOCK_TOKENS};
use cohort_batcher_core::policy::{
    mix64, shard_key, ChoiceReason, Policy, PolicyConfig, RouteRequest,
};

/// Whether the Cohort policy contenders use the draining-outstanding-work load model by
/// default ([`SimConfig::policy_drain`]).
pub const DEFAULT_POLICY_DRAIN: bool = false;

/// With the draining load model, the balance bound's absolute slack in seconds of service
/// (`balance_slack = μ × DRAIN_SLACK_S`).
pub const DRAIN_SLACK_S: f64 = 5.0;

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
        /// Feed every shard's policy the ground-truth requests running + queued on each
        /// replica every [`SimConfig::report_interval_ms`] (the live batcher's engine
        /// scrape) through [`Policy::report_engine_load`].
        reports: bool,
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
                balance,
                shards,
                reports,
                ..
            } => format!(
                "cohort ×{shards} shards (balance {}){}",
                fmt_balance(balance),
                if reports { " + engine reports" } else { "" }
            ),
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
    /// Service rate μ of every replica, tokens of work per second (see the module docs;
    /// [`super::Bounds::sim_config`] sets it for the fleet's target utilisation).
    pub service_rate: f64,
    /// The Cohort policy's load model: `true` = outstanding work draining at
    /// `service_rate` (`PolicyConfig::drain_rate_per_s`), `false` = assigned work decaying
    /// with `load_half_life_ms`.
    pub policy_drain: bool,
    /// Interval of the simulated engine scrape for contenders with `reports`.
    pub report_interval_ms: u64,
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
            service_rate: 0.0,
            policy_drain: DEFAULT_POLICY_DRAIN,
            report_interval_ms: 1_000,
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
    /// **Arrival** windowed max/mean: each request's work counted in the window of its
    /// arrival (see the module docs).
    pub balance: f64,
    /// The worst single window's arrival max/mean.
    pub worst_window: f64,
    /// **Served** windowed max/mean: the work each replica *executes* in each window, at
    /// rate `service_rate` in FIFO order (see the module docs).
    pub served_balance: f64,
    /// The worst single window's served max/mean.
    pub served_worst_window: f64,
    /// This run's fleet utilisation: total work / (replicas × μ × trace span).
    pub utilisation: f64,
    /// Mean queueing delay (arrival to start of service), seconds.
    pub mean_delay_s: f64,
    /// 99th percentile queueing delay, seconds.
    pub p99_delay_s: f64,
    /// Work per replica over the whole trace.
    pub work_per_replica: Vec<u64>,
    /// Cohort policy decisions by reason (in the order of `ChoiceReason::ALL`), summed
    /// over shards; zero for the baselines.
    pub reasons: [u64; ChoiceReason::ALL.len()],
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
        let pc = |balance: f64, blocks: usize, shards: u64| PolicyConfig {
            replicas: cfg.replicas,
            blocks_per_replica: blocks,
            balance,
            balance_slack: if cfg.policy_drain {
                cfg.service_rate * DRAIN_SLACK_S / shards as f64
            } else {
                0.0
            },
            load_half_life_ms: cfg.load_half_life_ms.saturating_mul(shards),
            per_request_work: cfg.per_request_work,
            drain_rate_per_s: if cfg.policy_drain {
                Some(cfg.service_rate / shards as f64)
            } else {
                None
            },
            ..PolicyConfig::default()
        };
        match c {
            Contender::RoundRobin => Self::RoundRobin(0),
            Contender::FirstBlockHash => Self::FirstBlock,
            Contender::LeastLoaded => Self::Policies {
                policies: vec![Policy::new(pc(f64::INFINITY, 1, 1))],
                depth: 1,
                prefix_blind: true,
            },
            Contender::Cohort { balance } => Self::Policies {
                policies: vec![Policy::new(pc(balance, cfg.blocks_per_replica, 1))],
                depth: 1,
                prefix_blind: false,
            },
            Contender::CohortSharded {
                balance,
                shards,
                depth,
                ..
            } => {
                let s = shards.max(1);
                // Each shard sees about 1/s of every replica's traffic, so its view of a
                // replica's cache gets 1/s of the budget, and its load half-life is s times
                // longer so that its load window spans as many decisions as one batcher's.
                let share = (cfg.blocks_per_replica / s as usize).max(1);
                Self::Policies {
                    policies: (0..s)
                        .map(|_| Policy::new(pc(balance, share, u64::from(s))))
                        .collect(),
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
                            similar: None,
                            resident_ms: u64::MAX,
                            cost: req.input_length,
                            now_ms: req.timestamp_ms,
                            track: false,
                            observed: &[],
                        })
                        .replica
                    }
                    None => 0,
                }
            }
        }
    }

    fn report(&mut self, replica: usize, in_flight: u32, queued: u32, now_ms: u64) {
        if let Self::Policies { policies, .. } = self {
            for p in policies {
                p.report_engine_load(replica, in_flight, queued, now_ms);
            }
        }
    }

    fn reasons(&self) -> [u64; ChoiceReason::ALL.len()] {
        let mut out = [0; ChoiceReason::ALL.len()];
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

/// One replica as a FIFO server executing work at rate μ.
#[derive(Debug, Default)]
struct Server {
    /// When the server finishes the work it has been given, ms.
    free_at_ms: f64,
    /// Completion times of requests not known to be finished yet (non-decreasing).
    ends_ms: VecDeque<f64>,
}

impl Server {
    /// Requests not finished at `t_ms`.
    fn outstanding(&mut self, t_ms: f64) -> usize {
        while self.ends_ms.front().is_some_and(|&e| e <= t_ms) {
            self.ends_ms.pop_front();
        }
        self.ends_ms.len()
    }
}

/// Adds work executed at `per_ms` over `[start, end)` (ms) to replica `r`'s windows.
fn spread(
    windows: &mut Vec<Vec<f64>>,
    n: usize,
    r: usize,
    start: f64,
    end: f64,
    per_ms: f64,
    window_ms: f64,
) {
    let mut t = start;
    while t < end {
        let w = (t / window_ms).floor() as usize;
        if w > 10_000_000 {
            return;
        }
        let w_end = ((w + 1) as f64 * window_ms).min(end);
        if w >= windows.len() {
            windows.resize(w + 1, vec![0.0; n]);
        }
        windows[w][r] += (w_end - t) * per_ms;
        t = w_end;
    }
}

/// Replays `trace` under `contender`.
pub fn simulate(trace: &[TraceRequest], cfg: &SimConfig, contender: Contender) -> RunResult {
    let n = cfg.replicas.max(1);
    let mut router = Router::new(contender, cfg);
    let reports = matches!(contender, Contender::CohortSharded { reports: true, .. });
    let mut caches: Vec<KvCache> = (0..n)
        .map(|_| KvCache::new(cfg.blocks_per_replica))
        .collect();
    let mut servers: Vec<Server> = (0..n).map(|_| Server::default()).collect();
    let mut windows: Vec<Vec<f64>> = Vec::new();
    let mut served: Vec<Vec<f64>> = Vec::new();
    let mut delays: Vec<f64> = Vec::with_capacity(trace.len());
    let mut work_per_replica = vec![0u64; n];
    let (mut hit_blocks, mut total_blocks) = (0u64, 0u64);
    let window_ms = cfg.window_ms.max(1);
    let mu_per_ms = if cfg.service_rate.is_finite() && cfg.service_rate > 0.0 {
        cfg.service_rate / 1000.0
    } else {
        f64::INFINITY
    };
    let interval = cfg.report_interval_ms.max(1);
    let mut next_report = 0u64;
    for req in trace {
        let now = req.timestamp_ms;
        if reports && now >= next_report {
            // The latest scrape tick at or before this arrival (earlier ones are superseded).
            let tick = now - now % interval;
            for (r, s) in servers.iter_mut().enumerate() {
                let out = u32::try_from(s.outstanding(tick as f64)).unwrap_or(u32::MAX);
                let running = out.min(1);
                router.report(r, running, out - running, tick);
            }
            next_report = tick + interval;
        }
        let r = router.route(req, n).min(n - 1);
        let hit = caches[r].access(&req.blocks);
        hit_blocks += hit as u64;
        total_blocks += req.blocks.len() as u64;
        let hit_tokens =
            (hit as u64 * u64::from(cfg.block_tokens)).min(u64::from(req.input_length));
        let work = u64::from(req.input_length) - hit_tokens + u64::from(req.output_length);
        work_per_replica[r] += work;

        let t = now as f64;
        let s = &mut servers[r];
        let start = s.free_at_ms.max(t);
        let end = start + work as f64 / mu_per_ms;
        delays.push((start - t) / 1000.0);
        s.free_at_ms = end;
        s.ends_ms.push_back(end);
        spread(&mut served, n, r, start, end, mu_per_ms, window_ms as f64);

        let w = usize::try_from(now / window_ms).unwrap_or(usize::MAX);
        if w >= windows.len() {
            if w > 10_000_000 {
                continue;
            }
            windows.resize(w + 1, vec![0.0; n]);
        }
        windows[w][r] += work as f64;
    }
    let (balance, worst_window) = windowed_max_over_mean(&windows);
    let (served_balance, served_worst_window) = windowed_max_over_mean(&served);
    let total_work: u64 = work_per_replica.iter().sum();
    let span_s = trace_span_s(trace, window_ms);
    let (mean_delay_s, p99_delay_s) = mean_and_p99(&mut delays);
    RunResult {
        contender,
        hit_blocks,
        total_blocks,
        hit_ratio: ratio(hit_blocks, total_blocks),
        balance,
        worst_window,
        served_balance,
        served_worst_window,
        utilisation: total_work as f64 / (n as f64 * cfg.service_rate * span_s),
        mean_delay_s,
        p99_delay_s,
        work_per_replica,
        reasons: router.reasons(),
    }
}

/// Seconds from the first arrival to the last (one window when they coincide).
pub fn trace_span_s(trace: &[TraceRequest], window_ms: u64) -> f64 {
    let first = trace.iter().map(|r| r.timestamp_ms).min().unwrap_or(0);
    let last = trace.iter().map(|r| r.timestamp_ms).max().unwrap_or(0);
    let span = last - first;
    (if span == 0 { window_ms.max(1) } else { span }) as f64 / 1000.0
}

fn mean_and_p99(xs: &mut [f64]) -> (f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    xs.sort_by(f64::total_cmp);
    let mean = xs.iter().sum::<f64>() / xs.len() as f64;
    let i = ((xs.len() as f64 * 0.99).ceil() as usize).clamp(1, xs.len()) - 1;
    (mean, xs[i])
}

/// Work (uncached prompt tokens + output tokens) of the trace served by one LRU cache of
/// `capacity` blocks: the pooled bound's work, which sizes the service rate.
pub fn pooled_work(trace: &[TraceRequest], capacity: usize, block_tokens: u32) -> u64 {
    let mut cache = KvCache::new(capacity);
    trace
        .iter()
        .map(|req| {
            let hit = cache.access(&req.blocks) as u64;
            let hit_tokens = (hit * u64::from(block_tokens)).min(u64::from(req.input_length));
            u64::from(req.input_length) - hit_tokens + u64::from(req.output_length)
        })
        .sum()
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
