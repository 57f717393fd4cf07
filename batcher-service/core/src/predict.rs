//! Which cohorts come next: an order-1 Markov model over cohort sequences, with decay.
//!
//! Traffic recurs: an agent's step 2 follows its step 1, a support flow's "refund" follows
//! "order status", a nightly job walks the same prompts. The batcher sees each request's
//! cohort and its context (the `x-cohort-session` conversation, else the tenant), so it
//! can learn, per tenant, how often cohort A is followed by cohort B in the same context
//! and after how long. When A arrives, the Bs likely to arrive within the horizon (default
//! 3.2 s) are worth warming on their owner replica now, while it is idle, so their first
//! request does not pay the cold prefill.
//!
//! Model: for each tenant and cohort A, decayed transition weights `w(A→B)` (half-life
//! `half_life_ms`; old habits fade) and an exponentially weighted mean gap `g(A→B)`.
//! `P(B | A) = w(A→B) / Σ_X w(A→X)`. A prediction is `(B, P, g)` for the top-k Bs with
//! `P ≥ floor` and `g ≤ horizon`. Memory is bounded: at most `max_followers` Bs per A
//! (the lightest is dropped), `max_cohorts` As (the least recently followed is dropped)
//! and `max_contexts` live contexts (the least recently seen is dropped). Every bound is
//! kept by an LRU list, so a request costs O(`max_followers`) whatever the number of
//! sessions (`examples/predict_bench.rs` measures it over a million).
//!
//! The prefetch aggressiveness a request asks for (`x-cohort-prefetch`) picks
//! `(top-k, floor, idle guard)` through [`PrefetchPolicy::of`].

use cohort_fingerprint::knobs::Prefetch;
use lru::LruCache;
use std::num::NonZeroUsize;

/// The predictor's knobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PredictConfig {
    /// Predictions further away than this are not acted on, ms.
    pub horizon_ms: u64,
    /// Half-life of transition weights, ms.
    pub half_life_ms: u64,
    /// Followers remembered per cohort.
    pub max_followers: usize,
    /// Contexts (sessions or tenants) remembered.
    pub max_contexts: usize,
    /// Cohorts whose followers are remembered (per tenant and cohort).
    pub max_cohorts: usize,
}

impl Default for PredictConfig {
    fn default() -> Self {
        PredictConfig {
            horizon_ms: 3_200,
            half_life_ms: 600_000,
            max_followers: 8,
            max_contexts: 100_000,
            max_cohorts: 100_000,
        }
    }
}

/// What a prefetch level allows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefetchPolicy {
    /// Predictions acted on per request.
    pub top_k: usize,
    /// Minimum `P(B | A)`.
    pub floor: f64,
    /// Idle slots the owner replica must have for a warm-up to be sent.
    pub idle_slots: usize,
}

impl PrefetchPolicy {
    /// What each level of `x-cohort-prefetch` allows; `none` nothing.
    pub fn of(level: Prefetch) -> Option<PrefetchPolicy> {
        let (top_k, floor, idle_slots) = match level {
            Prefetch::None => return None,
            Prefetch::Low => (1, 0.5, 2),
            Prefetch::Medium => (2, 0.25, 1),
            Prefetch::High => (3, 0.1, 1),
        };
        Some(PrefetchPolicy {
            top_k,
            floor,
            idle_slots,
        })
    }
}

/// A cohort predicted to arrive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    pub cohort: u64,
    pub probability: f64,
    /// Expected time until it arrives, ms.
    pub gap_ms: u64,
}

#[derive(Debug, Clone, Copy)]
struct Edge {
    weight: f64,
    updated_ms: u64,
    gap_ms: f64,
}

#[derive(Debug, Clone, Copy)]
struct Last {
    cohort: u64,
    at_ms: u64,
}

/// The model. Keys are `(tenant, cohort)`; contexts are opaque hashes.
#[derive(Debug)]
pub struct Predictor {
    config: PredictConfig,
    /// `(tenant, A)` → A's followers, least recently followed first out.
    edges: LruCache<(u64, u64), Vec<(u64, Edge)>>,
    /// Each context's last cohort, least recently seen first out: O(1) per request (a scan
    /// for the oldest cost a pass over 100,000 contexts per request once full).
    last: LruCache<u64, Last>,
}

