//! The automatic circuit breaker: Cohort switches itself off when the traffic it routes
//! does worse than the hold-out ([`crate::rollout`]), and back on once it recovers.
//!
//! What is compared: every request Cohort routed (the *cohort* group) and every held-out
//! request (the *hold-out* group) report their outcome when the response headers come:
//! whether the status was 5xx, and the time from the request headers to the response
//! headers (time to first byte, which for a streamed completion is the time to first
//! token). Outcomes are kept per second over a sliding window (`window_s`).
//!
//! The states:
//! - **closed** (Cohort acts): it trips on one of two rules over the window.
//!   - The **relative** rule compares with the hold-out, once both groups have at least
//!     `min_requests` outcomes: the cohort group's 5xx rate is above `max_error_rate`
//!     (0.5%) *and* above the hold-out's by more than chance (a one-sided two-proportion
//!     z test, z ≥ `evidence_z`), or its p99 is more than `max_latency_increase` (+200%)
//!     over the hold-out's p99 and more than `min_latency_delta_ms` (50 ms) above it
//!     (below that, the ratio is Cohort's own sub-millisecond work against a fast
//!     upstream, not harm).
//!   - The **absolute** rule needs no hold-out: once the cohort group has at least
//!     `absolute_min_requests` outcomes, its 5xx rate is above `absolute_max_error_rate`
//!     (0.5%) by more than chance (z ≥ `evidence_z` against that rate).
//!
//!   The evidence bound is what keeps a fleet that fails for everyone from tripping the
//!   relative rule by the luck of a small hold-out (5% of the users: a few dozen
//!   outcomes, often none of them 5xx), and a healthy fleet's odd 5xx from tripping the
//!   absolute one. Its price: telling a 2% cohort error rate from a clean hold-out takes
//!   some 450 hold-out outcomes, and from 0.5% some 200 cohort outcomes, so with a small
//!   hold-out the absolute rule is usually the first to see an error fault; the relative
//!   rule is the one that sees latency, and errors when the absolute rule is off.
//! - **open**: every request bypasses Cohort (`breaker_open`) for `cool_down_s`.
//! - **half-open**: a probe share of the treated users (`probe_share`, by the same stable
//!   bucket as the rollout) goes through Cohort again, the rest still bypasses. The window
//!   starts empty; the same rule trips it open again, and `probe_s` without a trip (with at
//!   least `min_requests` probe outcomes) closes it.
//!
//! Sharing: Envoy runs one VM per worker thread. Each worker collects its outcomes in a
//! [`Window`] of its own and, every half second, folds them into the one [`Breaker`] all
//! workers share (proxy-wasm shared data, written with compare-and-swap) and reads the
//! state back. The worker whose write moves the state is the one that counts the trip.
//! So the state reaches every worker within a tick of the write.
//!
//! Latency is kept as a histogram of exponential buckets (×1.25 from 1 ms up to a minute),
//! so a p99 is known to within 25%: enough for a +200% rule.

use serde::{Deserialize, Serialize};

/// Latency histogram buckets: bucket `i` holds latencies up to `1.25^i` ms (the last one
/// everything above).
pub const LATENCY_BUCKETS: usize = 50;
const BUCKET_RATIO: f64 = 1.25;

/// The two groups the breaker compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// Requests Cohort routed on their fingerprint.
    Cohort = 0,
    /// Requests held out of the rollout (routed as without Cohort).
    Holdout = 1,
}

/// Outcomes of one group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupStats {
    pub requests: u64,
    /// Responses with a 5xx status.
    pub errors: u64,
    /// Time to the response headers, per [`LATENCY_BUCKETS`] bucket.
    pub latency: Vec<u64>,
}

impl Default for GroupStats {
    fn default() -> Self {
        GroupStats {
            requests: 0,
            errors: 0,
            latency: vec![0; LATENCY_BUCKETS],
        }
    }
}

/// The bucket holding a latency of `ms`.
fn latency_bucket(ms: f64) -> usize {
    if ms <= 1.0 || ms.is_nan() {
        return 0;
    }
    ((ms.ln() / BUCKET_RATIO.ln()).ceil() as usize).min(LATENCY_BUCKETS - 1)
}

