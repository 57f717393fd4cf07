//! The benchmark `gpu-check` prints: fill a store with clustered sketches (made here, at
//! run time), then time `top_k_batch` at a batch size for a while: queries/s, p99 latency
//! per call, device bytes per entry, and the fraction of the int8 tensor peak.

use crate::rng::Rng;
use cohort_batcher_core::store::{EntryMeta, Hit, SketchBytes, Store};
use std::time::{Duration, Instant};

/// Dense int8 tensor-core peak of one H200 (SXM), operations per second.
pub const H200_INT8_PEAK_OPS: f64 = 1.979e15;

/// The fraction of the int8 peak that `qps` queries/s use when each query scores `scored`
/// sketches (entries and centroids).
pub fn peak_fraction(qps: f64, scored: f64) -> f64 {
    qps * 2.0 * 32.0 * scored / H200_INT8_PEAK_OPS
}

/// Queries/s at which an exact scan of `entries` sketches would use the whole int8 peak
/// (a multiply and an add per dimension and entry).
pub fn peak_qps(entries: usize) -> f64 {
    H200_INT8_PEAK_OPS / (2.0 * 32.0 * entries as f64)
}

/// Sketches around 4,096 centres (the shape of real traffic: many near-duplicates).
pub struct Workload {
    rng: Rng,
    centres: Vec<SketchBytes>,
}

impl Workload {
    pub fn new(seed: u64) -> Workload {
        Workload::with_centres(seed, 4096)
    }

    /// Sketches around `centres` centres.
    pub fn with_centres(seed: u64, centres: usize) -> Workload {
        let mut rng = Rng(seed);
        let centres = (0..centres.max(1)).map(|_| rng.sketch()).collect();
        Workload { rng, centres }
    }

    pub fn sketch(&mut self) -> SketchBytes {
        let c = self.centres[self.rng.below(self.centres.len() as u64) as usize];
        let noise = self.rng.sketch();
        std::array::from_fn(|i| c[i].saturating_add(noise[i] >> 3))
    }

    /// Fill `stores` with the same `entries` entries of tenant 0.
    pub fn fill(&mut self, stores: &[&dyn Store], entries: usize) {
        for i in 0..entries as u64 {
            let key = self.rng.next_u64() ^ i;
            let s = self.sketch();
            let meta = EntryMeta {
                tenant: 0,
                cohort: (i % 4096) as u32,
                replica: 0,
                expires_at_s: u32::MAX,
            };
            for store in stores {
                store.upsert(key, &s, meta, 0);
            }
        }
    }
}

/// One measurement.
#[derive(Clone, Debug)]
pub struct Measured {
    pub calls: usize,
    pub queries_per_s: f64,
    pub p99_ms: f64,
}

/// Call `top_k_batch(batch, k)` from `threads` threads for about `budget` (at least one call
/// a thread, at most `max_calls` in all).
pub fn measure(
    store: &dyn Store,
    queries: &[SketchBytes],
    batch: usize,
    k: usize,
    threads: usize,
    budget: Duration,
    max_calls: usize,
) -> Measured {
    let call = |qs: &[SketchBytes]| {
        std::hint::black_box(store.top_k_batch(0, qs, k, 1));
    };
    measure_calls(&call, queries, batch, threads, budget, max_calls)
}

/// Time `call` on batches of `batch` queries from `threads` threads for about `budget` (at
/// least one call a thread, at most `max_calls` in all).
pub fn measure_calls(
    call: &(dyn Fn(&[SketchBytes]) + Sync),
    queries: &[SketchBytes],
    batch: usize,
    threads: usize,
    budget: Duration,
    max_calls: usize,
) -> Measured {
    let started = Instant::now();
    let per_thread = max_calls.div_ceil(threads.max(1)).max(1);
    let lat: Vec<Vec<f64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.max(1))
            .map(|t| {
                s.spawn(move || {
                    let mut out = Vec::new();
                    let mut at = t * batch;
                    while out.len() < per_thread && (out.is_empty() || started.elapsed() < budget) {
                        let from = at % (queries.len() - batch + 1);
                        let at_call = Instant::now();
                        call(&queries[from..from + batch]);
                        out.push(at_call.elapsed().as_secs_f64() * 1e3);
                        at += batch * threads.max(1) + 1;
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let wall = started.elapsed().as_secs_f64();
    let mut all: Vec<f64> = lat.into_iter().flatten().collect();
    all.sort_by(|a, b| a.total_cmp(b));
    let calls = all.len();
    let p99 = all
        .get(((calls as f64 * 0.99).ceil() as usize).saturating_sub(1))
        .copied()
        .unwrap_or(0.0);
    Measured {
        calls,
        queries_per_s: (calls * batch) as f64 / wall,
        p99_ms: p99,
    }
}

/// Recall@k of `got` against `exact`, averaged over queries: the share of each exact answer's
/// keys that `got` also returned (a query with an empty exact answer counts 1).
pub fn recall(got: &[Vec<Hit>], exact: &[Vec<Hit>]) -> f64 {
    let per: Vec<f64> = exact
        .iter()
        .zip(got)
        .map(|(want, have)| {
            if want.is_empty() {
                return 1.0;
            }
            let found = want
                .iter()
                .filter(|w| have.iter().any(|h| h.key == w.key))
                .count();
            found as f64 / want.len() as f64
        })
        .collect();
    per.iter().sum::<f64>() / per.len().max(1) as f64
}