const GAP_EWMA: f64 = 0.3;

impl Predictor {
    pub fn new(config: PredictConfig) -> Predictor {
        let contexts = NonZeroUsize::new(config.max_contexts).unwrap_or(NonZeroUsize::MIN);
        let cohorts = NonZeroUsize::new(config.max_cohorts).unwrap_or(NonZeroUsize::MIN);
        Predictor {
            config,
            edges: LruCache::new(cohorts),
            last: LruCache::new(contexts),
        }
    }

    fn decay(&self, weight: f64, dt_ms: u64) -> f64 {
        weight * 0.5f64.powf(dt_ms as f64 / self.config.half_life_ms.max(1) as f64)
    }

    /// Records that `cohort` arrived in `context` of `tenant` at `now_ms`, learning the
    /// transition from the context's previous cohort.
    pub fn observe(&mut self, tenant: u64, context: u64, cohort: u64, now_ms: u64) {
        let previous = self.last.put(
            context,
            Last {
                cohort,
                at_ms: now_ms,
            },
        );
        let Some(previous) = previous else { return };
        let gap = now_ms.saturating_sub(previous.at_ms) as f64;
        let half_life = self.config.half_life_ms.max(1) as f64;
        let max_followers = self.config.max_followers.max(1);
        let followers = self
            .edges
            .get_or_insert_mut((tenant, previous.cohort), Vec::new);
        match followers.iter_mut().find(|(to, _)| *to == cohort) {
            Some((_, edge)) => {
                let dt = now_ms.saturating_sub(edge.updated_ms) as f64;
                edge.weight = edge.weight * 0.5f64.powf(dt / half_life) + 1.0;
                edge.updated_ms = now_ms;
                edge.gap_ms += GAP_EWMA * (gap - edge.gap_ms);
            }
            None => {
                if followers.len() >= max_followers {
                    let lightest = (0..followers.len()).min_by(|&a, &b| {
                        let wa = followers[a].1.weight;
                        let wb = followers[b].1.weight;
                        wa.total_cmp(&wb)
                    });
                    if let Some(i) = lightest {
                        followers.swap_remove(i);
                    }
                }
                followers.push((
                    cohort,
                    Edge {
                        weight: 1.0,
                        updated_ms: now_ms,
                        gap_ms: gap,
                    },
                ));
            }
        }
    }

    /// The cohorts likely to follow `cohort` (for `tenant`) within the horizon, most
    /// likely first, as allowed by `policy`.
    pub fn predict(
        &self,
        tenant: u64,
        cohort: u64,
        now_ms: u64,
        policy: PrefetchPolicy,
    ) -> Vec<Prediction> {
        let Some(followers) = self.edges.peek(&(tenant, cohort)) else {
            return Vec::new();
        };
        let weights: Vec<f64> = followers
            .iter()
            .map(|(_, e)| self.decay(e.weight, now_ms.saturating_sub(e.updated_ms)))
            .collect();
        let total: f64 = weights.iter().sum();
        if total <= 0.0 {
            return Vec::new();
        }
        let mut out: Vec<Prediction> = followers
            .iter()
            .zip(&weights)
            .map(|((to, e), w)| Prediction {
                cohort: *to,
                probability: w / total,
                gap_ms: e.gap_ms.max(0.0) as u64,
            })
            .filter(|p| {
                p.cohort != cohort
                    && p.probability >= policy.floor
                    && p.gap_ms <= self.config.horizon_ms
            })
            .collect();
        out.sort_by(|a, b| b.probability.total_cmp(&a.probability));
        out.truncate(policy.top_k);
        out
    }

    pub fn config(&self) -> &PredictConfig {
        &self.config
    }