/// The upper bound of bucket `i`, ms.
fn bucket_bound(i: usize) -> f64 {
    BUCKET_RATIO.powi(i as i32)
}

impl GroupStats {
    fn record(&mut self, error: bool, latency_ms: f64) {
        self.requests += 1;
        self.errors += u64::from(error);
        self.latency.resize(LATENCY_BUCKETS, 0);
        self.latency[latency_bucket(latency_ms)] += 1;
    }

    fn merge(&mut self, other: &GroupStats) {
        self.requests += other.requests;
        self.errors += other.errors;
        self.latency.resize(LATENCY_BUCKETS, 0);
        for (mine, theirs) in self.latency.iter_mut().zip(&other.latency) {
            *mine += theirs;
        }
    }

    /// Share of responses that were 5xx (0 with no responses).
    pub fn error_rate(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.errors as f64 / self.requests as f64
        }
    }

    /// The 99th percentile of the time to response headers, ms (the upper bound of its
    /// bucket); `None` with no responses.
    pub fn p99_ms(&self) -> Option<f64> {
        let total: u64 = self.latency.iter().sum();
        if total == 0 {
            return None;
        }
        // The smallest bucket bound with at least 99% of the outcomes at or below it.
        let rank = (total * 99).div_ceil(100);
        let mut seen = 0;
        for (i, n) in self.latency.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(bucket_bound(i));
            }
        }
        Some(bucket_bound(LATENCY_BUCKETS - 1))
    }
}

/// One second of outcomes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Slot {
    /// Unix second.
    pub second: u64,
    /// Indexed by [`Group`].
    pub groups: [GroupStats; 2],
}

/// Outcomes per second, oldest first: one worker's since its last fold, or the shared
/// window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Window {
    pub slots: Vec<Slot>,
}

impl Window {
    fn slot(&mut self, second: u64) -> &mut Slot {
        let at = self.slots.partition_point(|s| s.second < second);
        if self.slots.get(at).is_none_or(|s| s.second != second) {
            self.slots.insert(
                at,
                Slot {
                    second,
                    ..Slot::default()
                },
            );
        }
        &mut self.slots[at]
    }

    /// Records one response of `group`.
    pub fn record(&mut self, now_ms: u64, group: Group, error: bool, latency_ms: f64) {
        self.slot(now_ms / 1000).groups[group as usize].record(error, latency_ms);
    }

    /// Adds `other`'s outcomes to this window.
    pub fn merge(&mut self, other: &Window) {
        for theirs in &other.slots {
            let mine = self.slot(theirs.second);
            for (g, stats) in theirs.groups.iter().enumerate() {
                mine.groups[g].merge(stats);
            }
        }
    }

    /// Drops the seconds that have left a window of `window_s` ending at `now_ms`.
    pub fn prune(&mut self, now_ms: u64, window_s: u64) {
        let first = (now_ms / 1000).saturating_sub(window_s.saturating_sub(1));
        self.slots.retain(|s| s.second >= first);
    }

