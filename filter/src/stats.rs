//! The filter's Envoy stats, defined once per VM by the root context.
//!
//! Envoy shows custom metrics as `wasmcustom.<name>` in `/stats` and as `<name>` in
//! `/stats/prometheus`. Every name starts with `cohort_`:
//!
//! | name | type | meaning |
//! |---|---|---|
//! | `cohort_requests_total` | counter | LLM API requests (POST to an API path) |
//! | `cohort_fingerprinted_total` | counter | requests routed on their fingerprint |
//! | `cohort_bypass_total` | counter | requests passed through untouched |
//! | `cohort_bypass_<reason>_total` | counter | per reason (see `decision::reason` and the core's) |
//! | `cohort_invalid_knob_total` | counter | knob headers malformed or out of range |
//! | `cohort_invalid_knob_<knob>_total` | counter | per knob |
//! | `cohort_spoofed_header_removed_total` | counter | client-set reserved headers removed |
//! | `cohort_fingerprint_us` | histogram | time to fingerprint a body, µs (sampled) |
//! | `cohort_sketch_us` | histogram | of which the intent sketch (normalise, mask, sketch the intent text), µs (sampled) |
//! | `cohort_body_bytes` | histogram | fingerprinted body size, bytes (sampled) |
//! | `cohort_learned_started_total` | counter | requests that started a learned cohort (`learned_cohorts` configured) |
//! | `cohort_learned_joined_total` | counter | requests that joined a learned cohort |
//! | `cohort_assign_ok_total` | counter | Assign calls answered: the request went where the batcher said |
//! | `cohort_assign_timeout_total` | counter | Assign calls past the deadline (routed by key instead) |
//! | `cohort_assign_error_total` | counter | Assign calls that failed otherwise, or an unusable reply (routed by key) |
//! | `cohort_assign_us` | histogram | Assign round trip, µs |
//! | `cohort_observe_sent_total` | counter | observations sent on an `Observe` stream |
//! | `cohort_progress_sent_total` | counter | progress reports of assigned requests (first byte, end) sent on it |
//! | `cohort_observe_dropped_total` | counter | observations dropped (queue full while the batcher was away, or a failed send) |
//! | `cohort_breaker_state` | gauge | 0 closed, 1 open, 2 half-open |
//! | `cohort_breaker_trips_total` | counter | times the breaker opened |
//! | `cohort_breaker_trips_<rule>_total` | counter | of which by the `relative` rule (against the hold-out) or the `absolute` one |
//! | `cohort_responses_total` and the other `cohort_response_*` series | tagged | each counted request's response by group, route, unit and status class ([`crate::response_series`], `crate::response_stats`) |
//! | `cohort_knob_ignored_<knob>_<mode>_total` | counter | requests that set a knob header with no effect in the mode they were routed in, or that their batcher cannot act on (named in `x-cohort-ignored`; `crate::knob_effect`) |

use crate::breaker::Rule;
use crate::config::Mode;
use crate::knob_effect::{self, Knob};
use cohort_fingerprint::knobs::{InvalidKnob, KnobName};
use proxy_wasm::hostcalls::{define_metric, increment_metric, record_metric};
use proxy_wasm::types::{MetricType, Status};
use std::cell::Cell;
use std::collections::BTreeMap;

/// Picks one fingerprinted request in `every` for the sampled histograms: the first, then
/// every `every`-th, per VM (one per Envoy worker). A sample takes seven calls out of the VM
/// (four clock reads, three records), each a fraction of a µs (docs/FILTER.md prices them),
/// so the per-body histograms are sampled; counters are not.
#[derive(Debug)]
pub struct Sampler {
    every: u32,
    seen: Cell<u32>,
}

impl Sampler {
    pub fn new(every: u32) -> Sampler {
        Sampler {
            every: every.max(1),
            seen: Cell::new(0),
        }
    }

    /// Whether this request is one of the sampled ones.
    pub fn take(&self) -> bool {
        let seen = self.seen.get();
        self.seen
            .set(if seen + 1 >= self.every { 0 } else { seen + 1 });
        seen == 0
    }
}

/// Metric ids of one VM.
pub struct Stats {
    pub requests: u32,
    pub fingerprinted: u32,
    pub bypass: u32,
    bypass_by_reason: BTreeMap<&'static str, u32>,
    pub invalid_knob: u32,
    invalid_knob_by_name: BTreeMap<&'static str, u32>,
    pub spoofed_header_removed: u32,
    pub fingerprint_us: u32,
    pub sketch_us: u32,
    pub body_bytes: u32,
    pub learned_started: u32,
    pub learned_joined: u32,
    pub assign_ok: u32,
    pub assign_timeout: u32,
    pub assign_error: u32,
    pub assign_us: u32,
    pub observe_sent: u32,
    pub progress_sent: u32,
    pub observe_dropped: u32,
    pub breaker_state: u32,
    pub breaker_trips: u32,
    /// Indexed by [`Rule`] (its order in [`Rule::ALL`]).
    breaker_trips_by_rule: [u32; 2],
    knob_ignored: BTreeMap<(Knob, Mode), u32>,
}

