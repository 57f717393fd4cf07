//! Benchmark of the prefetch predictor under many distinct sessions: the cost of one
//! request (`observe` then `predict`, what the batch front does per leader) in each tenth
//! of a run of a million sessions, and what the model holds, beside a baseline that keeps
//! contexts in a `HashMap` and scans it for the oldest once full (no LRU lists).
//!
//! ```sh
//! cargo run --release -p cohort-batcher-core --example predict_bench -- --sessions 1000000
//! ```
//! Options: `--sessions N` (1,000,000), `--baseline-requests N` (500,000: the baseline
//! costs a scan of 100,000 contexts per request once full, so it runs a shorter prefix of
//! the same requests), `--private` (every session also visits a cohort of its own, as a
//! conversation's history is: the cohort count grows without bound and `max_cohorts`
//! must hold it).
//!
//! Workload: 4 tenants, 2,000 shared cohorts each, every cohort followed by one of 3
//! likely successors; sessions of 2–5 requests, 1,000 live at a time, interleaved; 1 ms
//! between requests. Time is the process CPU clock around each tenth, so the numbers are
//! per request on one core.

use cohort_batcher_core::predict::{PredictConfig, Predictor, PrefetchPolicy};
use cohort_fingerprint::knobs::Prefetch;
use std::collections::HashMap;
use std::hint::black_box;
use std::time::Instant;

/// SplitMix64: a small deterministic generator (the bench must not depend on a seed crate).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const TENANTS: u64 = 4;
const COHORTS: u64 = 2_000;
const LIVE: usize = 1_000;

/// One request: (tenant, context, cohort).
type Request = (u64, u64, u64);

/// The whole run's requests, in arrival order.
fn workload(sessions: u64, private: bool) -> Vec<Request> {
    let mut rng = Rng(7);
    struct Live {
        tenant: u64,
        context: u64,
        cohort: u64,
        left: u32,
    }
    let start = |rng: &mut Rng| Live {
        tenant: rng.below(TENANTS),
        context: rng.next(),
        cohort: rng.below(COHORTS),
        left: 2 + rng.below(4) as u32,
    };
    let mut live: Vec<Live> = (0..LIVE).map(|_| start(&mut rng)).collect();
    let mut started = LIVE as u64;
    let mut out = Vec::with_capacity(sessions as usize * 4);
    while !live.is_empty() {
        let i = rng.below(live.len() as u64) as usize;
        let s = &mut live[i];
        out.push((s.tenant, s.context, s.cohort));
        if private && s.left == 3 {
            // A cohort of this user session's own (its history), between two shared ones.
            out.push((s.tenant, s.context, s.context | 1 << 63));
        }
        // The next cohort: one of three successors, the first most often.
        let pick = [0, 0, 0, 1, 1, 2][rng.below(6) as usize];
        s.cohort = (s.cohort * 7 + 1 + pick * 131) % COHORTS;
        s.left -= 1;
        if s.left == 0 {
            if started < sessions {
                started += 1;
                live[i] = start(&mut rng);
            } else {
                live.swap_remove(i);
            }
        }
    }
    out
}

/// The baseline's context memory: a map scanned for the least recently seen when full.
struct ScanningContexts {
    last: HashMap<u64, (u64, u64)>,
    max: usize,
}

impl ScanningContexts {
    fn observe(&mut self, context: u64, cohort: u64, now_ms: u64) -> Option<(u64, u64)> {
        if self.last.len() >= self.max && !self.last.contains_key(&context) {
            let oldest = self
                .last
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(c, _)| *c);
            if let Some(oldest) = oldest {
                self.last.remove(&oldest);
            }
        }
        self.last.insert(context, (cohort, now_ms))
    }
}

fn cpu_seconds() -> f64 {
    // The process CPU clock: what one core spent, whatever else runs on the box.
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 (1-based), 11 and 12 after the command.
    (ticks(11) + ticks(12)) / 100.0
}

