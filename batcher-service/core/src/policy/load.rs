//! A replica's load as the batcher can know it: the work it assigned, decaying with time.
//!
//! In assign mode the batcher answers "which replica" and never sees the request finish,
//! so it cannot count requests in flight. What it does know is the work it sent each
//! replica and when. An exponentially decaying sum of that work, with a half-life of about
//! the time a request spends in the engine, estimates the work each replica has on its
//! plate now: `load(t) = Σ work_i · 2^(−(t − t_i) / half_life)`. It needs O(1) state per
//! replica, is updated lazily on each read or add, and is driven only by injected time.
//!
//! Hook for engine numbers: a later issue scrapes the engines' own in-flight and queue
//! gauges. [`DecayingLoad::report`] stores such a report; while it is fresh (younger than
//! the policy's `report_ttl_ms`) the effective load is the larger of the estimate and
//! `(in_flight + queued) × mean work per request`, so a report can only add caution (a
//! slow or draining replica), never hide work the batcher knows it sent.

/// Work assigned to one replica, decaying exponentially; plus the last engine report.
#[derive(Debug, Clone, Default)]
pub struct DecayingLoad {
    value: f64,
    at_ms: u64,
    report: Option<(u32, u64)>,
}

impl DecayingLoad {
    fn decay_to(&mut self, now_ms: u64, half_life_ms: u64) {
        if now_ms > self.at_ms {
            let dt = (now_ms - self.at_ms) as f64;
            let hl = half_life_ms.max(1) as f64;
            self.value *= (-dt / hl * std::f64::consts::LN_2).exp();
            self.at_ms = now_ms;
        }
    }

    /// The estimate at `now_ms` (earlier times than the last update read as the last one).
    pub fn estimate(&self, now_ms: u64, half_life_ms: u64) -> f64 {
        let mut copy = self.clone();
        copy.decay_to(now_ms, half_life_ms);
        copy.value
    }

    /// Adds `work` at `now_ms`.
    pub fn add(&mut self, work: f64, now_ms: u64, half_life_ms: u64) {
        self.decay_to(now_ms, half_life_ms);
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
        let est = self.estimate(now_ms, half_life_ms);
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
    use super::DecayingLoad;

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
}