    /// Each group's outcomes over the window of `window_s` ending at `now_ms`.
    pub fn totals(&self, now_ms: u64, window_s: u64) -> [GroupStats; 2] {
        let first = (now_ms / 1000).saturating_sub(window_s.saturating_sub(1));
        let mut totals: [GroupStats; 2] = Default::default();
        for slot in self.slots.iter().filter(|s| s.second >= first) {
            for (g, stats) in slot.groups.iter().enumerate() {
                totals[g].merge(stats);
            }
        }
        totals
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

/// Where the breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    #[default]
    Closed,
    Open,
    HalfOpen,
}

impl State {
    /// The `cohort_breaker_state` gauge: 0 closed, 1 open, 2 half-open.
    pub fn gauge(self) -> u64 {
        match self {
            State::Closed => 0,
            State::Open => 1,
            State::HalfOpen => 2,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half_open",
        }
    }
}

/// The `breaker` section of the plugin configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BreakerConfig {
    pub enabled: bool,
    /// Sliding window the rates and the p99s are taken over, seconds.
    pub window_s: u64,
    /// Outcomes each group needs in the window before the relative rule judges.
    pub min_requests: u64,
    /// Relative rule: trip when the cohort group's 5xx rate is above this and above the
    /// hold-out's (by `evidence_z`).
    pub max_error_rate: f64,
    /// Trip when the cohort group's p99 is above the hold-out's × (1 + this)…
    pub max_latency_increase: f64,
    /// …and above it by more than this many ms: at sub-millisecond upstreams Cohort's own
    /// work (buffering and fingerprinting the body) is a large ratio and no harm.
    pub min_latency_delta_ms: f64,
    /// How long the breaker stays open before probing, seconds.
    pub cool_down_s: u64,
    /// Share of treated users whose requests probe while half-open.
    pub probe_share: f64,
    /// How long probes must go without a trip to close, seconds.
    pub probe_s: u64,
    /// Whether the absolute rule (no hold-out needed) judges.
    pub absolute_enabled: bool,
    /// Absolute rule: trip when the cohort group's 5xx rate is above this (by
    /// `evidence_z`).
    pub absolute_max_error_rate: f64,
    /// Outcomes the cohort group needs in the window before the absolute rule judges.
    pub absolute_min_requests: u64,
    /// How many standard errors an error rate must stand above its bound (the hold-out's
    /// rate, or `absolute_max_error_rate`) to trip: 3 leaves about one chance in 700 per
    /// independent window; 0 trips on the rates alone.
    pub evidence_z: f64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            enabled: true,
            window_s: 10,
            min_requests: 20,
            max_error_rate: 0.005,
            max_latency_increase: 2.0,
            min_latency_delta_ms: 50.0,
            cool_down_s: 30,
            probe_share: 0.1,
            probe_s: 10,
            absolute_enabled: true,
            absolute_max_error_rate: 0.005,
            absolute_min_requests: 200,
            evidence_z: 3.0,
        }
    }
}

/// Why the breaker tripped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Trip {
    /// Relative rule: 5xx rates of the cohort group and the hold-out.
    Errors { cohort: f64, holdout: f64 },
    /// Relative rule: p99 time to first byte of the cohort group and the hold-out, ms.
    Latency { cohort: f64, holdout: f64 },
    /// Absolute rule: the cohort group's 5xx rate over its outcomes.
    AbsoluteErrors { cohort: f64, requests: u64 },
}

/// The two rules, for the per-rule trip counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Against the hold-out.
    Relative,
    /// Against a fixed error rate.
    Absolute,
}

impl Rule {
    pub const ALL: [Rule; 2] = [Rule::Relative, Rule::Absolute];

    pub fn as_str(self) -> &'static str {
        match self {
            Rule::Relative => "relative",
            Rule::Absolute => "absolute",
        }
    }
}

impl Trip {
    /// The rule that tripped.
    pub fn rule(&self) -> Rule {
        match self {
            Trip::Errors { .. } | Trip::Latency { .. } => Rule::Relative,
            Trip::AbsoluteErrors { .. } => Rule::Absolute,
        }
    }
}

impl std::fmt::Display for Trip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Trip::Errors { cohort, holdout } => write!(
                f,
                "relative: cohort 5xx {:.2}% against the hold-out's {:.2}%",
                cohort * 100.0,
                holdout * 100.0
            ),
            Trip::Latency { cohort, holdout } => write!(
                f,
                "relative: cohort p99 {cohort:.0} ms against the hold-out's {holdout:.0} ms"
            ),
            Trip::AbsoluteErrors { cohort, requests } => write!(
                f,
                "absolute: cohort 5xx {:.2}% of {requests} responses",
                cohort * 100.0
            ),
        }
    }
}

/// One-sided z of the cohort group's error rate over the hold-out's (pooled two-proportion
/// test); 0 when neither group has an error or both only errors.
pub fn z_over_holdout(cohort: &GroupStats, holdout: &GroupStats) -> f64 {
    let (n1, n2) = (cohort.requests as f64, holdout.requests as f64);
    if n1 == 0.0 || n2 == 0.0 {
        return 0.0;
    }
    let pooled = (cohort.errors + holdout.errors) as f64 / (n1 + n2);
    let variance = pooled * (1.0 - pooled) * (1.0 / n1 + 1.0 / n2);
    if variance <= 0.0 {
        return 0.0;
    }
    (cohort.error_rate() - holdout.error_rate()) / variance.sqrt()
}

