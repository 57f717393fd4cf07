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

/// How long a replica that answered 5xx is left out of decisions, ms.
pub const ERROR_HOLD_MS: u64 = 5_000;

/// Per replica: what says it should not be chosen.
#[derive(Debug, Clone, Default)]
pub struct Health {
    probe_down: Vec<bool>,
    error_until_ms: Vec<u64>,
    error_at_ms: Vec<u64>,
}

impl Health {
    pub fn new(replicas: usize) -> Health {
        Health {
            probe_down: vec![false; replicas],
            error_until_ms: vec![0; replicas],
            error_at_ms: vec![0; replicas],
        }
    }

    /// Whether decisions at `now_ms` may choose `replica` (false for an unknown one).
    pub fn available(&self, replica: usize, now_ms: u64) -> bool {
        replica < self.probe_down.len()
            && !self.probe_down[replica]
            && now_ms >= self.error_until_ms[replica]
    }

    /// Whether any replica is available at `now_ms`.
    pub fn any_available(&self, now_ms: u64) -> bool {
        (0..self.probe_down.len()).any(|r| self.available(r, now_ms))
    }

    /// The replica's probe answered (`up`) or failed. Unknown replicas are ignored.
    pub fn probe(&mut self, replica: usize, up: bool) {
        if let Some(down) = self.probe_down.get_mut(replica) {
            *down = !up;
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
