//! Replica choice: prefix-aware, cohort-aware, load-bounded.
//!
//! In assign mode the filter asks the batcher which engine replica should serve a request
//! and the answer must come back within the filter's deadline (25 ms), so the decision is
//! a few hash look-ups per replica, with no I/O and with time injected by the caller.
//!
//! # What the policy knows, one module each
//!
//! - [`prefix_state`]: per replica, a bounded LRU set of the chained block hashes it was
//!   sent recently: the batcher's approximation of that engine's KV cache. Because block
//!   hashes are chained, the request's longest cached prefix on a replica is the run of its
//!   leading hashes found there (`matched_r` blocks).
//! - [`load_model`]: what the load costs, behind one trait, [`load_model::LoadModel`]:
//!   [`load_model::live`] (the exact queue of prefill work from the filters' progress
//!   reports, [`in_flight`]) while reports arrive, [`load_model::estimated`] (the assigned
//!   work, decaying, [`load`]) otherwise.
//! - [`owners`]: per intent cohort, the replica that serves it and, once it has spilled, a
//!   second one.
//! - [`health`]: which replicas may be chosen (probes, 5xx answers).
//! - [`burst_order`]: which decisions of a burst go first.
//!
//! Inputs from outside, per request ([`RouteRequest`]): its blocks and cost, its intent
//! cohort, and `similar`, the replica the most similar past requests went to (the
//! fingerprint store's neighbour vote, [`crate::neighbours::vote`]).
//!
//! # The rule, for one request of `n` blocks and cost `c` (prompt tokens or bytes)
//!
//! 1. For each replica `r`: `matched_r` (the modelled prefix; where the engine publishes
//!    its cache, [`RouteRequest::observed`], what it holds by its own account, or what was
//!    sent there since [`Observed::pending_since_ms`] if longer), the uncached prompt if placed there,
//!    `u_r = c · (n − matched_r) / n` (only the uncached part is prefilled), and the load
//!    model's projected cost `P_r`.
//! 2. A replica is *eligible* iff it is available ([`health`]; when none is, all are) and
//!    `P_r ≤ bound`, the load model's bound. `balance` is the one knob that trades hits
//!    for balance (∞ = prefix only, 1.0 = strict least cost).
//! 3. Among eligible replicas the longest prefix wins; among equal prefixes the load
//!    model's order decides (expected cost, cache room, cohort owner, similar requests).
//!    Exact ties go to the first replica in ring order starting at
//!    `(hash(first block) + decision count) mod replicas`, so replica 0 is not preferred.
//! 4. If no replica is eligible (a single request larger than the slack), take the least
//!    projected cost: a cost-aware least-loaded choice that still counts the cached
//!    prefix as free work.
//! 5. Record the request's blocks into the chosen replica's prefix state, its work into
//!    both load models (opening a ticket for its progress reports), and update the cohort
//!    owners (a spill makes the new replica the secondary).
//!
//! With live load the bound is relative to the cheapest *time to first token*, cache
//! included: a hot prefix stays on its holder while waiting there is cheaper than a cold
//! prefill elsewhere (within `balance`), and moves the moment it is not; a quiet fleet keeps
//! every prefix home (every queue is empty, the cached prefill is the cheapest); a slow or
//! stuck replica's queue shows within one report, not after a 60 s decay. The measured
//! choices behind the rule's order and slacks are in docs/DECISIONS.md.
//!
//! # Why, against SGLang's `cache_aware` router
//!
//! - SGLang counts requests in flight per worker (it proxies them, so its count is
//!   exact) and switches *globally* between "best match" and "shortest queue" when the
//!   fleet looks imbalanced (max − min above an absolute and a relative threshold), so
//!   under imbalance it forgets the cache for every request, and while balanced it ignores
//!   load altogether. Here the same exact count comes from the filters' progress reports,
//!   weighted by the work each request still has to prefill, and the guard is per replica
//!   and per request: a request only leaves its prefix
//!   holder when that holder would exceed the bound, and the requests that move are the
//!   ones that lose least: a new conversation matches only the shared trunk, which every
//!   replica holds, so it costs nothing to send it to the valley. That is what keeps the
//!   hit ratio at a tight bound. A hot prefix held by one replica spills: the spill target
//!   receives the prefix and from then on it is matched on two replicas, the load-aware
//!   tie-break sharing it between them.
//! - Ties there go to the first worker in the list; here they rotate (rule 3), so
//!   replica 0 is not preferred at start-up or on a cold prefix.
//! - Its radix tree grows between periodic eviction passes; here each replica's state is
//!   capped on every insert (`blocks_per_replica`), evicting least recently used blocks,
//!   leaves before trunks.
//! - Routing keys built from the first message alone send every conversation of one
//!   application to one worker; here the whole chain of block hashes is matched, so
//!   conversations that share a system prompt still separate at their first own block.
//! - Load is measured in work (uncached prompt + decode estimate), not request count, so
//!   a 100k-token prompt and a 100-token prompt do not weigh the same.
//!
//! The replica set can change at runtime (engine discovery): everything above is kept per
//! *slot*. [`Policy::join`] gives a new replica the lowest free slot with fresh state, held
//! out of decisions until its first probe answers; [`Policy::leave`] drops a slot's state
//! (prefix residency, loads, open tickets, cohort ownership) and never chooses it again.
//! Replicas that stay keep their slots and state, so a change costs nothing to the rest.
//!
//! No input panics: zero replicas is treated as one, out-of-range replica ids in reports
//! are ignored, non-finite or sub-1 `balance` values are clamped.