/// One-sided z of a group's error rate over a fixed `rate` (0 < `rate` < 1).
pub fn z_over_rate(group: &GroupStats, rate: f64) -> f64 {
    let n = group.requests as f64;
    let variance = rate * (1.0 - rate) / n;
    if n == 0.0 || variance <= 0.0 {
        return 0.0;
    }
    (group.error_rate() - rate) / variance.sqrt()
}

/// A change of state, for the log.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transition {
    pub from: State,
    pub to: State,
    pub trip: Option<Trip>,
}

/// The trip rules over one window's totals: the relative rule first, then the absolute.
pub fn trip(config: &BreakerConfig, totals: &[GroupStats; 2]) -> Option<Trip> {
    relative(config, totals).or_else(|| absolute(config, &totals[Group::Cohort as usize]))
}

/// The relative rule: the cohort group against the hold-out.
pub fn relative(config: &BreakerConfig, totals: &[GroupStats; 2]) -> Option<Trip> {
    let [cohort, holdout] = totals;
    let enough = config.min_requests.max(1);
    if cohort.requests < enough || holdout.requests < enough {
        return None;
    }
    let (ce, he) = (cohort.error_rate(), holdout.error_rate());
    if ce > config.max_error_rate && ce > he && z_over_holdout(cohort, holdout) >= config.evidence_z
    {
        return Some(Trip::Errors {
            cohort: ce,
            holdout: he,
        });
    }
    if let (Some(cp), Some(hp)) = (cohort.p99_ms(), holdout.p99_ms()) {
        if cp > hp * (1.0 + config.max_latency_increase) && cp - hp > config.min_latency_delta_ms {
            return Some(Trip::Latency {
                cohort: cp,
                holdout: hp,
            });
        }
    }
    None
}

/// The absolute rule: the cohort group's 5xx rate against `absolute_max_error_rate`.
pub fn absolute(config: &BreakerConfig, cohort: &GroupStats) -> Option<Trip> {
    if !config.absolute_enabled || cohort.requests < config.absolute_min_requests.max(1) {
        return None;
    }
    let rate = cohort.error_rate();
    let bound = config.absolute_max_error_rate;
    let evident = bound <= 0.0 || bound >= 1.0 || z_over_rate(cohort, bound) >= config.evidence_z;
    (rate > bound && evident).then_some(Trip::AbsoluteErrors {
        cohort: rate,
        requests: cohort.requests,
    })
}

/// The state every worker shares.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Breaker {
    pub state: State,
    /// When the state began, Unix ms.
    pub since_ms: u64,
    pub window: Window,
}

