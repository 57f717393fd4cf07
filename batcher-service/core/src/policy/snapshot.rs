//! The policy as metrics and the inspector see it: per replica, load, cache state,
//! assignments, in-flight work and availability; decision counts by reason.

use super::health::ReplicaHealth;
use super::{ChoiceReason, Policy};

/// One replica in a [`PolicySnapshot`].
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaSnapshot {
    /// Effective load (decayed assigned work, raised by a fresh engine report).
    pub load: f64,
    /// Blocks in its approximate prefix state.
    pub blocks_held: usize,
    /// Blocks evicted from that state so far.
    pub evictions: u64,
    /// Requests assigned so far.
    pub assigned: u64,
    /// Assigned requests not ended (from progress reports).
    pub in_flight: u32,
    /// Prefill work of assigned requests with no first byte yet.
    pub pending_work: f64,
    /// Whether decisions may choose it (health: probe up, no recent 5xx).
    pub available: bool,
    /// Why it is or is not available.
    pub health: ReplicaHealth,
    /// Whether the slot holds a replica of the current set (engine discovery).
    pub present: bool,
}

/// Metrics view of a [`Policy`].
#[derive(Debug, Clone, PartialEq)]
pub struct PolicySnapshot {
    /// Per replica.
    pub replicas: Vec<ReplicaSnapshot>,
    /// Decisions so far by reason, in the order of [`ChoiceReason::ALL`].
    pub reasons: [u64; ChoiceReason::ALL.len()],
    /// Cohorts with a remembered owner.
    pub cohorts: usize,
    /// Whether decisions use the live load (progress reports are arriving).
    pub live: bool,
    /// Tickets closed because their reports never came.
    pub tickets_expired: u64,
}

impl Policy {
    /// Per-replica load, prefix-state size and evictions, and decision counts, at `now_ms`.
    pub fn snapshot(&self, now_ms: u64) -> PolicySnapshot {
        let in_flight = self.live.in_flight();
        PolicySnapshot {
            replicas: (0..self.states.len())
                .map(|r| ReplicaSnapshot {
                    load: self.estimated.load(r, now_ms),
                    blocks_held: self.states[r].len(),
                    evictions: self.states[r].evictions(),
                    assigned: self.assigned[r],
                    in_flight: in_flight.replica(r).in_flight,
                    pending_work: in_flight.replica(r).pending_work,
                    available: self.health.available(r, now_ms),
                    health: self.health.state(r, now_ms),
                    present: self.health.present(r),
                })
                .collect(),
            reasons: self.reasons,
            cohorts: self.owners.len(),
            live: self.live.is_live(now_ms),
            tickets_expired: in_flight.expired(),
        }
    }
}
