//! One replica's event stream, end to end: sequence numbers, decoding, residency and
//! health, behind four calls a subscriber makes ([`ReplicaEvents::on_live`],
//! [`ReplicaEvents::on_replay`], [`ReplicaEvents::replay_unavailable`],
//! [`ReplicaEvents::tick`]).
//!
//! Each call returns an [`Outcome`]: whether to ask the replay socket for batches, the
//! residency resets it caused, and the change of health, if any, so the caller counts and
//! logs each once. Counters of everything skipped or lost accumulate in [`Counters`].
//!
//! A payload that does not decode drops the residency, like a lost gap: its removals are
//! unknown, and a residency that missed removals would claim blocks the engine no longer
//! holds. Stores of the wrong block size, of another tier, of sliding-window groups and of
//! unknown parents are skipped ([`crate::residency`]); only the wrong block size degrades
//! the stream, since the residency then misses every block of that engine.

use crate::decode::decode;
use crate::health::{Change, Health, HealthConfig, State};
use crate::residency::{ApplyReport, Residency};
use crate::stream::{ResetReason, SequenceConfig, Sequencer, Step};
use std::time::Instant;

/// One replica's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaConfig {
    /// The engine's block size in tokens (vLLM's `--block-size`).
    pub block_size: u32,
    /// The tier that counts (`"GPU"`: vLLM's own cache on any device).
    pub main_medium: String,
    pub sequence: SequenceConfig,
    pub health: HealthConfig,
}

impl ReplicaConfig {
    /// Defaults for an engine with blocks of `block_size` tokens.
    pub fn new(block_size: u32) -> Self {
        ReplicaConfig {
            block_size,
            main_medium: "GPU".to_owned(),
            sequence: SequenceConfig::default(),
            health: HealthConfig::default(),
        }
    }
}

/// Everything counted on one stream since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Payloads applied.
    pub applied: u64,
    /// Payloads skipped as already applied.
    pub duplicates: u64,
    /// Replays asked for.
    pub replays: u64,
    /// Restarts of the stream.
    pub restarts: u64,
    /// Gaps that could not be replayed.
    pub gaps_lost: u64,
    /// Payloads that did not decode.
    pub malformed: u64,
    /// Events of unknown types.
    pub unknown_events: u64,
    /// Unknown fields of known events and batches.
    pub unknown_fields: u64,
    /// What applying the events did, block by block.
    pub blocks: ApplyReport,
}

/// What one call asks of the caller.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Ask the replay socket for every batch from this number on.
    pub replay_from: Option<u64>,
    /// The residency was dropped, for these reasons, in order.
    pub resets: Vec<ResetReason>,
    /// The stream's health changed.
    pub health: Option<Change>,
}

/// One replica's stream and residency.
#[derive(Debug)]
pub struct ReplicaEvents {
    sequencer: Sequencer<Vec<u8>>,
    residency: Residency,
    health: Health,
    counters: Counters,
}

impl ReplicaEvents {
    /// A replica whose stream is followed from `now`.
    pub fn new(config: &ReplicaConfig, now: Instant) -> Self {
        ReplicaEvents {
            sequencer: Sequencer::new(config.sequence),
            residency: Residency::new(config.block_size, &config.main_medium),
            health: Health::new(config.health, now),
            counters: Counters::default(),
        }
    }

    /// The residency index.
    pub fn residency(&self) -> &Residency {
        &self.residency
    }

    /// The stream's health: degraded means "use the modelled residency".
    pub fn health(&self) -> State {
        self.health.state()
    }

    /// Whether the residency covers the stream since the engine's start or its last clear
    /// (`false` after a lost gap: it may miss blocks, never claims extra ones).
    pub fn complete(&self) -> bool {
        self.sequencer.complete()
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Whether a replay is in flight.
    pub fn replaying(&self) -> bool {
        self.sequencer.replaying()
    }

    /// A live payload `[topic, seq, payload]` arrived.
    pub fn on_live(&mut self, seq: u64, payload: Vec<u8>, now: Instant) -> Outcome {
        let from = self.health.state();
        self.health.on_payload(now);
        let steps = self.sequencer.on_live(seq, payload, now);
        self.run(steps, from)
    }

    /// A replay reply arrived (`seq` [`crate::stream::END_OF_REPLAY`] ends the replay).
    pub fn on_replay(&mut self, seq: u64, payload: Vec<u8>, now: Instant) -> Outcome {
        let from = self.health.state();
        if seq != crate::stream::END_OF_REPLAY {
            self.health.on_payload(now);
        }
        let steps = self.sequencer.on_replay(seq, payload);
        self.run(steps, from)
    }

    /// The replay socket could not be asked.
    pub fn replay_unavailable(&mut self) -> Outcome {
        let from = self.health.state();
        let steps = self.sequencer.replay_unavailable();
        self.run(steps, from)
    }

    /// The passage of time: replay timeouts and silence.
    pub fn tick(&mut self, now: Instant) -> Outcome {
        let from = self.health.state();
        self.health.tick(now);
        let steps = self.sequencer.tick(now);
        self.run(steps, from)
    }

    fn run(&mut self, steps: Vec<Step<Vec<u8>>>, from: State) -> Outcome {
        let mut outcome = Outcome::default();
        for step in steps {
            match step {
                Step::Apply { payload, .. } => self.apply(&payload, &mut outcome),
                Step::Duplicate { .. } => self.counters.duplicates += 1,
                Step::Replay { from } => {
                    self.counters.replays += 1;
                    outcome.replay_from = Some(from);
                }
                Step::Reset(why) => {
                    match why {
                        ResetReason::Restart => self.counters.restarts += 1,
                        ResetReason::GapLost { .. } => self.counters.gaps_lost += 1,
                    }
                    self.residency.clear();
                    outcome.resets.push(why);
                }
            }
        }
        let to = self.health.state();
        outcome.health = (from != to).then_some(Change { from, to });
        outcome
    }

    fn apply(&mut self, payload: &[u8], outcome: &mut Outcome) {
        let batch = match decode(payload) {
            Ok(batch) => batch,
            Err(_) => {
                self.counters.malformed += 1;
                self.health.on_malformed();
                let why = ResetReason::GapLost {
                    from: self.sequencer.next().unwrap_or(1).saturating_sub(1),
                    to: self.sequencer.next(),
                };
                self.counters.gaps_lost += 1;
                self.residency.clear();
                self.sequencer.mark_incomplete();
                outcome.resets.push(why);
                return;
            }
        };
        self.counters.applied += 1;
        self.counters.unknown_events += u64::from(batch.skipped.unknown_events);
        self.counters.unknown_fields += u64::from(batch.skipped.unknown_fields);
        let mut report = ApplyReport::default();
        for event in &batch.events {
            self.residency.apply(event, &mut report);
        }
        if report.cleared > 0 {
            self.sequencer.mark_complete();
        }
        add(&mut self.counters.blocks, &report);
        let bad_stores = report.wrong_block_size;
        self.health.on_decoded(report.stores_ok, bad_stores);
    }
}

fn add(total: &mut ApplyReport, more: &ApplyReport) {
    total.stored += more.stored;
    total.removed += more.removed;
    total.cleared += more.cleared;
    total.stores_ok += more.stores_ok;
    total.wrong_block_size += more.wrong_block_size;
    total.wrong_token_count += more.wrong_token_count;
    total.orphans += more.orphans;
    total.other_medium += more.other_medium;
    total.sliding_group += more.sliding_group;
}