pub mod burst_order;
mod choice;
mod config;
pub mod health;
pub mod in_flight;
pub mod load;
pub mod load_model;
pub mod owners;
pub mod prefix_state;
mod snapshot;

pub use self::choice::{Choice, ChoiceReason, Observed, RouteRequest};
pub use self::config::PolicyConfig;
pub use self::health::ReplicaHealth;
pub use self::snapshot::{PolicySnapshot, ReplicaSnapshot};
pub use cohort_fingerprint::shard::{shard_key, SHARD_KEY_DEPTH};

use self::health::Health;
use self::in_flight::{InFlight, Reported};
use self::load::Decay;
use self::load_model::estimated::EstimatedLoad;
use self::load_model::live::{LiveLoad, LiveSettings};
use self::load_model::{Candidate, Fleet, LoadModel};
use self::owners::{CohortOwners, Owners};
use self::prefix_state::PrefixState;

/// The replica-choice policy (one per batcher shard).
#[derive(Debug)]
pub struct Policy {
    config: PolicyConfig,
    balance: f64,
    states: Vec<PrefixState>,
    estimated: EstimatedLoad,
    live: LiveLoad,
    owners: CohortOwners,
    health: Health,
    assigned: Vec<u64>,
    decisions: u64,
    reasons: [u64; ChoiceReason::ALL.len()],
    /// This decision's candidates, one per replica (reused across decisions).
    candidates: Vec<Candidate>,
    /// While [`Policy::choose_among`] decides: the slots it may choose.
    allowed: Option<Vec<bool>>,
}