const KNOBS: [KnobName; 4] = [
    KnobName::Prefetch,
    KnobName::BatchThreshold,
    KnobName::CacheTtl,
    KnobName::SemanticMode,
];

impl Stats {
    /// Defines every metric (Envoy returns the existing id for a name already defined).
    pub fn define() -> Result<Stats, Status> {
        let counter = |name: &str| define_metric(MetricType::Counter, name);
        let histogram = |name: &str| define_metric(MetricType::Histogram, name);
        let gauge = |name: &str| define_metric(MetricType::Gauge, name);
        let mut bypass_by_reason = BTreeMap::new();
        for reason in crate::decision::all_bypass_reasons() {
            bypass_by_reason.insert(reason, counter(&format!("cohort_bypass_{reason}_total"))?);
        }
        let mut invalid_knob_by_name = BTreeMap::new();
        for knob in KNOBS {
            let name = knob.as_str();
            invalid_knob_by_name
                .insert(name, counter(&format!("cohort_invalid_knob_{name}_total"))?);
        }
        let mut knob_ignored = BTreeMap::new();
        for (knob, mode) in knob_effect::ignorable() {
            let name = format!(
                "cohort_knob_ignored_{}_{}_total",
                knob.stat_name(),
                mode.as_str()
            );
            knob_ignored.insert((knob, mode), counter(&name)?);
        }
        let trips = |rule: Rule| counter(&format!("cohort_breaker_trips_{}_total", rule.as_str()));
        Ok(Stats {
            requests: counter("cohort_requests_total")?,
            fingerprinted: counter("cohort_fingerprinted_total")?,
            bypass: counter("cohort_bypass_total")?,
            bypass_by_reason,
            invalid_knob: counter("cohort_invalid_knob_total")?,
            invalid_knob_by_name,
            spoofed_header_removed: counter("cohort_spoofed_header_removed_total")?,
            fingerprint_us: histogram("cohort_fingerprint_us")?,
            sketch_us: histogram("cohort_sketch_us")?,
            body_bytes: histogram("cohort_body_bytes")?,
            learned_started: counter("cohort_learned_started_total")?,
            learned_joined: counter("cohort_learned_joined_total")?,
            assign_ok: counter("cohort_assign_ok_total")?,
            assign_timeout: counter("cohort_assign_timeout_total")?,
            assign_error: counter("cohort_assign_error_total")?,
            assign_us: histogram("cohort_assign_us")?,
            observe_sent: counter("cohort_observe_sent_total")?,
            progress_sent: counter("cohort_progress_sent_total")?,
            observe_dropped: counter("cohort_observe_dropped_total")?,
            breaker_state: gauge("cohort_breaker_state")?,
            breaker_trips: counter("cohort_breaker_trips_total")?,
            breaker_trips_by_rule: [trips(Rule::ALL[0])?, trips(Rule::ALL[1])?],
            knob_ignored,
        })
    }

    /// Adds one; a failing stats call never affects the request.
    pub fn inc(&self, id: u32) {
        self.add(id, 1);
    }

    pub fn add(&self, id: u32, n: u64) {
        if n > 0 {
            let _ = increment_metric(id, n as i64);
        }
    }

    /// Sets a gauge, or records a histogram sample.
    pub fn record(&self, id: u32, value: u64) {
        let _ = record_metric(id, value);
    }

    pub fn count_bypass(&self, reason: &str) {
        self.inc(self.bypass);
        if let Some(id) = self.bypass_by_reason.get(reason) {
            self.inc(*id);
        }
    }

    /// The counter of trips by `rule`.
    pub fn breaker_trips_by(&self, rule: Rule) -> u32 {
        self.breaker_trips_by_rule[Rule::ALL.iter().position(|r| *r == rule).unwrap_or(0)]
    }

    /// Counts each knob a request set to no effect in `mode`.
    pub fn count_ignored_knobs(&self, mode: Mode, knobs: &[Knob]) {
        for knob in knobs {
            if let Some(id) = self.knob_ignored.get(&(*knob, mode)) {
                self.inc(*id);
            }
        }
    }

    pub fn count_invalid_knobs(&self, invalid: &[InvalidKnob]) {
        for knob in invalid {
            self.inc(self.invalid_knob);
            if let Some(id) = self.invalid_knob_by_name.get(knob.knob.as_str()) {
                self.inc(*id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Sampler;

    #[test]
    fn the_sampler_takes_the_first_request_and_then_one_in_every() {
        for every in [1, 2, 8, 10_000] {
            let sampler = Sampler::new(every);
            let taken: Vec<u32> = (0..20_000).filter(|_| sampler.take()).collect();
            let expected: Vec<u32> = (0..20_000).filter(|i| i % every == 0).collect();
            assert_eq!(taken, expected, "every {every}");
        }
        let zero = Sampler::new(0);
        assert!((0..5).all(|_| zero.take()), "0 is read as 1");
    }
}
