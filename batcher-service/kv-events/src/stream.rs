//! One event stream's sequence numbers: which payloads to apply, in which order, and when
//! the residency built so far must be dropped.
//!
//! vLLM numbers its batches from 0 per publisher (per data-parallel rank), sends them on a
//! ZeroMQ PUB socket with no heartbeat and no retransmission, and keeps the last batches
//! (10,000 by default) for a replay socket. A subscriber therefore sees three things go
//! wrong, and this state machine answers each with [`Step`]s for the caller to carry out:
//!
//! - **a gap** (a number skipped: the subscriber was slow, reconnected, or joined late):
//!   ask the replay socket for everything from the first missing number
//!   ([`Step::Replay`]), hold the live payloads that keep arriving, apply the replayed
//!   ones in order, then the held ones, skipping what was already applied
//!   ([`Step::Duplicate`]);
//! - **a restart** (the number goes back to 0, or falls more than `duplicate_window`
//!   below the next expected one): the engine's cache is new, so the residency is dropped
//!   ([`Step::Reset`]) and the new stream followed from its start;
//! - **a lost gap** (the replay's first number is later than the one asked for, the replay
//!   does not answer in time, there is no replay socket, or too many live payloads pile up
//!   meanwhile): the missed batches may have removed blocks, so the residency is dropped
//!   and rebuilt from the next payload on. It is then a subset of the engine's cache: it
//!   misses blocks stored before the gap that are still held, and never claims a block
//!   the engine dropped. [`Sequencer::complete`] says which.
//!
//! The machine is pure and generic over the payload, so tests drive it with numbers; time
//! is passed in. It never logs: every step is returned once.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The sequence number that ends a replay.
pub const END_OF_REPLAY: u64 = u64::MAX;

/// Limits of one stream's sequencing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SequenceConfig {
    /// A live number at most this far below the next expected one is a repeat and is
    /// skipped; further below, it is a restart.
    pub duplicate_window: u64,
    /// How long a replay may take before its gap counts as lost.
    pub replay_timeout: Duration,
    /// How many live payloads are held during a replay before its gap counts as lost.
    pub max_held: usize,
}

impl Default for SequenceConfig {
    fn default() -> Self {
        SequenceConfig {
            duplicate_window: 16,
            replay_timeout: Duration::from_secs(2),
            max_held: 10_000,
        }
    }
}

/// Why the residency was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetReason {
    /// The stream started again from 0 (or far below): the engine restarted.
    Restart,
    /// Batches `from..to` are gone for good (`to` is the first number seen after them;
    /// `None` when nothing followed before the replay gave up).
    GapLost { from: u64, to: Option<u64> },
}

/// What the caller does next, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step<P> {
    /// Apply this payload to the residency.
    Apply { seq: u64, payload: P },
    /// This number was already applied; its payload is dropped.
    Duplicate { seq: u64 },
    /// Ask the replay socket for every batch from `from` on.
    Replay { from: u64 },
    /// Drop the replica's residency.
    Reset(ResetReason),
}

/// A replay in flight.
#[derive(Debug)]
struct Replay<P> {
    since: Instant,
    /// Live payloads that arrived meanwhile, in arrival order.
    held: VecDeque<(u64, P)>,
}

/// One stream's sequencing state.
#[derive(Debug)]
pub struct Sequencer<P> {
    config: SequenceConfig,
    /// The next number to apply; `None` before the first payload.
    next: Option<u64>,
    replay: Option<Replay<P>>,
    complete: bool,
}

impl<P> Sequencer<P> {
    pub fn new(config: SequenceConfig) -> Self {
        Sequencer {
            config,
            next: None,
            replay: None,
            complete: true,
        }
    }

    /// The next number the stream should deliver.
    pub fn next(&self) -> Option<u64> {
        self.next
    }

    /// Whether a replay is in flight.
    pub fn replaying(&self) -> bool {
        self.replay.is_some()
    }

    /// Whether everything applied since the last reset covers the stream from its start
    /// (number 0 or an `AllBlocksCleared`, which the caller reports with
    /// [`Sequencer::mark_complete`]); `false` after a lost gap or a late join.
    pub fn complete(&self) -> bool {
        self.complete
    }

    /// The residency was just cleared by the engine itself: from here it is complete.
    pub fn mark_complete(&mut self) {
        self.complete = true;
    }

    /// The residency was dropped for a reason of the caller's (a payload that did not
    /// decode): it is no longer complete.
    pub fn mark_incomplete(&mut self) {
        self.complete = false;
    }

    /// A payload from the live (PUB) stream.
    pub fn on_live(&mut self, seq: u64, payload: P, now: Instant) -> Vec<Step<P>> {
        let mut steps = Vec::new();
        if self.replay.is_some() {
            if seq == 0 {
                // The engine restarted while the replay was in flight: what it would
                // replay is the old stream's.
                self.replay = None;
                self.restart(seq, payload, now, &mut steps);
                return steps;
            }
            let full = {
                let replay = self.replay.as_mut().expect("checked above");
                replay.held.push_back((seq, payload));
                replay.held.len() > self.config.max_held
            };
            if full {
                self.give_up(&mut steps);
            }
            return steps;
        }
        self.live(seq, payload, now, &mut steps);
        steps
    }