/// SplitMix64 finaliser: spreads a block hash (or id) over all 64 bits.
pub fn mix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Policy {
    /// A policy with empty prefix states and zero loads.
    pub fn new(config: PolicyConfig) -> Self {
        let n = config.replicas.max(1);
        let balance = if config.balance.is_nan() {
            1.0
        } else {
            config.balance.max(1.0)
        };
        let decay = match config.drain_rate_per_s {
            Some(r) if r.is_finite() && r > 0.0 => Decay::Drain(r / 1000.0),
            _ => Decay::HalfLife(config.load_half_life_ms),
        };
        let live = LiveSettings {
            live_window_ms: config.live_window_ms,
            report_ttl_ms: config.report_ttl_ms,
            prefill_base_work: config.prefill_base_work,
            live_slack: config.live_slack,
            live_slack_private: config.live_slack_private,
            default_rate_per_ms: config.default_rate_per_ms,
        };
        Self {
            balance,
            states: (0..n)
                .map(|_| PrefixState::new(config.blocks_per_replica))
                .collect(),
            estimated: EstimatedLoad::new(
                n,
                decay,
                config.report_ttl_ms,
                config.balance_slack,
                config.per_request_work,
            ),
            live: LiveLoad::new(
                n,
                live,
                InFlight::new(n, config.ticket_ttl_ms, config.max_tickets),
            ),
            owners: CohortOwners::new(config.max_cohorts),
            health: Health::new(n),
            assigned: vec![0; n],
            decisions: 0,
            reasons: [0; ChoiceReason::ALL.len()],
            candidates: vec![Candidate::default(); n],
            allowed: None,
            config,
        }
    }

    /// The settings it was built with.
    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    /// Number of replicas (at least 1).
    pub fn replicas(&self) -> usize {
        self.states.len()
    }

    /// Whether a decision at `now_ms` has a replica to choose: one present whose probe
    /// has answered. Without one, a caller should not decide (the filter then routes by
    /// key).
    pub fn choosable(&self, now_ms: u64) -> bool {
        self.health.any_usable(now_ms)
    }

    /// Whether `slot` holds a replica of the current set.
    pub fn present(&self, slot: usize) -> bool {
        self.health.present(slot)
    }

    /// A replica joins the set: it takes the lowest slot no replica holds, or a new one,
    /// with fresh state (no prefix, no load, no tickets, no cohorts), and is not chosen
    /// until its first probe answers ([`Policy::probe`]). Returns its slot.
    pub fn join(&mut self) -> usize {
        let slot = (0..self.states.len())
            .find(|&r| !self.health.present(r))
            .unwrap_or(self.states.len());
        self.clear_slot(slot);
        self.health.join(slot);
        slot
    }

    /// The replica at `slot` left the set: it is never chosen again and its state is
    /// dropped (prefix residency, load, open tickets, cohort ownership). Late progress
    /// reports for its requests are ignored. Unknown or empty slots are ignored.
    pub fn leave(&mut self, slot: usize) {
        if !self.health.present(slot) {
            return;
        }
        self.clear_slot(slot);
        self.health.leave(slot);
    }

    /// Fresh state at `slot`, appending one when `slot` is the next.
    fn clear_slot(&mut self, slot: usize) {
        let fresh = PrefixState::new(self.config.blocks_per_replica);
        if slot < self.states.len() {
            self.states[slot] = fresh;
            self.assigned[slot] = 0;
            self.owners.forget(slot);
        } else {
            self.states.push(fresh);
            self.assigned.push(0);
            self.candidates.push(Candidate::default());
        }
        self.estimated.reset_slot(slot);
        self.live.reset_slot(slot);
    }

    /// The fleet's learnt prefill rate, work units (≈ prompt tokens) per ms: the mean of
    /// the replicas' rates from progress reports, or the configured default before any.
    pub fn prefill_rate_per_ms(&self) -> f64 {
        self.live.fleet_rate()
    }

    /// Chooses a replica for `req` and records the request there (prefix state, load,
    /// cohort owner). See the module documentation for the rule.
    pub fn choose(&mut self, req: &RouteRequest<'_>) -> Choice {
        let n = self.states.len();
        let blocks = req.blocks;
        let now = req.now_ms;
        let cost = f64::from(req.cost);
        let per_request = self.estimated.per_request_work();
        let base = self.live.prefill_base();
        let owners = req.cohort.and_then(|c| self.owners.get(c));
        // Where similar requests went counts only while the cohort has no owner.
        let similar = req.similar.filter(|&r| owners.is_none() && r < n);
        let any_available = self.health.any_available(now);

        let live = self.live.is_live(now);
        if live {
            self.live.prepare(now);
        }
        let model: &dyn LoadModel = if live { &self.live } else { &self.estimated };

        // 1. Each replica as a candidate.
        let mut total_load = 0.0;
        let mut least_work = f64::INFINITY;
        let mut cheapest = f64::INFINITY;
        for r in 0..n {
            let (modelled, uses) = self.states[r].matched_uses(blocks, now);
            let matched = match req.observed.get(r).copied().flatten() {
                None => modelled,
                Some(observed) => observed
                    .held
                    .min(blocks.len())
                    .max(self.states[r].matched_since(blocks, observed.pending_since_ms, now)),
            };
            let uncached = if blocks.is_empty() {
                cost
            } else {
                cost * (blocks.len() - matched) as f64 / blocks.len() as f64
            };
            let mut c = Candidate {
                matched,
                uses,
                work: uncached + per_request,
                load: self.estimated.load(r, now),
                prefill: uncached + base,
                projected: 0.0,
                usable: self.health.usable(r, now, any_available)
                    && self
                        .allowed
                        .as_ref()
                        .is_none_or(|a| a.get(r).copied().unwrap_or(false)),
                blocks_held: self.states[r].len(),
                owner_rank: Owners::rank(owners, r),
                similar_rank: u8::from(similar == Some(r)),
            };
            c.projected = model.projected(r, &c);
            total_load += c.load;
            least_work = least_work.min(c.work);
            if c.usable {
                cheapest = cheapest.min(c.projected);
            }
            self.candidates[r] = c;
        }
        let candidates = &self.candidates;
        let best_matched = candidates.iter().map(|c| c.matched).max().unwrap_or(0);
        let floor = candidates.iter().map(|c| c.matched).min().unwrap_or(0);
        // A private prefix: the longest, longer than some replica's, came with one request.
        let private_prefix = best_matched > floor
            && candidates
                .iter()
                .all(|c| c.matched < best_matched || c.uses <= 1);

        // 2. The bound.
        let bound = model.bound(&Fleet {
            balance: self.balance,
            replicas: n,
            cheapest,
            total_load,
            least_work,
            cost,
            private_prefix,
        });

        // 3. The longest prefix among the eligible, then the load model's order.
        let start = (mix64(blocks.first().copied().unwrap_or(0)).wrapping_add(self.decisions)
            % n as u64) as usize;
        let mut best: Option<usize> = None;
        for i in 0..n {
            let r = (start + i) % n;
            let c = &candidates[r];
            if c.projected > bound || !c.usable {
                continue;
            }
            let better = match best {
                None => true,
                Some(b) => {
                    let b = &candidates[b];
                    c.matched > b.matched
                        || (c.matched == b.matched && model.order_equal_prefixes(c, b).is_gt())
                }
            };
            if better {
                best = Some(r);
            }
        }
        // 4. None eligible: the least projected cost.
        let replica = best.unwrap_or_else(|| {
            let mut b: Option<usize> = None;
            for i in 0..n {
                let r = (start + i) % n;
                if candidates[r].usable
                    && b.is_none_or(|b| candidates[r].projected < candidates[b].projected)
                {
                    b = Some(r);
                }
            }
            // Nothing usable (callers check [`Policy::choosable`]): a present slot if any.
            b.or_else(|| {
                (0..n)
                    .map(|i| (start + i) % n)
                    .find(|&r| self.health.present(r))
            })
            .unwrap_or(start)
        });

        let chosen = candidates[replica];
        let reason = if chosen.matched == best_matched && best_matched > floor {
            ChoiceReason::Prefix
        } else if chosen.owner_rank > 0 {
            ChoiceReason::Cohort
        } else if similar == Some(replica) {
            ChoiceReason::Similar
        } else if best_matched > chosen.matched
            || owners.is_some_and(|o| {
                candidates[o.primary].projected > bound || !candidates[o.primary].usable
            })
        {
            // A longer prefix, or the cohort's owner, was out of bounds (or down). An owner
            // within bounds that lost on the wait is not a spill.
            ChoiceReason::LoadSpill
        } else {
            ChoiceReason::LeastLoaded
        };

        // 5. Record.
        if let Some(c) = req.cohort {
            self.owners.placed(c, owners, replica);
        }
        self.states[replica].record(blocks, now, now.saturating_add(req.resident_ms));
        self.estimated.assigned(replica, chosen.work, now);
        self.assigned[replica] += 1;
        self.decisions += 1;
        self.reasons[reason as usize] += 1;
        let ticket = self
            .live
            .assigned(replica, chosen.prefill, self.decisions, req.track, now);

        Choice {
            replica,
            matched_blocks: chosen.matched,
            reason,
            ticket,
        }
    }

    /// [`Policy::choose`] restricted to the slots `allowed` marks (an endpoint picker's
    /// subset hint). Callers check [`Policy::usable`] first: with no allowed slot usable,
    /// the choice falls back as `choose` does when nothing is usable.
    pub fn choose_among(&mut self, req: &RouteRequest<'_>, allowed: &[bool]) -> Choice {
        self.allowed = Some(allowed.to_vec());
        let choice = self.choose(req);
        self.allowed = None;
        choice
    }

    /// Per slot: whether a decision at `now_ms` may choose it (present, probed, not held
    /// out for errors; or, when no replica is available, any proven one).
    pub fn usable(&self, now_ms: u64) -> Vec<bool> {
        let any = self.health.any_available(now_ms);
        (0..self.states.len())
            .map(|r| self.health.usable(r, now_ms, any))
            .collect()
    }

    /// After a decision that chose `chosen`: the other replicas that decision could use
    /// (and `allowed` marks, when given), in its order of preference: within the load
    /// bound's reach first by the longer prefix held, then by the lower projected cost.
    /// What a proxy tries next when `chosen` refuses (an endpoint picker's fallbacks).
    pub fn alternatives(&self, chosen: usize, allowed: Option<&[bool]>) -> Vec<usize> {
        let mut others: Vec<usize> = (0..self.candidates.len())
            .filter(|&r| r != chosen && self.candidates[r].usable)
            .filter(|&r| allowed.is_none_or(|a| a.get(r).copied().unwrap_or(false)))
            .collect();
        let c = &self.candidates;
        others.sort_by(|&a, &b| {
            c[b].matched
                .cmp(&c[a].matched)
                .then(c[a].projected.total_cmp(&c[b].projected))
        });
        others
    }

    /// `ticket`'s request was served by `replica`, not by the replica it was decided for
    /// (the proxy went down its fallback list): its in-flight count moves there, and its
    /// end report then speaks for `replica`. Returns false for an unknown ticket.
    pub fn moved(&mut self, ticket: u64, replica: usize, now_ms: u64) -> bool {
        replica < self.states.len() && self.live.moved(ticket, replica, now_ms)
    }

    /// The first response byte of `ticket`'s request went by, `elapsed_ms` after the
    /// decision.
    pub fn first_byte(&mut self, ticket: u64, elapsed_ms: u32, now_ms: u64) -> Option<Reported> {
        self.live.first_byte(ticket, elapsed_ms, now_ms)
    }

    /// `ticket`'s request ended with `status` (0: none). A 5xx holds its replica out of
    /// decisions for a while ([`health`]).
    pub fn end(&mut self, ticket: u64, status: u32, now_ms: u64) -> Option<Reported> {
        let reported = self.live.end(ticket, status, now_ms)?;
        if let Some(status) = reported.status {
            self.health
                .ended(reported.replica, reported.opened_ms, status, now_ms);
        }
        Some(reported)
    }

    /// Closes tickets whose reports never came.
    pub fn expire(&mut self, now_ms: u64) {
        self.live.expire(now_ms);
    }

    /// The replica's health probe answered (`up`) or failed ([`health`]). When no replica
    /// is available, decisions use all of them: a request routed somewhere beats one
    /// refused.
    pub fn probe(&mut self, replica: usize, up: bool) {
        self.health.probe(replica, up);
    }

    /// Engine-reported requests waiting (queued, not yet prefilling) on `replica`.
    pub fn report_engine_queue(&mut self, replica: usize, waiting: u32, now_ms: u64) {
        self.live.report_queue(replica, waiting, now_ms);
    }

    /// Engine-reported requests in flight and queued on `replica` at `now_ms`; raises
    /// that replica's estimated load while fresh. Returns false for an unknown replica.
    pub fn report_engine_load(
        &mut self,
        replica: usize,
        in_flight: u32,
        queued: u32,
        now_ms: u64,
    ) -> bool {
        self.estimated
            .report(replica, in_flight.saturating_add(queued), now_ms)
    }

    /// Whether every one of `blocks` counts as held on `replica` at `now_ms` (recorded
    /// within its cache TTL and not evicted from the modelled cache).
    pub fn holds(&self, replica: usize, blocks: &[u64], now_ms: u64) -> bool {
        self.states
            .get(replica)
            .is_some_and(|state| state.matched(blocks, now_ms) == blocks.len())
    }

    /// The engine at `replica` dropped its whole cache (its KV events said so: a prefix
    /// cache reset, or a restart): its modelled prefix state starts empty.
    pub fn cleared(&mut self, replica: usize) {
        if let Some(state) = self.states.get_mut(replica) {
            state.clear();
        }
    }

    /// A warm-up computed `blocks` on `replica`: they count as held for `resident_ms`, as
    /// if a request had sent them (no load: the warm-up ran on idle capacity).
    pub fn warmed(&mut self, replica: usize, blocks: &[u64], now_ms: u64, resident_ms: u64) {
        if let Some(state) = self.states.get_mut(replica) {
            state.record(blocks, now_ms, now_ms.saturating_add(resident_ms));
        }
    }

    /// Blocks `replica`'s prefix state counts as held at `now_ms` (recorded within their
    /// TTL, not evicted); 0 for an unknown replica. Walks the replica's whole state.
    pub fn resident_blocks(&self, replica: usize, now_ms: u64) -> usize {
        self.states
            .get(replica)
            .map_or(0, |state| state.resident(now_ms))
    }

    /// Assigned requests not ended on each replica (from the filters' progress reports).
    pub fn in_flight(&self) -> Vec<u32> {
        (0..self.states.len())
            .map(|r| self.live.in_flight().replica(r).in_flight)
            .collect()
    }
}
