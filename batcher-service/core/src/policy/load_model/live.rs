//! The live cost model: each replica's queue of prefill work, known exactly from the
//! filters' progress reports ([`InFlight`]), turned into an expected time to first token.
//!
//! - `P_r = W_r + (u_r + prefill_base) / μ_r`, in ms: `W_r` is the wait before this
//!   request's prefill (the prefill work of requests sent to `r` with no first byte yet,
//!   less what `r` has done of the head one since it began, or a fresh engine-reported
//!   queue if longer, over `μ_r`), and `u_r` the request's uncached prompt there. `μ_r` is
//!   the fleet's mean service rate learnt from first bytes, or the replica's own when that
//!   is below half of it (a slow replica), so the noise of single samples does not move
//!   requests off their prefix.
//! - The bound is `balance · min_r P_r + slack · (cost + prefill_base) / μ̄`: a request may
//!   wait on the replica holding more of its prefix up to `slack` of its own cold prefills
//!   longer than elsewhere, to keep the prefix in fewer caches. `slack` is `live_slack`
//!   for a shared prefix and `live_slack_private` for a private one (a conversation's own
//!   history, which one earlier request brought): moving a shared prefix gives it a second
//!   holder that splits its future load; moving a private one re-prefills the history
//!   elsewhere and relieves nothing lasting.
//! - Among replicas equal on prefix: the least expected wait, then the most cache room
//!   (fewest blocks held, as SGLang's smallest tree), then the cohort's owner, then the
//!   replica similar requests went to. Same intent is not same prefix: a new prefix on an
//!   idle fleet goes where it evicts least, not where its intent cohort went.
//!
//! The measurements behind the slacks and the order: docs/DECISIONS.md.

use super::{finite_or_zero, Candidate, Fleet, LoadModel};
use crate::policy::in_flight::{InFlight, Reported};
use std::cmp::Ordering;

/// A replica whose learnt rate is below this share of the fleet's mean is costed at its
/// own rate.
const SLOW_REPLICA: f64 = 0.5;

/// The settings the live model reads (from `PolicyConfig`).
#[derive(Debug, Clone, Copy)]
pub struct LiveSettings {
    pub live_window_ms: u64,
    pub report_ttl_ms: u64,
    pub prefill_base_work: f64,
    pub live_slack: f64,
    pub live_slack_private: f64,
    pub default_rate_per_ms: f64,
}

/// The in-flight book, the engines' queue reports, and this decision's waits and rates.
#[derive(Debug)]
pub struct LiveLoad {
    settings: LiveSettings,
    in_flight: InFlight,
    /// Engine-reported queue (requests waiting) per replica, with when.
    queued: Vec<Option<(u32, u64)>>,
    /// Mean prefill work per request, for engine queue reports.
    mean_prefill: f64,
    /// This decision's `W_r` and `μ_r` ([`LiveLoad::prepare`]).
    wait: Vec<f64>,
    rate: Vec<f64>,
    fleet_rate: f64,
}

impl LiveLoad {
    pub fn new(replicas: usize, settings: LiveSettings, in_flight: InFlight) -> LiveLoad {
        LiveLoad {
            settings,
            in_flight,
            queued: vec![None; replicas],
            mean_prefill: settings.prefill_base_work.max(1.0),
            wait: vec![0.0; replicas],
            rate: vec![1.0; replicas],
            fleet_rate: 1.0,
        }
    }

    /// Empties `replica`'s slot (growing every per-replica list when it is new): no queue
    /// report, no tickets, no learnt rate.
    pub fn reset_slot(&mut self, replica: usize) {
        if replica >= self.queued.len() {
            self.queued.resize(replica + 1, None);
            self.wait.resize(replica + 1, 0.0);
            self.rate.resize(replica + 1, 1.0);
        }
        self.queued[replica] = None;
        self.wait[replica] = 0.0;
        self.rate[replica] = 1.0;
        self.in_flight.reset_slot(replica);
    }

    /// Whether a progress report came within the live window: decisions then use this
    /// model.
    pub fn is_live(&self, now_ms: u64) -> bool {
        self.in_flight.is_live(now_ms, self.settings.live_window_ms)
    }

