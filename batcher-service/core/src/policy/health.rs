//! Which replicas a decision may choose: the replicas' health as the policy sees it.
//!
//! Two signals take a replica out of decisions:
//! - **its probe** failed (the batcher's engine probe; [`Health::probe`]), until a probe
//!   answers again;
//! - **a 5xx answer** to a request it was given (the filter's end report, through
//!   [`Health::ended`]), for [`ERROR_HOLD_MS`] after the last one. A success of a request
//!   decided after that 5xx clears the hold at once; a success of a request that was
//!   already in flight at the 5xx says nothing new and clears nothing.
//!
//! When no replica is available, decisions use all of them: a request routed somewhere
//! beats one refused (see [`super::Policy::choose`]).
//!
//! The replica set can change at runtime (engine discovery): a slot is *present* while
//! its replica is in the set. A replica that joins is held out until its first probe
//! answers (it is not *proven* yet, and even the all-down fallback skips it); a slot whose
//! replica left is never chosen.

/// How long a replica that answered 5xx is left out of decisions, ms.
pub const ERROR_HOLD_MS: u64 = 5_000;

/// Why a replica is or is not chosen, as the inspector shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaHealth {
    /// Decisions may choose it.
    Up,
    /// Its last probe failed.
    ProbeDown,
    /// It joined and no probe has answered yet.
    AwaitingProbe,
    /// It answered a request with a 5xx: held out until `until_ms`.
    ServerErrors { until_ms: u64 },
    /// No replica of the current set holds the slot.
    Absent,
}

impl ReplicaHealth {
    /// A short name (the inspector's health column).
    pub fn as_str(self) -> &'static str {
        match self {
            ReplicaHealth::Up => "up",
            ReplicaHealth::ProbeDown => "probe failing",
            ReplicaHealth::AwaitingProbe => "awaiting first probe",
            ReplicaHealth::ServerErrors { .. } => "held out after 5xx",
            ReplicaHealth::Absent => "absent",
        }
    }
}

/// Per replica: what says it should not be chosen.
#[derive(Debug, Clone, Default)]
pub struct Health {
    present: Vec<bool>,
    proven: Vec<bool>,
    probe_down: Vec<bool>,
    error_until_ms: Vec<u64>,
    error_at_ms: Vec<u64>,
}

impl Health {
    pub fn new(replicas: usize) -> Health {
        Health {
            present: vec![true; replicas],
            proven: vec![true; replicas],
            probe_down: vec![false; replicas],
            error_until_ms: vec![0; replicas],
            error_at_ms: vec![0; replicas],
        }
    }

    /// A replica joins at `slot` (growing the slots when it is new): present, held out
    /// until its first probe answers, no error history.
    pub fn join(&mut self, slot: usize) {
        if slot >= self.present.len() {
            let n = slot + 1;
            self.present.resize(n, false);
            self.proven.resize(n, false);
            self.probe_down.resize(n, true);
            self.error_until_ms.resize(n, 0);
            self.error_at_ms.resize(n, 0);
        }
        self.present[slot] = true;
        self.proven[slot] = false;
        self.probe_down[slot] = true;
        self.error_until_ms[slot] = 0;
        self.error_at_ms[slot] = 0;
    }

    /// The replica at `slot` left the set: never chosen again until a replica joins there.
    pub fn leave(&mut self, slot: usize) {
        if let Some(present) = self.present.get_mut(slot) {
            *present = false;
            self.proven[slot] = false;
            self.probe_down[slot] = true;
        }
    }

    /// Whether `slot` holds a replica of the current set.
    pub fn present(&self, slot: usize) -> bool {
        self.present.get(slot).copied().unwrap_or(false)
    }

    /// Whether a decision at `now_ms` may use `replica`, given whether any replica is
    /// available: an available one, or, when none is, any present replica whose probe
    /// has answered once.
    pub fn usable(&self, replica: usize, now_ms: u64, any_available: bool) -> bool {
        self.available(replica, now_ms)
            || (!any_available && self.present(replica) && self.proven[replica])
    }

    /// Whether any replica is usable at `now_ms`.
    pub fn any_usable(&self, now_ms: u64) -> bool {
        let any = self.any_available(now_ms);
        (0..self.present.len()).any(|r| self.usable(r, now_ms, any))
    }

    /// Whether decisions at `now_ms` may choose `replica` (false for an unknown one).
    pub fn available(&self, replica: usize, now_ms: u64) -> bool {
        replica < self.probe_down.len()
            && self.present[replica]
            && !self.probe_down[replica]
            && now_ms >= self.error_until_ms[replica]
    }

