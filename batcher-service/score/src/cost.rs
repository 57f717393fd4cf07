//! The effective-cost model: what a workload's prompt tokens cost once the prefix cache
//! has done its part, relative to computing every token.
//!
//! `effective = base × (1 − saving) × (1 + miss_penalty × (1 − hit_ratio))`
//!
//! - `saving`: the share of prompt tokens served from a cache (measured: the tokens the
//!   chosen replica held at Assign, or, for `cohort score`, the blocks an earlier prompt
//!   already computed);
//! - `hit_ratio`: the share of requests that found any of their prefix cached; a request
//!   that finds none also pays what a miss costs beyond its own prefill (a cold replica's
//!   queue, a prefix pulled out of the cache for it), which `miss_penalty` prices;
//! - `base`: the cost of one prompt token computed from scratch, in the operator's unit
//!   (1: the result is relative; a price per token gives money).
//!
//! The coefficients are configuration (`[cost]` of `cohort serve`; `--cost-base` and
//! `--cost-miss-penalty` of `cohort score`).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CostModel {
    /// Cost of one prompt token computed from scratch.
    pub base: f64,
    /// Extra cost of a request that finds none of its prefix cached, as a share of base.
    pub miss_penalty: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            base: 1.0,
            miss_penalty: 0.5,
        }
    }
}

impl CostModel {
    /// The effective cost per prompt token for a measured saving and hit ratio (both 0–1,
    /// clamped; NaN counts as 0).
    pub fn effective(&self, saving: f64, hit_ratio: f64) -> f64 {
        let unit = |x: f64| if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) };
        self.base * (1.0 - unit(saving)) * (1.0 + self.miss_penalty * (1.0 - unit(hit_ratio)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_formula_and_its_coefficients() {
        let m = CostModel::default();
        // Nothing cached, nothing hit: base × (1 + penalty).
        assert_eq!(m.effective(0.0, 0.0), 1.5);
        // Every request hits, 60% of tokens served from cache.
        assert!((m.effective(0.6, 1.0) - 0.4).abs() < 1e-12);
        assert!((m.effective(0.5, 0.5) - 0.625).abs() < 1e-12);
        // The coefficients act.
        let priced = CostModel {
            base: 2.0,
            miss_penalty: 0.0,
        };
        assert_eq!(priced.effective(0.0, 0.0), 2.0);
        assert_eq!(priced.effective(0.25, 0.0), 1.5);
        // Out-of-range inputs are clamped, NaN is none.
        assert_eq!(m.effective(2.0, -1.0), 0.0);
        assert_eq!(m.effective(f64::NAN, f64::NAN), 1.5);
    }
}