    /// A reply from the replay socket (`END_OF_REPLAY` ends it). Replies while no replay
    /// is in flight (a late answer to one that timed out) are duplicates.
    pub fn on_replay(&mut self, seq: u64, payload: P) -> Vec<Step<P>> {
        let mut steps = Vec::new();
        if self.replay.is_none() {
            if seq != END_OF_REPLAY {
                steps.push(Step::Duplicate { seq });
            }
            return steps;
        }
        if seq == END_OF_REPLAY {
            self.finish(&mut steps);
            return steps;
        }
        let next = self.next.unwrap_or(0);
        if seq < next {
            steps.push(Step::Duplicate { seq });
        } else {
            if seq > next {
                self.lose(next, Some(seq), &mut steps);
            }
            steps.push(Step::Apply { seq, payload });
            self.next = Some(seq + 1);
        }
        steps
    }

    /// The replay could not be asked (no replay endpoint, or the request failed): the gap
    /// is lost.
    pub fn replay_unavailable(&mut self) -> Vec<Step<P>> {
        let mut steps = Vec::new();
        if self.replay.is_some() {
            self.give_up(&mut steps);
        }
        steps
    }

    /// The passage of time: a replay older than the timeout gives up.
    pub fn tick(&mut self, now: Instant) -> Vec<Step<P>> {
        let mut steps = Vec::new();
        let late = self
            .replay
            .as_ref()
            .is_some_and(|r| now.saturating_duration_since(r.since) > self.config.replay_timeout);
        if late {
            self.give_up(&mut steps);
        }
        steps
    }

    fn live(&mut self, seq: u64, payload: P, now: Instant, steps: &mut Vec<Step<P>>) {
        match self.next {
            None if seq == 0 => self.apply(seq, payload, steps),
            // Joined mid-stream: the batches before may still be in the replay buffer.
            None => {
                self.next = Some(0);
                self.start_replay(seq, payload, now, steps);
            }
            Some(next) if seq == next => self.apply(seq, payload, steps),
            Some(_) if seq == 0 => self.restart(seq, payload, now, steps),
            Some(next) if seq > next => self.start_replay(seq, payload, now, steps),
            Some(next) if next - seq <= self.config.duplicate_window => {
                steps.push(Step::Duplicate { seq });
            }
            Some(_) => self.restart(seq, payload, now, steps),
        }
    }

    fn apply(&mut self, seq: u64, payload: P, steps: &mut Vec<Step<P>>) {
        steps.push(Step::Apply { seq, payload });
        self.next = Some(seq + 1);
    }

    fn restart(&mut self, seq: u64, payload: P, now: Instant, steps: &mut Vec<Step<P>>) {
        steps.push(Step::Reset(ResetReason::Restart));
        self.complete = true;
        self.next = Some(0);
        if seq == 0 {
            self.apply(seq, payload, steps);
        } else {
            self.start_replay(seq, payload, now, steps);
        }
    }

    fn start_replay(&mut self, seq: u64, payload: P, now: Instant, steps: &mut Vec<Step<P>>) {
        let from = self.next.unwrap_or(0);
        steps.push(Step::Replay { from });
        self.replay = Some(Replay {
            since: now,
            held: VecDeque::from([(seq, payload)]),
        });
    }

    /// Batches from `from` on are gone; `to` is the first number known after them.
    fn lose(&mut self, from: u64, to: Option<u64>, steps: &mut Vec<Step<P>>) {
        steps.push(Step::Reset(ResetReason::GapLost { from, to }));
        self.complete = false;
    }

    /// The replay ended: apply the held live payloads after what it delivered.
    fn finish(&mut self, steps: &mut Vec<Step<P>>) {
        let Some(replay) = self.replay.take() else {
            return;
        };
        for (seq, payload) in replay.held {
            let next = self.next.unwrap_or(0);
            if seq < next {
                steps.push(Step::Duplicate { seq });
                continue;
            }
            if seq > next {
                self.lose(next, Some(seq), steps);
            }
            self.apply(seq, payload, steps);
        }
    }

    /// The replay will not come: the gap is lost, resume from the held payloads.
    fn give_up(&mut self, steps: &mut Vec<Step<P>>) {
        let Some(replay) = self.replay.take() else {
            return;
        };
        let from = self.next.unwrap_or(0);
        let first = replay.held.front().map(|(seq, _)| *seq);
        self.lose(from, first, steps);
        if let Some(first) = first {
            self.next = Some(first);
        }
        self.replay = Some(replay);
        self.finish(steps);
    }
}
