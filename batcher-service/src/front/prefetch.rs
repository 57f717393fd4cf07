//! Predictive prefetch bookkeeping: exemplars of cohorts, warm-ups in flight, and whether
//! they paid off.
//!
//! The prediction itself is [`cohort_batcher_core::predict`]; this module keeps, per
//! cohort, the last leader's body (the exemplar a warm-up replays with one output token)
//! and the replica it went to (the cohort's owner), and accounts for every warm-up:
//! - **hit**: the predicted cohort's next leader arrived while the warm-up was fresh (it is
//!   then sent to the warmed replica);
//! - **wasted**: nothing of the cohort came within two horizons;
//! - **miss**: a cohort seen before arrived cold (no fresh warm-up, its prefix not held
//!   where it goes) — the case prefetch exists to remove.
//!
//! `prefetch_miss_ratio` = miss / (hit + miss).

use crate::metrics::Scrape;
use cohort_batcher_core::engines::FrontApi;
use cohort_batcher_core::predict::{PredictConfig, Prediction, Predictor, PrefetchPolicy};
use lru::LruCache;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Cohorts whose exemplar is kept.
const EXEMPLARS: usize = 4096;

/// A cohort's last leader: what a warm-up replays, and where.
#[derive(Debug, Clone)]
pub struct Exemplar {
    pub api: FrontApi,
    pub body: Map<String, Value>,
    pub replica: usize,
    /// Assign mode: the prefix blocks its warm-up computes (the shared part, salted as the
    /// filter salts), so a warm-up is skipped while they count as held on the replica and
    /// recorded as held once sent. Empty in batch mode (no such check).
    pub blocks: Vec<u64>,
}