fn main() {
    let mut sessions = 1_000_000u64;
    let mut baseline_requests = 500_000usize;
    let mut private = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().and_then(|v| v.parse().ok());
        match arg.as_str() {
            "--sessions" => sessions = value().expect("--sessions N"),
            "--baseline-requests" => {
                baseline_requests = value().expect("--baseline-requests N") as usize
            }
            "--private" => private = true,
            other => panic!("unknown argument {other}"),
        }
    }
    let requests = workload(sessions, private);
    let policy = PrefetchPolicy::of(Prefetch::High).unwrap();
    let config = PredictConfig::default();
    println!(
        "{} requests of {sessions} sessions ({}), 4 tenants × 2,000 shared cohorts; max_contexts {}, max_cohorts {}",
        requests.len(),
        if private { "each with a private cohort" } else { "shared cohorts only" },
        config.max_contexts,
        config.max_cohorts
    );
    println!();
    println!("| tenth of the run | predictor ns/request (CPU) | wall | contexts held | cohorts held | predictions/request |");
    println!("|---|---|---|---|---|---|");
    let mut predictor = Predictor::new(config);
    let tenth = requests.len().div_ceil(10);
    let mut tenths = Vec::new();
    for (i, chunk) in requests.chunks(tenth).enumerate() {
        let (cpu, wall) = (cpu_seconds(), Instant::now());
        let mut predicted = 0usize;
        for (n, &(tenant, context, cohort)) in chunk.iter().enumerate() {
            let now = (i * tenth + n) as u64;
            predictor.observe(tenant, context, cohort, now);
            predicted += black_box(predictor.predict(tenant, cohort, now, policy)).len();
        }
        let per = |s: f64| s * 1e9 / chunk.len() as f64;
        let (contexts, cohorts) = predictor.sizes();
        let cpu_ns = per(cpu_seconds() - cpu);
        tenths.push(cpu_ns);
        println!(
            "| {} | {:.0} | {:.0} | {contexts} | {cohorts} | {:.2} |",
            i + 1,
            cpu_ns,
            per(wall.elapsed().as_secs_f64()),
            predicted as f64 / chunk.len() as f64
        );
    }
    let (low, high) = tenths[1..]
        .iter()
        .fold((f64::MAX, 0.0f64), |(l, h), &t| (l.min(t), h.max(t)));
    println!();
    println!(
        "predictor: last tenth ÷ second tenth = {:.2}; tenths 2–10 within {low:.0}–{high:.0} ns",
        tenths[9] / tenths[1]
    );

    // The baseline: contexts only (the part that scanned), over a prefix of the same run.
    let n = baseline_requests.min(requests.len());
    if n == 0 {
        return;
    }
    let mut baseline = ScanningContexts {
        last: HashMap::new(),
        max: config.max_contexts,
    };
    let mut lru = lru::LruCache::new(std::num::NonZeroUsize::new(config.max_contexts).unwrap());
    println!();
    println!(
        "Context bookkeeping alone over the first {n} requests (the map fills at {} contexts):",
        config.max_contexts
    );
    println!();
    println!("| requests | scanning map ns/request | LRU list ns/request | ratio |");
    println!("|---|---|---|---|");
    let slice = n.div_ceil(10).max(1);
    for (i, chunk) in requests[..n].chunks(slice).enumerate() {
        let start = Instant::now();
        for (k, &(_, context, cohort)) in chunk.iter().enumerate() {
            black_box(baseline.observe(context, cohort, (i * slice + k) as u64));
        }
        let scan = start.elapsed().as_secs_f64() * 1e9 / chunk.len() as f64;
        let start = Instant::now();
        for (k, &(_, context, cohort)) in chunk.iter().enumerate() {
            black_box(lru.put(context, (cohort, (i * slice + k) as u64)));
        }
        let list = start.elapsed().as_secs_f64() * 1e9 / chunk.len() as f64;
        println!(
            "| {}–{} | {scan:.0} | {list:.0} | {:.1}× |",
            i * slice,
            i * slice + chunk.len(),
            scan / list
        );
    }
}
