//! Whether a replica's event stream can be trusted for routing, and why not.
//!
//! A replica whose stream is degraded falls back to Cohort's modelled residency until the
//! stream is healthy again. Three problems degrade it, each with its own way back:
//!
//! | problem | set by | cleared by |
//! |---|---|---|
//! | [`Problem::Malformed`] | a payload that does not decode | `recover_after` well-formed payloads in a row |
//! | [`Problem::BlockSize`] | a stored block of another size than configured | `recover_after` stores of the configured size in a row |
//! | [`Problem::Silent`] | no payload for longer than `silence` | any payload |
//!
//! vLLM publishes only on scheduler steps that have events, so an idle engine is silent
//! too: `silence` is meant to be longer than the idle gaps of a replica that receives
//! traffic. Every change of state is returned once ([`Change`]), for the caller to count
//! and log; nothing here logs.

use std::fmt;
use std::time::{Duration, Instant};

/// The limits of health.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthConfig {
    /// A stream with no payload for longer than this is silent.
    pub silence: Duration,
    /// Good payloads (or stores) in a row that clear a problem.
    pub recover_after: u32,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            silence: Duration::from_secs(60),
            recover_after: 8,
        }
    }
}

/// One reason a stream is degraded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Problem {
    /// Payloads that do not decode.
    Malformed,
    /// Stored blocks of another size than configured.
    BlockSize,
    /// No payload for longer than the silence limit.
    Silent,
}

impl Problem {
    const ALL: [Problem; 3] = [Problem::Malformed, Problem::BlockSize, Problem::Silent];

    fn bit(self) -> u8 {
        match self {
            Problem::Malformed => 1,
            Problem::BlockSize => 2,
            Problem::Silent => 4,
        }
    }

    /// The problem's name in metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            Problem::Malformed => "malformed",
            Problem::BlockSize => "block_size",
            Problem::Silent => "silent",
        }
    }
}

/// A stream's state: healthy, or degraded by a set of problems.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State(u8);

impl State {
    /// No problem.
    pub const HEALTHY: State = State(0);

    pub fn is_healthy(self) -> bool {
        self.0 == 0
    }

    pub fn has(self, problem: Problem) -> bool {
        self.0 & problem.bit() != 0
    }

    /// The problems, in a fixed order.
    pub fn problems(self) -> impl Iterator<Item = Problem> {
        Problem::ALL.into_iter().filter(move |p| self.has(*p))
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_healthy() {
            return f.write_str("healthy");
        }
        f.write_str("degraded (")?;
        for (i, p) in self.problems().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(p.name())?;
        }
        f.write_str(")")
    }
}

/// A change of state, reported once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    pub from: State,
    pub to: State,
}

/// One stream's health.
#[derive(Clone, Debug)]
pub struct Health {
    config: HealthConfig,
    state: State,
    last_payload: Instant,
    good_payloads: u32,
    good_stores: u32,
}

impl Health {
    /// A healthy stream, whose silence is counted from `now`.
    pub fn new(config: HealthConfig, now: Instant) -> Self {
        Health {
            config,
            state: State::HEALTHY,
            last_payload: now,
            good_payloads: 0,
            good_stores: 0,
        }
    }

    pub fn state(&self) -> State {
        self.state
    }

    /// A payload arrived (live or replayed), whether it decoded or not.
    pub fn on_payload(&mut self, now: Instant) -> Option<Change> {
        self.last_payload = self.last_payload.max(now);
        self.set(Problem::Silent, false)
    }

    /// A payload did not decode.
    pub fn on_malformed(&mut self) -> Option<Change> {
        self.good_payloads = 0;
        self.set(Problem::Malformed, true)
    }

    /// A payload decoded, with `good_stores` stores of the configured block size and
    /// `bad_stores` of another.
    pub fn on_decoded(&mut self, good_stores: u64, bad_stores: u64) -> Option<Change> {
        let from = self.state;
        self.good_payloads = self.good_payloads.saturating_add(1);
        if self.good_payloads >= self.config.recover_after {
            self.set(Problem::Malformed, false);
        }
        if bad_stores > 0 {
            self.good_stores = 0;
            self.set(Problem::BlockSize, true);
        } else {
            let good = u32::try_from(good_stores).unwrap_or(u32::MAX);
            self.good_stores = self.good_stores.saturating_add(good);
            if self.good_stores >= self.config.recover_after {
                self.set(Problem::BlockSize, false);
            }
        }
        self.changed_since(from)
    }

    /// The passage of time: a stream silent for longer than the limit is degraded.
    pub fn tick(&mut self, now: Instant) -> Option<Change> {
        let silent = now.saturating_duration_since(self.last_payload) > self.config.silence;
        if silent {
            self.set(Problem::Silent, true)
        } else {
            None
        }
    }

    fn set(&mut self, problem: Problem, on: bool) -> Option<Change> {
        let from = self.state;
        self.state = if on {
            State(from.0 | problem.bit())
        } else {
            State(from.0 & !problem.bit())
        };
        self.changed_since(from)
    }

    fn changed_since(&self, from: State) -> Option<Change> {
        (from != self.state).then_some(Change {
            from,
            to: self.state,
        })
    }
}
