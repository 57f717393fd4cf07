//! A replica's load as the batcher can know it: the work it assigned, decaying with time.
//!
//! In assign mode the batcher answers "which replica" and never sees the request finish,
//! so it cannot count requests in flight. What it does know is the work it sent each
//! replica and when. An exponentially decaying sum of that work estimates what each
//! replica was given over the recent past; the half-life is the balance horizon (60 s by
//! default, the window the replay measures balance over; shorter half-lives made the
//! guard twitchier and cost hits without improving the windowed balance): `load(t) = Σ work_i · 2^(−(t − t_i) / half_life)`. It needs O(1) state per
//! replica, is updated lazily on each read or add, and is driven only by injected time.
//!
//! With `PolicyConfig::drain_rate_per_s` set, the same state instead drains linearly at
//! that rate ([`Decay::Drain`]): `load = max(0, load − μ·dt)` between adds, the
//! outstanding work of a server executing at μ (see the policy module for why it is not
//! the default).
//!
//! Hook for engine numbers: a later issue scrapes the engines' own in-flight and queue
//! gauges. [`DecayingLoad::report`] stores such a report; while it is fresh (younger than
//! the policy's `report_ttl_ms`) the effective load is the larger of the estimate and
//! `(in_flight + queued) × mean work per request`, so a report can only add caution (a
//! slow or draining replica), never hide work the batcher knows it sent.

/// How the load estimate forgets work as time passes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decay {
    /// Exponential decay with this half-life (ms): recently *assigned* work.
    HalfLife(u64),
    /// Linear drain at this many work units per ms, floored at 0: *outstanding* work of a
    /// server executing at that rate (the replay's server model, the `cohort-replay` crate).
    Drain(f64),
}

/// Work assigned to one replica, decaying (or draining) with time; plus the last engine
/// report.
#[derive(Debug, Clone, Default)]
pub struct DecayingLoad {
    value: f64,
    at_ms: u64,
    report: Option<(u32, u64)>,
}

impl DecayingLoad {
    fn decay_to(&mut self, now_ms: u64, decay: Decay) {
        if now_ms > self.at_ms {
            let dt = (now_ms - self.at_ms) as f64;
            match decay {
                Decay::HalfLife(hl) => {
                    let hl = hl.max(1) as f64;
                    self.value *= (-dt / hl * std::f64::consts::LN_2).exp();
                }
                Decay::Drain(per_ms) => {
                    let per_ms = if per_ms.is_finite() {
                        per_ms.max(0.0)
                    } else {
                        0.0
                    };
                    self.value = (self.value - per_ms * dt).max(0.0);
                }
            }
            self.at_ms = now_ms;
        }
    }

    /// The estimate at `now_ms` (earlier times than the last update read as the last one).
    pub fn estimate(&self, now_ms: u64, half_life_ms: u64) -> f64 {
        self.estimate_with(now_ms, Decay::HalfLife(half_life_ms))
    }

    /// [`Self::estimate`] under any [`Decay`].
    pub fn estimate_with(&self, now_ms: u64, decay: Decay) -> f64 {
        let mut copy = self.clone();
        copy.decay_to(now_ms, decay);
        copy.value
    }

    /// Adds `work` at `now_ms`.
    pub fn add(&mut self, work: f64, now_ms: u64, half_life_ms: u64) {
        self.add_with(work, now_ms, Decay::HalfLife(half_life_ms));
    }

    /// [`Self::add`] under any [`Decay`].
    pub fn add_with(&mut self, work: f64, now_ms: u64, decay: Decay) {
        self.decay_to(now_ms, decay);
        if work.is_finite() && work > 0.0 {
            self.value += work;
        }
    }

    /// Stores an engine-reported count of requests in flight plus queued, seen at `now_ms`.
    pub fn report(&mut self, requests: u32, now_ms: u64) {
        self.report = Some((requests, now_ms));
    }

    /// The load used for decisions: the estimate, raised to a fresh engine report.
    pub fn effective(&self, now_ms: u64, half_life_ms: u64, ttl_ms: u64, mean_work: f64) -> f64 {
        self.effective_with(now_ms, Decay::HalfLife(half_life_ms), ttl_ms, mean_work)
    }

    /// [`Self::effective`] under any [`Decay`].
    pub fn effective_with(&self, now_ms: u64, decay: Decay, ttl_ms: u64, mean_work: f64) -> f64 {
        let est = self.estimate_with(now_ms, decay);
        match self.report {
            Some((n, at)) if now_ms.saturating_sub(at) <= ttl_ms => {
                est.max(f64::from(n) * mean_work)
            }
            _ => est,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Decay, DecayingLoad};

    #[test]
    fn halves_per_half_life_and_reports_raise_only() {
        let mut l = DecayingLoad::default();
        l.add(100.0, 0, 1000);
        assert!((l.estimate(1000, 1000) - 50.0).abs() < 1e-9);
        assert!((l.estimate(0, 1000) - 100.0).abs() < 1e-9);
        l.report(10, 1000);
        assert!((l.effective(1000, 1000, 500, 20.0) - 200.0).abs() < 1e-9);
        assert!((l.effective(2000, 1000, 500, 20.0) - 25.0).abs() < 1e-9);
        l.report(0, 2000);
        assert!((l.effective(2000, 1000, 500, 20.0) - 25.0).abs() < 1e-9);
    }

    #[test]
    fn drains_linearly_to_zero() {
        let mut l = DecayingLoad::default();
        let d = Decay::Drain(0.5);
        l.add_with(100.0, 0, d);
        assert!((l.estimate_with(100, d) - 50.0).abs() < 1e-9);
        assert_eq!(l.estimate_with(1000, d), 0.0);
        l.add_with(10.0, 1000, d);
        assert!((l.estimate_with(1000, d) - 10.0).abs() < 1e-9);
    }
}