    /// Contexts and cohorts currently remembered.
    pub fn sizes(&self) -> (usize, usize) {
        (self.last.len(), self.edges.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HIGH: PrefetchPolicy = PrefetchPolicy {
        top_k: 3,
        floor: 0.1,
        idle_slots: 1,
    };

    #[test]
    fn learns_a_recurring_sequence_and_its_gaps() {
        let mut p = Predictor::new(PredictConfig::default());
        // A session walks A → B → C three times, 1 s apart.
        let mut t = 0;
        for round in 0..3 {
            for cohort in [1, 2, 3] {
                p.observe(9, 100 + round, cohort, t);
                t += 1_000;
            }
        }
        let next = p.predict(9, 1, t, HIGH);
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].cohort, 2);
        assert!((next[0].probability - 1.0).abs() < 1e-9);
        assert_eq!(next[0].gap_ms, 1_000);
        assert_eq!(p.predict(9, 2, t, HIGH)[0].cohort, 3);
        // Another tenant learned nothing.
        assert!(p.predict(8, 1, t, HIGH).is_empty());
    }

    #[test]
    fn floors_top_k_and_horizon_filter_predictions() {
        let mut p = Predictor::new(PredictConfig::default());
        // From cohort 1: to 2 three times, to 3 once, to 4 once but 10 s later.
        for (i, (to, gap)) in [(2, 500), (2, 500), (2, 500), (3, 500), (4, 10_000)]
            .into_iter()
            .enumerate()
        {
            let ctx = i as u64;
            p.observe(0, ctx, 1, 0);
            p.observe(0, ctx, to, gap);
        }
        let high = p.predict(0, 1, 10_000, HIGH);
        let cohorts: Vec<u64> = high.iter().map(|x| x.cohort).collect();
        assert_eq!(cohorts, vec![2, 3], "4 is beyond the 3.2 s horizon");
        assert!((high[0].probability - 0.6).abs() < 0.01);
        let low = PrefetchPolicy::of(Prefetch::Low).unwrap();
        let only = p.predict(0, 1, 10_000, low);
        assert_eq!(only.len(), 1);
        assert_eq!(only[0].cohort, 2);
        assert!(PrefetchPolicy::of(Prefetch::None).is_none());
    }

    #[test]
    fn old_habits_fade() {
        let config = PredictConfig {
            half_life_ms: 1_000,
            ..PredictConfig::default()
        };
        let mut p = Predictor::new(config);
        for i in 0..8 {
            p.observe(0, i, 1, 0);
            p.observe(0, i, 2, 100);
        }
        // Much later the habit changes to 1 → 3, twice.
        for i in 10..12 {
            p.observe(0, i, 1, 20_000);
            p.observe(0, i, 3, 20_100);
        }
        let next = p.predict(0, 1, 20_100, HIGH);
        assert_eq!(next[0].cohort, 3);
        assert!(next[0].probability > 0.99);
    }

    #[test]
    fn memory_is_bounded() {
        let config = PredictConfig {
            max_followers: 2,
            max_contexts: 3,
            max_cohorts: 4,
            ..PredictConfig::default()
        };
        let mut p = Predictor::new(config);
        for to in 2..10 {
            p.observe(0, to, 1, to);
            p.observe(0, to, to, to + 1);
        }
        assert!(p.edges.iter().all(|(_, f)| f.len() <= 2));
        assert!(p.last.len() <= 3);
        // Every context starts a cohort of its own: only the 4 latest are remembered.
        for a in 100..200 {
            p.observe(0, a, a, 1_000);
            p.observe(0, a, a + 1_000, 1_001);
        }
        assert_eq!(p.sizes(), (3, 4));
        assert!(
            p.predict(0, 199, 1_002, HIGH).len() == 1,
            "the newest is kept"
        );
    }

    #[test]
    fn the_least_recently_seen_context_is_forgotten_first() {
        let mut p = Predictor::new(PredictConfig {
            max_contexts: 2,
            ..PredictConfig::default()
        });
        p.observe(0, 1, 10, 0);
        p.observe(0, 2, 10, 1);
        p.observe(0, 1, 11, 2); // context 1 seen again: 2 is now the oldest
        p.observe(0, 3, 10, 3); // a third context: 2 goes
        assert!(p.last.contains(&1) && p.last.contains(&3) && !p.last.contains(&2));
        // Context 2 comes back with no memory: no transition learnt from its old cohort.
        p.observe(0, 2, 12, 4);
        assert!(p.predict(0, 10, 4, HIGH).iter().all(|n| n.cohort != 12));
        // Context 1's 10 → 11 was learnt.
        assert_eq!(p.predict(0, 10, 4, HIGH)[0].cohort, 11);
    }
}