    /// The fixed part of every prefill (non-finite or negative: none).
    pub fn prefill_base(&self) -> f64 {
        finite_or_zero(self.settings.prefill_base_work)
    }

    /// The fleet's learnt prefill rate, work units per ms, or the default before any.
    pub fn fleet_rate(&self) -> f64 {
        self.in_flight
            .mean_rate()
            .unwrap_or(self.settings.default_rate_per_ms)
            .max(1e-6)
    }

    /// Computes every replica's wait and rate at `now_ms`, for the decision about to be
    /// made.
    pub fn prepare(&mut self, now_ms: u64) {
        let fleet_rate = self.fleet_rate();
        self.fleet_rate = fleet_rate;
        for r in 0..self.wait.len() {
            let own = self.in_flight.rate(r, fleet_rate);
            let rate = if own < SLOW_REPLICA * fleet_rate {
                own
            } else {
                fleet_rate
            };
            let backlog = self.in_flight.backlog(r, rate, now_ms);
            self.wait[r] = backlog.max(self.engine_queue(r, now_ms)) / rate;
            self.rate[r] = rate;
        }
    }

    /// A fresh engine-reported queue on `replica` in work units (`waiting × mean
    /// prefill`): work other batcher shards sent shows there; 0 when stale or absent.
    fn engine_queue(&self, replica: usize, now_ms: u64) -> f64 {
        match self.queued[replica] {
            Some((waiting, at)) if now_ms.saturating_sub(at) <= self.settings.report_ttl_ms => {
                f64::from(waiting) * self.mean_prefill
            }
            _ => 0.0,
        }
    }

    /// The decision number `decisions` sent `prefill` work to `replica`; opens a ticket
    /// for its progress reports when `track` (0: none).
    pub fn assigned(
        &mut self,
        replica: usize,
        prefill: f64,
        decisions: u64,
        track: bool,
        now_ms: u64,
    ) -> u64 {
        // A mean over the decisions so far, then over the last 64 or so.
        self.mean_prefill += (prefill - self.mean_prefill) / (decisions.min(64) as f64);
        if track {
            self.in_flight.open(replica, prefill, now_ms)
        } else {
            0
        }
    }

    /// An engine reported `waiting` requests queued on `replica`.
    pub fn report_queue(&mut self, replica: usize, waiting: u32, now_ms: u64) {
        if let Some(q) = self.queued.get_mut(replica) {
            *q = Some((waiting, now_ms));
        }
    }

    /// The in-flight book (progress reports go there).
    pub fn in_flight(&self) -> &InFlight {
        &self.in_flight
    }

    pub fn first_byte(&mut self, ticket: u64, elapsed_ms: u32, now_ms: u64) -> Option<Reported> {
        self.in_flight.first_byte(ticket, elapsed_ms, now_ms)
    }

    pub fn end(&mut self, ticket: u64, status: u32, now_ms: u64) -> Option<Reported> {
        self.in_flight.end(ticket, status, now_ms)
    }

    pub fn moved(&mut self, ticket: u64, replica: usize, now_ms: u64) -> bool {
        self.in_flight.moved(ticket, replica, now_ms)
    }

    pub fn expire(&mut self, now_ms: u64) {
        self.in_flight.expire(now_ms);
    }
}

impl LoadModel for LiveLoad {
    fn projected(&self, replica: usize, c: &Candidate) -> f64 {
        self.wait[replica] + c.prefill / self.rate[replica]
    }

    fn bound(&self, fleet: &Fleet) -> f64 {
        let slack = finite_or_zero(if fleet.private_prefix {
            self.settings.live_slack_private
        } else {
            self.settings.live_slack
        });
        fleet.balance * fleet.cheapest
            + slack * (fleet.cost + self.prefill_base()) / self.fleet_rate
    }

    fn order_equal_prefixes(&self, r: &Candidate, b: &Candidate) -> Ordering {
        let room = b.blocks_held.cmp(&r.blocks_held);
        b.projected
            .total_cmp(&r.projected)
            .then(room)
            .then(r.owner_rank.cmp(&b.owner_rank))
            .then(r.similar_rank.cmp(&b.similar_rank))
    }
}
