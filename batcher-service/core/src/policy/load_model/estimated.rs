//! The estimated cost model: the work the policy assigned each replica, decaying with time.
//!
//! Without progress reports (an older filter, `observe: false`, or reports lost) the
//! batcher never sees a request finish in assign mode. What it knows is the work it sent
//! each replica and when ([`DecayingLoad`]), so:
//!
//! - `P_r = L_r + w_r`: the replica's load plus the request's work there, `w_r =` its
//!   uncached prompt + `per_request_work` (decode);
//! - the bound is `balance · mean + balance_slack`, with
//!   `mean = (Σ L + min_r w_r) / replicas`: the mean load once the request is placed;
//! - among replicas equal on prefix, the cohort's owner comes first (differences of
//!   decayed work within the bound are history, not queue), then the least `P_r`, then the
//!   replica similar requests went to, then the fewest blocks held.
//!
//! Two ways of forgetting work (`PolicyConfig::drain_rate_per_s`): decaying with
//! `load_half_life_ms` (the default), or draining at a service rate μ (the outstanding
//! work of a FIFO server). An engine-reported count of requests in flight + queued raises
//! a replica's load to `count × mean work per request` while fresh (`report_ttl_ms`).
//! Why the decaying sum is the default: docs/DECISIONS.md, "Load without completions".

use super::{Candidate, Fleet, LoadModel};
use crate::policy::load::{Decay, DecayingLoad};
use std::cmp::Ordering;

/// The decaying assigned work per replica, and what it is read with.
#[derive(Debug, Clone)]
pub struct EstimatedLoad {
    loads: Vec<DecayingLoad>,
    decay: Decay,
    report_ttl_ms: u64,
    balance_slack: f64,
    per_request_work: f64,
    /// Mean work per request (converts engine-reported counts into work).
    mean_work: f64,
}

impl EstimatedLoad {
    pub fn new(
        replicas: usize,
        decay: Decay,
        report_ttl_ms: u64,
        balance_slack: f64,
        per_request_work: f64,
    ) -> EstimatedLoad {
        EstimatedLoad {
            loads: vec![DecayingLoad::default(); replicas],
            decay,
            report_ttl_ms,
            balance_slack,
            per_request_work,
            mean_work: per_request_work.max(1.0),
        }
    }

    /// Zeroes `replica`'s load (appending the slot when it is new).
    pub fn reset_slot(&mut self, replica: usize) {
        if replica >= self.loads.len() {
            self.loads.resize(replica + 1, DecayingLoad::default());
        }
        self.loads[replica] = DecayingLoad::default();
    }

    /// Work every request costs beyond its uncached prompt (non-finite: none).
    pub fn per_request_work(&self) -> f64 {
        if self.per_request_work.is_finite() {
            self.per_request_work.max(0.0)
        } else {
            0.0
        }
    }

    /// `L_r` at `now_ms`.
    pub fn load(&self, replica: usize, now_ms: u64) -> f64 {
        self.loads[replica].effective_with(now_ms, self.decay, self.report_ttl_ms, self.mean_work)
    }

    /// `work` was assigned to `replica` at `now_ms`.
    pub fn assigned(&mut self, replica: usize, work: f64, now_ms: u64) {
        self.loads[replica].add_with(work, now_ms, self.decay);
        self.mean_work += (work - self.mean_work) / 64.0;
    }

    /// An engine reported `requests` in flight and queued on `replica`. False for an
    /// unknown replica.
    pub fn report(&mut self, replica: usize, requests: u32, now_ms: u64) -> bool {
        match self.loads.get_mut(replica) {
            Some(l) => {
                l.report(requests, now_ms);
                true
            }
            None => false,
        }
    }
}

impl LoadModel for EstimatedLoad {
    fn projected(&self, _replica: usize, c: &Candidate) -> f64 {
        c.load + c.work
    }

    fn bound(&self, fleet: &Fleet) -> f64 {
        let mean = (fleet.total_load + fleet.least_work) / fleet.replicas as f64;
        let slack = if self.balance_slack.is_finite() {
            self.balance_slack.max(0.0)
        } else {
            f64::INFINITY
        };
        fleet.balance * mean + slack
    }

    fn order_equal_prefixes(&self, r: &Candidate, b: &Candidate) -> Ordering {
        let room = b.blocks_held.cmp(&r.blocks_held);
        r.owner_rank
            .cmp(&b.owner_rank)
            .then(b.projected.total_cmp(&r.projected))
            .then(r.similar_rank.cmp(&b.similar_rank))
            .then(room)
    }
}