    /// Why `replica` is or is not available at `now_ms` (`Up` exactly when
    /// [`Health::available`]).
    pub fn state(&self, replica: usize, now_ms: u64) -> ReplicaHealth {
        if !self.present(replica) {
            ReplicaHealth::Absent
        } else if self.probe_down[replica] && !self.proven[replica] {
            ReplicaHealth::AwaitingProbe
        } else if self.probe_down[replica] {
            ReplicaHealth::ProbeDown
        } else if now_ms < self.error_until_ms[replica] {
            ReplicaHealth::ServerErrors {
                until_ms: self.error_until_ms[replica],
            }
        } else {
            ReplicaHealth::Up
        }
    }

    /// Whether any replica is available at `now_ms`.
    pub fn any_available(&self, now_ms: u64) -> bool {
        (0..self.probe_down.len()).any(|r| self.available(r, now_ms))
    }

    /// The replica's probe answered (`up`) or failed. Unknown replicas are ignored.
    pub fn probe(&mut self, replica: usize, up: bool) {
        if let Some(down) = self.probe_down.get_mut(replica) {
            *down = !up;
            self.proven[replica] |= up && self.present[replica];
        }
    }

    /// A request decided at `opened_ms` on `replica` ended with `status` (0: none) at
    /// `now_ms`. Returns whether it was a server error (5xx).
    pub fn ended(&mut self, replica: usize, opened_ms: u64, status: u32, now_ms: u64) -> bool {
        if replica >= self.probe_down.len() {
            return false;
        }
        if status >= 500 {
            self.error_until_ms[replica] = now_ms + ERROR_HOLD_MS;
            self.error_at_ms[replica] = now_ms;
            return true;
        }
        if status > 0 && opened_ms > self.error_at_ms[replica] {
            // Decided after the last 5xx and answered: the replica works again.
            self.error_until_ms[replica] = 0;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_probe_takes_a_replica_out_until_it_answers() {
        let mut h = Health::new(2);
        assert!(h.available(0, 0));
        h.probe(0, false);
        assert!(!h.available(0, 0));
        assert!(h.any_available(0));
        h.probe(0, true);
        assert!(h.available(0, 0));
        h.probe(7, false);
        assert!(!h.available(7, 0));
        assert_eq!(h.state(7, 0), ReplicaHealth::Absent);
    }

    #[test]
    fn the_state_names_why_a_replica_is_out_and_is_up_exactly_when_available() {
        let mut h = Health::new(1);
        h.join(1);
        let states = |h: &Health, now_ms| [h.state(0, now_ms), h.state(1, now_ms)];
        assert_eq!(
            states(&h, 0),
            [ReplicaHealth::Up, ReplicaHealth::AwaitingProbe]
        );
        h.probe(1, true);
        h.probe(0, false);
        assert_eq!(states(&h, 0), [ReplicaHealth::ProbeDown, ReplicaHealth::Up]);
        h.ended(1, 0, 502, 100);
        assert_eq!(
            h.state(1, 100),
            ReplicaHealth::ServerErrors {
                until_ms: 100 + ERROR_HOLD_MS
            }
        );
        assert_eq!(h.state(1, 100 + ERROR_HOLD_MS), ReplicaHealth::Up);
        h.leave(1);
        assert_eq!(h.state(1, 0), ReplicaHealth::Absent);
        for now_ms in [0, 100, 100 + ERROR_HOLD_MS] {
            for r in 0..3 {
                assert_eq!(
                    h.state(r, now_ms) == ReplicaHealth::Up,
                    h.available(r, now_ms)
                );
            }
        }
    }

    #[test]
    fn a_joined_replica_waits_for_its_first_probe_and_a_left_one_is_never_used() {
        let mut h = Health::new(1);
        h.join(2);
        assert!(!h.present(1) && h.present(2));
        assert!(!h.available(2, 0) && !h.usable(2, 0, true));
        // All down: the fallback takes proven replicas only.
        h.probe(0, false);
        assert!(!h.any_available(0));
        assert!(h.usable(0, 0, false) && !h.usable(2, 0, false) && !h.usable(1, 0, false));
        h.probe(2, true);
        assert!(h.available(2, 0));
        h.leave(2);
        assert!(!h.present(2) && !h.usable(2, 0, false));
        // A probe of a slot nobody holds proves nothing.
        h.probe(1, true);
        assert!(!h.available(1, 0));
        h.leave(0);
        assert!(!h.any_usable(0));
        h.leave(9);
    }

    #[test]
    fn a_5xx_holds_a_replica_out_and_only_a_later_decision_clears_it() {
        let mut h = Health::new(1);
        assert!(h.ended(0, 10, 503, 100));
        assert!(!h.available(0, 100));
        assert!(!h.available(0, 100 + ERROR_HOLD_MS - 1));
        assert!(h.available(0, 100 + ERROR_HOLD_MS));
        assert!(!h.any_available(200));
        // A request in flight at the 5xx succeeds: nothing new.
        assert!(!h.ended(0, 50, 200, 300));
        assert!(!h.available(0, 300));
        // One decided after it succeeds: the replica works again.
        assert!(!h.ended(0, 150, 200, 400));
        assert!(h.available(0, 400));
    }
}
