//! Burst order: among decisions that arrive together, those with a home go first.
//!
//! Envoy's worker sends a burst's Assigns together, after it has fingerprinted all of
//! them. Decided in arrival order, a cold prompt (tied on every replica) may take the
//! replica holding a conversation whose next turn is a few Assigns behind it in the same
//! burst, and that turn then waits behind the cold prompt's long prefill or leaves its
//! history. So a request's [`Precedence`] is:
//!
//! - [`Precedence::Home`]: some replica holds more of its leading blocks than another;
//!   where it goes matters, decide it now;
//! - [`Precedence::Anywhere`]: every replica holds its prefix alike (a cold prompt, or
//!   one whose only shared part is a trunk every replica holds). Any replica serves it as
//!   well as another, so its decision defers to the others of its burst and is made
//!   knowing where they went.
//!
//! The serving layer defers an `Anywhere` decision by letting the decisions already
//! received run first ([`DEFERRALS`] times), then decides it. With one replica, or with
//! `[policy] burst_order = false`, nothing defers. The measurements: docs/DECISIONS.md,
//! "Burst order".

use super::Policy;

/// How many times an [`Precedence::Anywhere`] decision steps behind those received with it.
pub const DEFERRALS: usize = 2;

/// Whether a decision should be made before the others of its burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precedence {
    /// Some replica holds more of the request's prefix than another.
    Home,
    /// Every replica holds the request's prefix alike.
    Anywhere,
}

impl Policy {
    /// The precedence of a request of `blocks` at `now_ms` (see the module doc). Stops at
    /// the first replica that differs from the first one, so a cold prompt costs one
    /// look-up per replica. With one replica there is nothing to order: `Home`.
    pub fn precedence(&self, blocks: &[u64], now_ms: u64) -> Precedence {
        if self.replicas() < 2 || self.prefix_prefers_a_replica(blocks, now_ms) {
            Precedence::Home
        } else {
            Precedence::Anywhere
        }
    }

    /// Whether the replicas differ on `blocks` at `now_ms`: some holds more of its
    /// leading blocks than another (slots no replica holds do not count).
    pub fn prefix_prefers_a_replica(&self, blocks: &[u64], now_ms: u64) -> bool {
        let mut matched = (0..self.states.len())
            .filter(|&r| self.health.present(r))
            .map(|r| self.states[r].matched(blocks, now_ms));
        let first = matched.next().unwrap_or(0);
        matched.any(|m| m != first)
    }
}