pub struct Prefetcher {
    horizon_ms: u64,
    predictor: Mutex<Predictor>,
    exemplars: Mutex<LruCache<u64, Exemplar>>,
    /// Warm-ups not yet used: cohort → (replica, issued at).
    pending: Mutex<HashMap<u64, (usize, u64)>>,
    issued: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    wasted: AtomicU64,
    failed: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Prefetcher {
    pub fn new(config: PredictConfig) -> Prefetcher {
        Prefetcher {
            horizon_ms: config.horizon_ms,
            predictor: Mutex::new(Predictor::new(config)),
            exemplars: Mutex::new(LruCache::new(NonZeroUsize::new(EXEMPLARS).unwrap())),
            pending: Mutex::new(HashMap::new()),
            issued: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            wasted: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }

    /// A request of `cohort` arrived in `context`: learn the transition.
    pub fn observe(&self, tenant: u64, context: u64, cohort: u64, now_ms: u64) {
        lock(&self.predictor).observe(tenant, context, cohort, now_ms);
    }

    /// The replica a fresh warm-up of `cohort` went to, consuming it (a hit).
    pub fn take_warm(&self, cohort: u64, now_ms: u64) -> Option<usize> {
        let mut pending = lock(&self.pending);
        let (replica, issued) = pending.remove(&cohort)?;
        if now_ms.saturating_sub(issued) > 2 * self.horizon_ms {
            self.wasted.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        self.hits.fetch_add(1, Ordering::Relaxed);
        Some(replica)
    }

    /// A leader of `cohort` was sent to `replica`: it becomes the cohort's exemplar. If
    /// the cohort was seen before and arrives cold (`warm` false, no warm-up used), that
    /// is a miss.
    pub fn leader_sent(&self, cohort: u64, exemplar: Exemplar, used_warmup: bool, warm: bool) {
        let seen = lock(&self.exemplars).put(cohort, exemplar).is_some();
        if seen && !used_warmup && !warm {
            self.misses.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A request of `cohort` was assigned to `replica` without passing the front (assign
    /// mode): the cohort's exemplar, if there is one, now lives there, and an arrival cold
    /// is a miss as for a leader. Returns whether an exemplar is known (else the front
    /// asks the filter for the body).
    pub fn assigned(&self, cohort: u64, replica: usize, used_warmup: bool, warm: bool) -> bool {
        let mut exemplars = lock(&self.exemplars);
        let Some(exemplar) = exemplars.get_mut(&cohort) else {
            return false;
        };
        exemplar.replica = replica;
        if !used_warmup && !warm {
            self.misses.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// The body of an assigned request, sent by the filter because the front asked.
    pub fn keep(&self, cohort: u64, exemplar: Exemplar) {
        lock(&self.exemplars).put(cohort, exemplar);
    }

    /// The predicted cohorts worth warming after a leader of `cohort`, with their
    /// exemplars: not already warming, and seen before.
    pub fn plan(
        &self,
        tenant: u64,
        cohort: u64,
        now_ms: u64,
        policy: PrefetchPolicy,
    ) -> Vec<(Prediction, Exemplar)> {
        let predictions = lock(&self.predictor).predict(tenant, cohort, now_ms, policy);
        if predictions.is_empty() {
            return Vec::new();
        }
        let pending = lock(&self.pending);
        let mut exemplars = lock(&self.exemplars);
        predictions
            .into_iter()
            .filter(|p| !pending.contains_key(&p.cohort))
            .filter_map(|p| exemplars.get(&p.cohort).cloned().map(|e| (p, e)))
            .collect()
    }

    /// A warm-up of `cohort` was sent to `replica`.
    pub fn issued(&self, cohort: u64, replica: usize, now_ms: u64) {
        lock(&self.pending).insert(cohort, (replica, now_ms));
        self.issued.fetch_add(1, Ordering::Relaxed);
    }

    /// A warm-up failed (engine error): it will not be counted as a hit.
    pub fn failed(&self, cohort: u64) {
        lock(&self.pending).remove(&cohort);
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    /// Warm-ups unused for two horizons are wasted.
    pub fn expire(&self, now_ms: u64) {
        let limit = 2 * self.horizon_ms;
        let mut pending = lock(&self.pending);
        let before = pending.len();
        pending.retain(|_, (_, issued)| now_ms.saturating_sub(*issued) <= limit);
        let wasted = (before - pending.len()) as u64;
        self.wasted.fetch_add(wasted, Ordering::Relaxed);
    }

    pub fn write(&self, scrape: &mut Scrape<'_>) {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        scrape.counter(
            "cohort_prefetch_issued_total",
            "Warm-up requests sent for predicted cohorts.",
            n(&self.issued),
        );
        scrape.counter(
            "cohort_prefetch_hit_total",
            "Warm-ups whose cohort arrived while they were fresh.",
            n(&self.hits),
        );
        scrape.counter(
            "cohort_prefetch_miss_total",
            "Cohorts seen before that arrived cold (no warm-up, prefix not held).",
            n(&self.misses),
        );
        scrape.counter(
            "cohort_prefetch_wasted_total",
            "Warm-ups whose cohort did not arrive within two horizons.",
            n(&self.wasted),
        );
        scrape.counter(
            "cohort_prefetch_failed_total",
            "Warm-ups the engine did not answer with success.",
            n(&self.failed),
        );
        let (hits, misses) = (n(&self.hits), n(&self.misses));
        let ratio = if hits + misses == 0 {
            0.0
        } else {
            misses as f64 / (hits + misses) as f64
        };
        scrape.gauge(
            "cohort_prefetch_miss_ratio",
            "miss / (hit + miss) since start.",
            ratio,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exemplar(replica: usize) -> Exemplar {
        Exemplar {
            api: FrontApi::ChatCompletions,
            body: Map::new(),
            replica,
            blocks: Vec::new(),
        }
    }

    #[test]
    fn accounts_hits_misses_and_waste() {
        let p = Prefetcher::new(PredictConfig::default());
        let high = cohort_batcher_core::predict::PrefetchPolicy::of(
            cohort_fingerprint::knobs::Prefetch::High,
        )
        .unwrap();
        // Session walks 1 → 2 twice; 2's exemplar lives on replica 1.
        for (i, t) in [(0u64, 0u64), (1, 10_000)] {
            p.observe(0, i, 1, t);
            p.leader_sent(1, exemplar(0), false, i > 0);
            p.observe(0, i, 2, t + 1_000);
            p.leader_sent(2, exemplar(1), false, false);
        }
        // The second arrival of 2 was cold: one miss.
        let plan = p.plan(0, 1, 20_000, high);
        assert_eq!(plan.len(), 1);
        assert_eq!(plan[0].0.cohort, 2);
        assert_eq!(plan[0].1.replica, 1);
        p.issued(2, 1, 20_000);
        assert!(p.plan(0, 1, 20_000, high).is_empty(), "already warming");
        assert_eq!(p.take_warm(2, 21_000), Some(1));
        assert_eq!(p.take_warm(2, 21_000), None, "used once");
        p.issued(2, 1, 30_000);
        p.expire(30_000 + 6_401);
        let p = std::sync::Arc::new(p);
        let text = crate::metrics::render_one({
            let p = std::sync::Arc::clone(&p);
            move |scrape: &mut Scrape<'_>| p.write(scrape)
        });
        assert!(text.contains("cohort_prefetch_issued_total 2\n"));
        assert!(text.contains("cohort_prefetch_hit_total 1\n"));
        assert!(text.contains("cohort_prefetch_miss_total 1\n"));
        assert!(text.contains("cohort_prefetch_wasted_total 1\n"));
        assert!(text.contains("cohort_prefetch_miss_ratio 0.5\n"));
    }
}