impl Breaker {
    /// Folds a worker's outcomes in and moves the state by the rule; returns the change.
    pub fn update(
        &mut self,
        config: &BreakerConfig,
        pending: &Window,
        now_ms: u64,
    ) -> Option<Transition> {
        self.window.merge(pending);
        self.window.prune(now_ms, config.window_s);
        let from = self.state;
        let elapsed_ms = now_ms.saturating_sub(self.since_ms);
        let (to, why) = match self.state {
            State::Closed | State::HalfOpen => {
                let totals = self.window.totals(now_ms, config.window_s);
                match trip(config, &totals) {
                    Some(why) => (State::Open, Some(why)),
                    None if self.state == State::HalfOpen
                        && elapsed_ms >= config.probe_s * 1000
                        && totals[Group::Cohort as usize].requests >= config.min_requests =>
                    {
                        (State::Closed, None)
                    }
                    None => return None,
                }
            }
            State::Open if elapsed_ms >= config.cool_down_s * 1000 => (State::HalfOpen, None),
            State::Open => return None,
        };
        self.state = to;
        self.since_ms = now_ms;
        // Each state judges only what happened in it.
        self.window = Window::default();
        Some(Transition {
            from,
            to,
            trip: why,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> BreakerConfig {
        BreakerConfig {
            window_s: 5,
            min_requests: 20,
            cool_down_s: 3,
            probe_s: 2,
            ..BreakerConfig::default()
        }
    }

    /// `n` outcomes of `group` at `now_ms`, `errors` of them 5xx, all taking `ms`.
    fn outcomes(now_ms: u64, group: Group, n: u64, errors: u64, ms: f64) -> Window {
        let mut w = Window::default();
        for i in 0..n {
            w.record(now_ms, group, i < errors, ms);
        }
        w
    }

    #[test]
    fn buckets_bound_latencies_within_a_quarter() {
        for ms in [0.2, 1.0, 3.0, 40.0, 999.0, 20_000.0] {
            let bound = bucket_bound(latency_bucket(ms));
            assert!(
                bound >= ms && bound <= (ms * BUCKET_RATIO).max(1.0),
                "{ms} -> {bound}"
            );
        }
        assert_eq!(latency_bucket(1e12), LATENCY_BUCKETS - 1);
        let mut g = GroupStats::default();
        for i in 0..100 {
            g.record(false, if i < 98 { 10.0 } else { 1000.0 });
        }
        assert!(g.p99_ms().unwrap() >= 1000.0);
        assert_eq!(GroupStats::default().p99_ms(), None);
    }

    #[test]
    fn the_window_slides_and_merges_per_second() {
        let mut shared = Window::default();
        shared.merge(&outcomes(10_500, Group::Cohort, 3, 1, 5.0));
        shared.merge(&outcomes(10_900, Group::Cohort, 2, 0, 5.0));
        shared.merge(&outcomes(12_100, Group::Holdout, 4, 0, 5.0));
        assert_eq!(shared.slots.len(), 2);
        let totals = shared.totals(12_100, 5);
        assert_eq!((totals[0].requests, totals[0].errors), (5, 1));
        assert_eq!(totals[1].requests, 4);
        // Second 10 leaves a 2-second window ending in second 12.
        assert_eq!(shared.totals(12_100, 2)[0].requests, 0);
        shared.prune(12_100, 2);
        assert_eq!(shared.slots.len(), 1);
    }

    #[test]
    fn errors_trip_only_above_the_threshold_and_the_hold_out_by_more_than_chance() {
        let c = config();
        let both = |ce: u64, he: u64| {
            let mut w = outcomes(1_000, Group::Cohort, 100, ce, 10.0);
            w.merge(&outcomes(1_000, Group::Holdout, 100, he, 10.0));
            trip(&c, &w.totals(1_000, 5))
        };
        assert_eq!(both(0, 0), None);
        assert_eq!(
            both(10, 0),
            Some(Trip::Errors {
                cohort: 0.1,
                holdout: 0.0
            })
        );
        // One 5xx in 100 against none is chance (z 1.0), not evidence.
        assert_eq!(both(1, 0), None);
        // The whole fleet is failing: not Cohort's doing.
        assert_eq!(both(5, 5), None);
        assert_eq!(both(5, 8), None);
        // Too few outcomes to judge.
        let mut few = outcomes(1_000, Group::Cohort, 10, 10, 10.0);
        few.merge(&outcomes(1_000, Group::Holdout, 100, 0, 10.0));
        assert_eq!(trip(&c, &few.totals(1_000, 5)), None);
        // Without a hold-out the relative rule has nothing to compare with; the absolute
        // rule wants `absolute_min_requests` (200) outcomes first.
        let alone = outcomes(1_000, Group::Cohort, 100, 50, 10.0);
        assert_eq!(trip(&c, &alone.totals(1_000, 5)), None);
        assert_eq!(relative(&c, &alone.totals(1_000, 5)), None);
    }

    #[test]
    fn a_fleet_failing_alike_trips_the_absolute_rule_and_not_the_relative_one() {
        // 2% of every request fails; a 5% hold-out saw 50 outcomes and, by luck, no 5xx
        // (a 36% chance at 2%): the rates alone would blame Cohort.
        let c = BreakerConfig::default();
        let mut w = outcomes(1_000, Group::Cohort, 950, 19, 10.0);
        w.merge(&outcomes(1_000, Group::Holdout, 50, 0, 10.0));
        let totals = w.totals(1_000, 10);
        assert!(z_over_holdout(&totals[0], &totals[1]) < 1.5);
        assert_eq!(relative(&c, &totals), None);
        let naive = BreakerConfig {
            evidence_z: 0.0,
            absolute_enabled: false,
            ..c.clone()
        };
        assert!(matches!(trip(&naive, &totals), Some(Trip::Errors { .. })));
        let tripped = trip(&c, &totals).unwrap();
        assert_eq!(
            tripped,
            Trip::AbsoluteErrors {
                cohort: 0.02,
                requests: 950
            }
        );
        assert_eq!(tripped.rule(), Rule::Absolute);
        assert!(tripped
            .to_string()
            .starts_with("absolute: cohort 5xx 2.00% of 950"));
        // Switched off, it stays closed.
        let off = BreakerConfig {
            absolute_enabled: false,
            ..c
        };
        assert_eq!(trip(&off, &totals), None);
    }

    #[test]
    fn with_enough_hold_out_the_relative_rule_sees_a_two_percent_fault_first() {
        // Only Cohort's requests fail (2%), and the hold-out has 500 clean outcomes: the
        // difference is evident (z 3.2), and the relative rule is judged first.
        let c = BreakerConfig::default();
        let mut w = outcomes(1_000, Group::Cohort, 9_500, 190, 10.0);
        w.merge(&outcomes(1_000, Group::Holdout, 500, 0, 10.0));
        let tripped = trip(&c, &w.totals(1_000, 10)).unwrap();
        assert_eq!(tripped.rule(), Rule::Relative);
        assert!(tripped
            .to_string()
            .starts_with("relative: cohort 5xx 2.00%"));
    }

    #[test]
    fn the_absolute_rule_needs_no_hold_out_and_ignores_a_healthy_fleet_s_odd_5xx() {
        let c = BreakerConfig::default();
        let cohort = |n: u64, errors: u64| {
            let w = outcomes(1_000, Group::Cohort, n, errors, 10.0);
            trip(&c, &w.totals(1_000, 10))
        };
        // 2% of 300: z 3.7.
        assert!(matches!(cohort(300, 6), Some(Trip::AbsoluteErrors { .. })));
        // 2% of 100: below absolute_min_requests.
        assert_eq!(cohort(100, 2), None);
        // 0.1%, and 0.6% (above the bound by chance only: z 0.45).
        assert_eq!(cohort(1_000, 1), None);
        assert_eq!(cohort(1_000, 6), None);
        // Every request failing.
        assert!(matches!(
            cohort(200, 200),
            Some(Trip::AbsoluteErrors { .. })
        ));
        // Without the evidence bound, the rate alone.
        let rates = BreakerConfig {
            evidence_z: 0.0,
            ..c.clone()
        };
        let w = outcomes(1_000, Group::Cohort, 1_000, 6, 10.0);
        assert!(matches!(
            trip(&rates, &w.totals(1_000, 10)),
            Some(Trip::AbsoluteErrors { .. })
        ));
    }

    #[test]
    fn latency_trips_at_three_times_the_hold_outs_p99() {
        let c = config();
        let both = |cohort_ms: f64, holdout: u64| {
            let mut w = outcomes(1_000, Group::Cohort, 100, 0, cohort_ms);
            w.merge(&outcomes(1_000, Group::Holdout, holdout, 0, 20.0));
            trip(&c, &w.totals(1_000, 5))
        };
        assert_eq!(both(30.0, 100), None);
        assert!(matches!(both(100.0, 100), Some(Trip::Latency { .. })));
        // Four times as slow, but by a few ms only: not harm.
        let fast = |cohort_ms: f64| {
            let mut w = outcomes(1_000, Group::Cohort, 100, 0, cohort_ms);
            w.merge(&outcomes(1_000, Group::Holdout, 100, 0, 0.5));
            trip(&c, &w.totals(1_000, 5))
        };
        assert_eq!(fast(2.0), None);
        assert!(matches!(fast(80.0), Some(Trip::Latency { .. })));
        // Without enough hold-out outcomes there is nothing to compare with.
        assert_eq!(both(100.0, 5), None);
    }

    #[test]
    fn every_threshold_moves_the_verdict() {
        // 100 outcomes each; the cohort group has 2 5xx at 60 ms, the hold-out none at 20 ms.
        let mut w = outcomes(1_000, Group::Cohort, 100, 2, 60.0);
        w.merge(&outcomes(1_000, Group::Holdout, 100, 0, 20.0));
        let totals = w.totals(1_000, 5);
        let verdict = |c: BreakerConfig| trip(&c, &totals);
        // Rates alone (no evidence bound: two 5xx in 100 against none is z 1.4).
        let quiet = BreakerConfig {
            max_error_rate: 0.05,
            max_latency_increase: 10.0,
            evidence_z: 0.0,
            ..config()
        };
        assert_eq!(verdict(quiet.clone()), None);
        // A lower error threshold trips on the 2%.
        let errors = BreakerConfig {
            max_error_rate: 0.01,
            ..quiet.clone()
        };
        assert!(matches!(verdict(errors.clone()), Some(Trip::Errors { .. })));
        // …unless the difference must be evident.
        let evident = BreakerConfig {
            evidence_z: 3.0,
            ..errors
        };
        assert_eq!(verdict(evident), None);
        // A lower latency increase trips on 3× (and 40 ms above, over the 20 ms floor)…
        let slower = BreakerConfig {
            max_latency_increase: 1.0,
            min_latency_delta_ms: 20.0,
            ..quiet.clone()
        };
        assert!(matches!(
            verdict(slower.clone()),
            Some(Trip::Latency { .. })
        ));
        // …but not when the absolute floor is above the gap.
        let floor = BreakerConfig {
            min_latency_delta_ms: 100.0,
            ..slower
        };
        assert_eq!(verdict(floor), None);
        // More outcomes required than there are: no verdict at all.
        let few = BreakerConfig {
            min_requests: 101,
            max_error_rate: 0.01,
            ..quiet
        };
        assert_eq!(verdict(few), None);
    }

    #[test]
    fn it_opens_cools_down_probes_and_closes() {
        let c = config();
        let mut b = Breaker::default();
        let mut healthy = outcomes(1_000, Group::Cohort, 50, 0, 10.0);
        healthy.merge(&outcomes(1_000, Group::Holdout, 50, 0, 10.0));
        assert_eq!(b.update(&c, &healthy, 1_000), None);
        let failing = outcomes(2_000, Group::Cohort, 50, 25, 10.0);
        let t = b.update(&c, &failing, 2_000).unwrap();
        assert_eq!((t.from, t.to), (State::Closed, State::Open));
        assert!(matches!(t.trip, Some(Trip::Errors { .. })));
        assert!(b.window.is_empty());
        // Open for the cool-down, whatever comes in.
        assert_eq!(b.update(&c, &Window::default(), 4_000), None);
        let t = b.update(&c, &Window::default(), 5_000).unwrap();
        assert_eq!(t.to, State::HalfOpen);
        // Healthy probes, but not yet for probe_s.
        let mut probes = outcomes(6_000, Group::Cohort, 30, 0, 10.0);
        probes.merge(&outcomes(6_000, Group::Holdout, 30, 0, 10.0));
        assert_eq!(b.update(&c, &probes, 6_000), None);
        let t = b.update(&c, &Window::default(), 7_000).unwrap();
        assert_eq!((t.from, t.to), (State::HalfOpen, State::Closed));
    }

    #[test]
    fn failing_probes_open_it_again_and_too_few_keep_it_half_open() {
        let c = config();
        let mut b = Breaker {
            state: State::HalfOpen,
            since_ms: 0,
            window: Window::default(),
        };
        assert_eq!(
            b.update(&c, &outcomes(3_000, Group::Cohort, 5, 0, 10.0), 3_000),
            None
        );
        assert_eq!(b.state, State::HalfOpen, "5 probes are too few to close");
        let mut failing = outcomes(3_500, Group::Cohort, 20, 10, 10.0);
        failing.merge(&outcomes(3_500, Group::Holdout, 20, 0, 10.0));
        let t = b.update(&c, &failing, 3_500).unwrap();
        assert_eq!((t.from, t.to), (State::HalfOpen, State::Open));
        assert_eq!(b.since_ms, 3_500);
    }

    #[test]
    fn the_shared_state_round_trips_through_json() {
        let mut b = Breaker::default();
        b.update(
            &config(),
            &outcomes(1_000, Group::Holdout, 3, 1, 7.0),
            1_000,
        );
        let bytes = serde_json::to_vec(&b).unwrap();
        assert_eq!(serde_json::from_slice::<Breaker>(&bytes).unwrap(), b);
    }
}
