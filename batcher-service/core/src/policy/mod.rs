//! Replica choice: prefix-aware, cohort-aware, load-bounded.
//!
//! In assign mode the filter asks the batcher which engine replica should serve a request
//! and the answer must come back within the filter's deadline (25 ms), so the decision is
//! a few hash look-ups per replica, with no I/O and with time injected by the caller.
//!
//! # What the policy knows
//!
//! - **Prefix state** ([`prefix_state`]): per replica, a bounded LRU set of the chained block
//!   hashes it was sent recently: the batcher's approximation of that engine's KV cache.
//!   Because block hashes are chained, the request's longest cached prefix on a replica is
//!   the run of its leading hashes found there (`matched_r` blocks).
//! - **Load** ([`load`]): per replica, the work the policy assigned it, decaying with a
//!   half-life, optionally raised by engine-reported in-flight + queued counts.
//! - **Cohort owners**: per cohort id (the online clustering's intent cohort), the replica
//!   that serves it and, once it has spilled, a second one. Bounded LRU of cohorts.
//!
//! # The rule, for one request of `n` blocks and cost `c` (prompt tokens or bytes)
//!
//! 1. For each replica `r`: `matched_r`, the uncached prompt if placed there,
//!    `u_r = c · (n − matched_r) / n` (only the uncached part is prefilled), and a
//!    projected cost `P_r`, which depends on what the policy knows of the load:
//!    - **live load** (the filters' progress reports are arriving, [`in_flight`]): the
//!      expected time to first token in ms, `P_r = W_r + (u_r + prefill_base) / μ_r`.
//!      `W_r` is the wait before this request's prefill: the prefill work of requests
//!      sent to `r` with no first byte yet, less what `r` has done of the head one since
//!      it began (or a fresh engine-reported queue, if longer), over `μ_r`. `μ_r` is the
//!      fleet's mean service rate learnt from first bytes, or the replica's own when that
//!      is below half of it (a slow replica). Without the head's progress a replica
//!      nearly through a long prefill looked as busy as one just starting it (Mooncake
//!      · 4: TTFT p90 0.89 → 0.80× sglang-router's with it). The bound is
//!      `balance · min_r P_r + live_slack · (c + prefill_base) / μ̄`; `live_slack` (1 by
//!      default) lets a request wait on its prefix's holder up to that many of its own cold
//!      prefills longer than elsewhere, to keep the prefix in fewer caches. At 1 a request
//!      leaves its holder about when the wait it saves exceeds twice the prefill it adds
//!      to the fleet (its own cold prefill elsewhere, and the prefix then evicting another
//!      there): the cost to others that a TTFT-greedy rule ignores. At 0 (TTFT-greedy)
//!      three llama-server replicas sharing two cores (the README demo) spread every
//!      app's prefix over all of them and cached 1.6× round-robin's tokens with a worse
//!      p95; at 1, 2.1–2.2× with p50 and p95 both better (docs/BENCHMARKS.md).
//!      A *private* prefix gets `live_slack_private` (3) instead: one whose last matched
//!      block only one earlier request brought to its holder ([`prefix_state`] counts
//!      them), i.e. a conversation's own history. Moving a shared prefix (an app's system
//!      prompt) gives it a second holder that splits its future load; moving a private
//!      one re-prefills the history elsewhere and relieves nothing lasting, because the
//!      holder's queue is other requests'. Measured on mooncake-conv · 4 (2026-12-05): one
//!      slack for both at 1 gave hits 0.91× sglang-router's, at 30 1.01× with TTFT p90
//!      +3%; the README demo's p50 went from 0.4× round-robin's to 0.7× at 3. Split, both
//!      keep their best;
//!    - **estimate** (no reports): `P_r = L_r + u_r + per_request_work`, with `L_r` the
//!      decaying assigned work ([`load`]); the bound is `balance · mean + balance_slack`,
//!      `mean = (Σ L + min_r w_r) / replicas`.
//! 2. A replica is *eligible* iff it is available (probe up, no recent 5xx; when none is,
//!    all are) and `P_r ≤ bound`. `balance` is the one knob that trades hits for balance
//!    (∞ = prefix only, 1.0 = strict least cost).
//! 3. Among eligible replicas pick the greatest
//!    `(matched_r, −P_r, −held_r, cohort rank, similar_r)` on live load,
//!    `(matched_r, cohort rank, −P_r, similar_r, −held_r)` on the estimate: the
//!    longest prefix wins; among equal prefixes the least expected wait; then, on live
//!    load, the fewest blocks held, so a new prefix on an idle fleet goes where the cache
//!    has most room (as SGLang's smallest tree); then the cohort's primary then secondary
//!    owner (on the estimate the owner comes first: its differences of decayed work are
//!    history, not queue); then, while the cohort has no owner, the replica the most
//!    similar past requests went to (`similar_r`, from the fingerprint store,
//!    [`crate::neighbours`]). On live load the owner came before the room until
//!    2026-12-06: on an idle fleet (every wait 0) each new application's first request
//!    then went to its intent cohort's owner, and with Banking77 user turns under every
//!    system prompt that was one replica for all of them; three llama-server replicas of
//!    two slots each (`scripts/bench-peers --preset llama`) thrashed it: 0.39 of prompt
//!    tokens cached against affinity's 0.46, TTFT p50 458 ms against 136.
//!    Putting the owner before the wait on live load sent every new
//!    Mooncake conversation (one intent cohort) to one replica until it hit the bound,
//!    and then its conversations' next turns spilled off their history (measured:
//!    `load_spill` 384 of 1,177 decisions either way, but hits 0.145 → 0.161 and
//!    templated-app p90 1.16× → 1.00× sglang-router's, docs/BENCHMARKS.md).
//!    The similar replica comes after the cost on purpose: given the owner's rank, it
//!    sent the first requests of two applications with the same intents but different
//!    system prompts to one replica on templated-app's cold start (2 decisions of 215)
//!    and piled their prefixes there (TTFT p90 2.0× sglang-router's instead of 1.2×;
//!    `results/peers/20261205T200650Z`). Same intent is not same prefix; it is a guess
//!    to break ties with, not a cost.
//!    Exact ties go to the first replica in ring order starting at
//!    `(hash(first block) + decision count) mod replicas`.
//! 4. If no replica is eligible (a single request larger than the slack), take the least
//!    projected cost: a cost-aware least-loaded choice that still counts the cached
//!    prefix as free work.
//! 5. Record the request's blocks into the chosen replica's prefix state, its work into
//!    the estimate, and open a ticket for its progress reports; update the cohort owners
//!    (a spill makes the new replica the secondary).
//!
//! With live load the bound is relative to the cheapest *time to first token*, cache
//! included: a hot prefix stays on its holder while waiting there is cheaper than a cold
//! prefill elsewhere (within `balance`), and moves the moment it is not; a quiet fleet keeps
//! every prefix home (every queue is empty, the cached prefill is the cheapest); a slow or
//! stuck replica's queue shows in `Q_r` within one report, not after a 60 s decay.
//!
//! # Why, against SGLang's `cache_aware` router
//!
//! - SGLang counts requests in flight per worker (it proxies them, so its count is
//!   exact) and switches *globally* between "best match" and "shortest queue" when the
//!   fleet looks imbalanced (max − min above an absolute and a relative threshold), so
//!   under imbalance it forgets the cache for every request, and while balanced it ignores
//!   load altogether. Here the same exact count comes from the filters' progress reports,
//!   weighted by the work each request still has to prefill, and the guard is per replica
//!   and per request.
//!   Here the guard is per replica and per request: a request only leaves its prefix
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
//! # Load without completions
//!
//! Without progress reports (an older filter, `observe: false`, or reports lost) the
//! batcher never sees a request finish in assign mode. Two load models
//! (`PolicyConfig::drain_rate_per_s`):
//!
//! - **Decaying assigned work** (default, `None`): the work it assigned, decaying with
//!   `load_half_life_ms` (60 s; see [`load`]).
//! - **Draining outstanding work** (`Some(μ)`): the work it assigned minus what a server
//!   executing `μ` work units per second has done since, floored at 0; the replay's
//!   server model exactly, so with the true μ it is the replica's FIFO backlog (the live
//!   batcher can learn μ from engine metrics later). Its bound needs an absolute slack
//!   (`balance_slack`, e.g. `μ × 5 s`), since the backlog is often 0 on every replica.
//!
//! The decaying model is the default because it is better on the replay's *served*
//! balance metric too (`crate::replay`, Mooncake, balance 1.2, 8 replicas at 25% / 50%):
//! decaying 0.984 / 0.984 of the pooled bound at served max/mean 1.089 / 1.090; draining
//! (slack 5 s) 0.946 / 0.958 at 1.164 / 1.158; draining with slack 0–2 s loses more hits
//! (0.88–0.91) for no better balance. The backlog is a short-horizon signal: it treats an
//! idle-for-now prefix holder as free and a briefly queued one as full, so it moves
//! requests off their prefix on noise, while executed work per 60 s window is decided
//! by the work a replica is given over about that horizon, which is what the decaying sum
//! measures.
//!
//! An engine-reported count of requests in flight + queued ([`Policy::report_engine_load`])
//! raises a replica's load to `count × mean work per request` while fresh (`report_ttl_ms`).
//! That is in outstanding-work units: with the draining model it is directly comparable;
//! with the decaying model it rarely exceeds the decayed sum (about 87 s of assigned work
//! against a few seconds of backlog), so it only bites when an engine is far behind (a
//! slow or stuck replica, or work from other batcher shards piling up). The replay's
//! shard table shows it fed every 1 s: hit ratios within 2% either way.
//!
//! No input panics: zero replicas is treated as one, out-of-range replica ids in reports
//! are ignored, non-finite or sub-1 `balance` values are clamped.

pub mod in_flight;
pub mod load;
pub mod prefix_state;

use std::num::NonZeroUsize;

use lru::LruCache;

use self::in_flight::{InFlight, Reported};
use self::load::{Decay, DecayingLoad};
use self::prefix_state::PrefixState;

/// Settings of a [`Policy`].
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyConfig {
    /// Engine replicas (0 is treated as 1).
    pub replicas: usize,
    /// Cap of each replica's approximate prefix state, in blocks (about its KV cache size
    /// in blocks; with `S` batcher shards, each shard's share: `blocks / S`).
    pub blocks_per_replica: usize,
    /// Balance bound: a replica is eligible while its projected load stays within
    /// `balance × mean + balance_slack`. `f64::INFINITY` disables the guard; values below
    /// 1 (and NaN) are treated as 1.
    pub balance: f64,
    /// Absolute slack of the bound, in work units (tokens or bytes, like `cost`).
    pub balance_slack: f64,
    /// Half-life of the assigned-work load estimate (with `S` batcher shards, `S ×` the
    /// single-batcher value, so each shard's window still spans as many decisions).
    pub load_half_life_ms: u64,
    /// Work every request costs beyond its uncached prompt (decode), in `cost` units.
    pub per_request_work: f64,
    /// How long an engine load report stays in force.
    pub report_ttl_ms: u64,
    /// Load model. `None`: load = assigned work decaying with `load_half_life_ms`.
    /// `Some(rate)`: load = outstanding work, draining at `rate` work units per second (the
    /// replica's service rate μ; with `S` batcher shards, each shard's share `μ / S`).
    /// Non-finite or non-positive rates fall back to the decaying model.
    pub drain_rate_per_s: Option<f64>,
    /// Cohorts whose owners are remembered (LRU beyond that).
    pub max_cohorts: usize,
    /// Live load: while a progress report came within this window, decisions use the
    /// exact pending prefill work per replica ([`in_flight`]) instead of the estimate.
    pub live_window_ms: u64,
    /// An open ticket whose reports never came is closed after this long.
    pub ticket_ttl_ms: u64,
    /// Open tickets at most (beyond, decisions get none).
    pub max_tickets: usize,
    /// Prefill work every request costs beyond its uncached prompt (live load), in `cost`
    /// units: the fixed part of a prefill, so a fully cached request still counts.
    pub prefill_base_work: f64,
    /// Live load: how much longer than the cheapest replica a request may wait on a
    /// replica holding more of its prefix, in its own cold prefills (the bound is
    /// `balance · min P + live_slack · (cost + prefill_base)`). Leaving a prefix's holder
    /// puts the prefix in one more cache; this is what a request is asked to pay, at most,
    /// to spare the fleet that.
    pub live_slack: f64,
    /// Live load: `live_slack` for a private prefix, one that a single earlier request
    /// sent to its holder (a conversation's own history, which no other request will
    /// share): moving it relocates the history and relieves nothing lasting, so it is held
    /// harder than a shared prefix, whose second holder splits that prefix's future load.
    pub live_slack_private: f64,
    /// Live load: the service rate (work units per ms) assumed for a replica until its
    /// first bytes teach its own; the fleet's mean learnt rate replaces it once there is one.
    pub default_rate_per_ms: f64,
}

impl PolicyConfig {
    /// Defaults for `replicas` replicas holding `blocks_per_replica` blocks each.
    pub fn new(replicas: usize, blocks_per_replica: usize) -> Self {
        Self {
            replicas,
            blocks_per_replica,
            ..Self::default()
        }
    }
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            replicas: 1,
            blocks_per_replica: 65_536,
            balance: 1.2,
            balance_slack: 0.0,
            load_half_life_ms: 60_000,
            per_request_work: 256.0,
            report_ttl_ms: 5_000,
            drain_rate_per_s: None,
            max_cohorts: 4_096,
            live_window_ms: 10_000,
            ticket_ttl_ms: 300_000,
            max_tickets: 65_536,
            prefill_base_work: 16.0,
            live_slack: 1.0,
            live_slack_private: 3.0,
            default_rate_per_ms: 1.0,
        }
    }
}

/// What the policy needs to know about a request.
#[derive(Debug, Clone, Copy)]
pub struct RouteRequest<'a> {
    /// Chained prefix block hashes, first block first.
    pub blocks: &'a [u64],
    /// Intent cohort, when the clustering assigned one.
    pub cohort: Option<u32>,
    /// The replica the most similar past requests went to ([`crate::neighbours::vote`]),
    /// when any is similar enough. While the cohort has no owner (a new cohort, one whose
    /// owner was forgotten, or no cohort) it breaks ties between replicas equal on prefix
    /// and expected cost, before the fewest blocks held.
    pub similar: Option<usize>,
    /// How long the request's blocks count as held on the chosen replica after it: the
    /// `cache-ttl` knob ([`prefix_state`]); `u64::MAX` for no limit.
    pub resident_ms: u64,
    /// Prompt size (tokens or bytes; the same unit as `per_request_work`).
    pub cost: u32,
    /// Injected time.
    pub now_ms: u64,
    /// Whether the caller will report the request's progress ([`Policy::first_byte`],
    /// [`Policy::end`]): only then is a ticket opened for it.
    pub track: bool,
}

/// Why a replica was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChoiceReason {
    /// It holds the longest cached prefix, longer than some other replica's.
    Prefix,
    /// No replica holds a longer prefix; it owns the request's cohort.
    Cohort,
    /// No replica holds a longer prefix, the cohort has no owner, and among the equally
    /// cheap replicas the most similar past requests went there.
    Similar,
    /// The prefix holder or cohort owner was over the balance bound; moved here.
    LoadSpill,
    /// Nothing distinguishes the replicas but load.
    LeastLoaded,
}

impl ChoiceReason {
    /// Every reason, in declaration order (the index of a reason's counter).
    pub const ALL: [ChoiceReason; 5] = [
        Self::Prefix,
        Self::Cohort,
        Self::Similar,
        Self::LoadSpill,
        Self::LeastLoaded,
    ];

    /// Lower-case name for metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Prefix => "prefix",
            Self::Cohort => "cohort",
            Self::Similar => "similar",
            Self::LoadSpill => "load_spill",
            Self::LeastLoaded => "least_loaded",
        }
    }
}

/// The policy's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    /// Replica index in `0..replicas`.
    pub replica: usize,
    /// Leading blocks of the request the chosen replica is believed to hold.
    pub matched_blocks: usize,
    /// Why.
    pub reason: ChoiceReason,
    /// The decision's ticket for progress reports ([`Policy::first_byte`],
    /// [`Policy::end`]); 0 when the request is not tracked or the book is full.
    pub ticket: u64,
}

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

#[derive(Debug, Clone, Copy, Default)]
struct Owners {
    primary: usize,
    secondary: Option<usize>,
}

/// The replica-choice policy (one per batcher shard).
#[derive(Debug)]
pub struct Policy {
    config: PolicyConfig,
    balance: f64,
    states: Vec<PrefixState>,
    loads: Vec<DecayingLoad>,
    assigned: Vec<u64>,
    owners: LruCache<u32, Owners>,
    decisions: u64,
    reasons: [u64; ChoiceReason::ALL.len()],
    mean_work: f64,
    in_flight: InFlight,
    available: Vec<bool>,
    /// Engine-reported queue (requests waiting) per replica, with when.
    queued: Vec<Option<(u32, u64)>>,
    /// Mean prefill work per request (live units), for engine queue reports.
    mean_prefill: f64,
    // Scratch buffers reused across decisions.
    matched: Vec<usize>,
    uses: Vec<u32>,
    work: Vec<f64>,
    prefill: Vec<f64>,
    projected: Vec<f64>,
    wait: Vec<f64>,
    rate: Vec<f64>,
}

/// A replica whose learnt rate is below this share of the fleet's mean is costed at its
/// own rate (see [`Policy::choose`]).
const SLOW_REPLICA: f64 = 0.5;

fn finite_or_zero(x: f64) -> f64 {
    if x.is_finite() {
        x.max(0.0)
    } else {
        0.0
    }
}

/// SplitMix64 finaliser: spreads a block hash (or id) over all 64 bits.
pub fn mix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub use cohort_fingerprint::shard::{shard_key, SHARD_KEY_DEPTH};

impl Policy {
    /// A policy with empty prefix states and zero loads.
    pub fn new(config: PolicyConfig) -> Self {
        let n = config.replicas.max(1);
        let balance = if config.balance.is_nan() {
            1.0
        } else {
            config.balance.max(1.0)
        };
        let cohorts = NonZeroUsize::new(config.max_cohorts.max(1)).unwrap_or(NonZeroUsize::MIN);
        Self {
            balance,
            states: (0..n)
                .map(|_| PrefixState::new(config.blocks_per_replica))
                .collect(),
            loads: vec![DecayingLoad::default(); n],
            assigned: vec![0; n],
            owners: LruCache::new(cohorts),
            decisions: 0,
            reasons: [0; ChoiceReason::ALL.len()],
            mean_work: config.per_request_work.max(1.0),
            in_flight: InFlight::new(n, config.ticket_ttl_ms, config.max_tickets),
            available: vec![true; n],
            queued: vec![None; n],
            mean_prefill: config.prefill_base_work.max(1.0),
            matched: vec![0; n],
            uses: vec![0; n],
            work: vec![0.0; n],
            prefill: vec![0.0; n],
            projected: vec![0.0; n],
            wait: vec![0.0; n],
            rate: vec![1.0; n],
            config,
        }
    }

    /// The settings it was built with.
    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    /// How the load estimate forgets work (from `drain_rate_per_s` / `load_half_life_ms`).
    fn decay(&self) -> Decay {
        match self.config.drain_rate_per_s {
            Some(r) if r.is_finite() && r > 0.0 => Decay::Drain(r / 1000.0),
            _ => Decay::HalfLife(self.config.load_half_life_ms),
        }
    }

    /// Number of replicas (at least 1).
    pub fn replicas(&self) -> usize {
        self.states.len()
    }

    /// The fleet's learnt prefill rate, work units (≈ prompt tokens) per ms: the mean of
    /// the replicas' rates from progress reports, or the configured default before any.
    pub fn prefill_rate_per_ms(&self) -> f64 {
        self.in_flight
            .mean_rate()
            .unwrap_or(self.config.default_rate_per_ms)
            .max(1e-6)
    }

    /// Chooses a replica for `req` and records the request there (prefix state, load,
    /// cohort owner). See the module documentation for the rule.
    pub fn choose(&mut self, req: &RouteRequest<'_>) -> Choice {
        let n = self.states.len();
        let blocks = req.blocks;
        let now = req.now_ms;
        let decay = self.decay();
        let ttl = self.config.report_ttl_ms;
        let cost = f64::from(req.cost);
        let per_req = if self.config.per_request_work.is_finite() {
            self.config.per_request_work.max(0.0)
        } else {
            0.0
        };

        let live = self.in_flight.is_live(now, self.config.live_window_ms);
        let base = finite_or_zero(self.config.prefill_base_work);
        let fleet_rate = self
            .in_flight
            .mean_rate()
            .unwrap_or(self.config.default_rate_per_ms)
            .max(1e-6);
        if live {
            for r in 0..n {
                // A replica's own rate counts when it is clearly slower than the fleet's
                // (below half of it); otherwise the fleet's, so the noise of single
                // samples does not move requests off their prefix.
                let own = self.in_flight.rate(r, fleet_rate);
                let rate = if own < SLOW_REPLICA * fleet_rate {
                    own
                } else {
                    fleet_rate
                };
                let backlog = self.in_flight.backlog(r, rate, now);
                self.wait[r] = backlog.max(self.engine_queue(r, now)) / rate;
                self.rate[r] = rate;
            }
        }
        let mut total = 0.0;
        let mut w_min = f64::INFINITY;
        let mut cost_min = f64::INFINITY;
        let any_available = self.available.iter().any(|&a| a);
        for r in 0..n {
            let (m, uses) = self.states[r].matched_uses(blocks, now);
            self.uses[r] = uses;
            let uncached = if blocks.is_empty() {
                cost
            } else {
                cost * (blocks.len() - m) as f64 / blocks.len() as f64
            };
            let w = uncached + per_req;
            let l = self.loads[r].effective_with(now, decay, ttl, self.mean_work);
            self.matched[r] = m;
            self.work[r] = w;
            self.prefill[r] = uncached + base;
            self.projected[r] = if live {
                self.wait[r] + (uncached + base) / self.rate[r]
            } else {
                l + w
            };
            total += l;
            w_min = w_min.min(w);
            if self.available[r] || !any_available {
                cost_min = cost_min.min(self.projected[r]);
            }
        }
        let bound = if live {
            // Live: the expected time to first token in work units (the queue a request
            // waits behind plus its own uncached prefill). A replica is eligible while
            // within `balance` of the best; among those the longest prefix wins.
            self.balance * cost_min + self.slack() * (cost + base) / fleet_rate
        } else {
            let mean = (total + w_min) / n as f64;
            let slack = if self.config.balance_slack.is_finite() {
                self.config.balance_slack.max(0.0)
            } else {
                f64::INFINITY
            };
            self.balance * mean + slack
        };
        let usable = |r: usize| self.available[r] || !any_available;

        let owners = req.cohort.and_then(|c| self.owners.get(&c).copied());
        // Where similar requests went: only while the cohort has no owner, and only among
        // replicas equal on prefix, owner and expected cost (see the module doc).
        let similar = req.similar.filter(|&r| owners.is_none() && r < n);
        let similar_rank = |r: usize| u8::from(similar == Some(r));
        let rank = |r: usize| -> u8 {
            match owners {
                Some(o) if o.primary == r => 2,
                Some(o) if o.secondary == Some(r) => 1,
                _ => 0,
            }
        };

        let start = (mix64(blocks.first().copied().unwrap_or(0)).wrapping_add(self.decisions)
            % n as u64) as usize;
        let mut best: Option<usize> = None;
        for i in 0..n {
            let r = (start + i) % n;
            if self.projected[r] > bound || !usable(r) {
                continue;
            }
            let better = match best {
                None => true,
                Some(b) => {
                    let (mr, mb) = (self.matched[r], self.matched[b]);
                    let (pr, pb) = (self.projected[r], self.projected[b]);
                    // Equal prefixes: on live load the expected wait decides, then the
                    // cache room (fewest blocks held), then the cohort owner: a new
                    // prefix on an idle fleet goes where it evicts least, not where its
                    // intent cohort went (same intent is not same prefix). On the
                    // estimate the owner decides first (differences of decayed work
                    // within the bound are history, not queue).
                    let room = self.states[b].len().cmp(&self.states[r].len());
                    let order = if live {
                        pb.total_cmp(&pr)
                            .then(room)
                            .then(rank(r).cmp(&rank(b)))
                            .then(similar_rank(r).cmp(&similar_rank(b)))
                    } else {
                        rank(r)
                            .cmp(&rank(b))
                            .then(pb.total_cmp(&pr))
                            .then(similar_rank(r).cmp(&similar_rank(b)))
                            .then(room)
                    };
                    mr > mb || (mr == mb && order.is_gt())
                }
            };
            if better {
                best = Some(r);
            }
        }
        let replica = match best {
            Some(r) => r,
            None => {
                let mut b: Option<usize> = None;
                for i in 0..n {
                    let r = (start + i) % n;
                    if usable(r) && b.is_none_or(|b| self.projected[r] < self.projected[b]) {
                        b = Some(r);
                    }
                }
                b.unwrap_or(start)
            }
        };

        let m = self.matched[replica];
        let best_m = self.matched.iter().copied().max().unwrap_or(0);
        let floor = self.matched.iter().copied().min().unwrap_or(0);
        let reason = if m == best_m && best_m > floor {
            ChoiceReason::Prefix
        } else if rank(replica) > 0 {
            ChoiceReason::Cohort
        } else if similar == Some(replica) {
            ChoiceReason::Similar
        } else if best_m > m
            || owners.is_some_and(|o| self.projected[o.primary] > bound || !usable(o.primary))
        {
            // A longer prefix, or the cohort's owner, was out of bounds (or down). An owner
            // within bounds that lost on the wait is not a spill.
            ChoiceReason::LoadSpill
        } else {
            ChoiceReason::LeastLoaded
        };

        if let Some(c) = req.cohort {
            let next = match owners {
                None => Owners {
                    primary: replica,
                    secondary: None,
                },
                Some(o) if o.primary == replica || o.secondary == Some(replica) => o,
                Some(o) => Owners {
                    primary: o.primary,
                    secondary: Some(replica),
                },
            };
            self.owners.put(c, next);
        }

        let w = self.work[replica];
        let prefill = self.prefill[replica];
        self.states[replica].record(blocks, now, now.saturating_add(req.resident_ms));
        self.loads[replica].add_with(w, now, decay);
        self.assigned[replica] += 1;
        self.decisions += 1;
        self.reasons[reason as usize] += 1;
        self.mean_work += (w - self.mean_work) / 64.0;
        // A mean over the decisions so far, then over the last 64 or so.
        self.mean_prefill += (prefill - self.mean_prefill) / (self.decisions.min(64) as f64);
        let ticket = if req.track {
            self.in_flight.open(replica, prefill, now)
        } else {
            0
        };

        Choice {
            replica,
            matched_blocks: m,
            reason,
            ticket,
        }
    }

    /// The live slack for the request just matched (`matched`, `uses`): the private one
    /// when its longest prefix, longer than some replica's, came with one request only.
    fn slack(&self) -> f64 {
        let best = self.matched.iter().copied().max().unwrap_or(0);
        let floor = self.matched.iter().copied().min().unwrap_or(0);
        let private = best > floor
            && self
                .matched
                .iter()
                .zip(&self.uses)
                .all(|(&m, &u)| m < best || u <= 1);
        finite_or_zero(if private {
            self.config.live_slack_private
        } else {
            self.config.live_slack
        })
    }

    /// A fresh engine-reported queue on `replica` in work units (`waiting × mean
    /// prefill`): work other batcher shards sent shows there; 0 when stale or absent.
    fn engine_queue(&self, replica: usize, now_ms: u64) -> f64 {
        match self.queued[replica] {
            Some((waiting, at)) if now_ms.saturating_sub(at) <= self.config.report_ttl_ms => {
                f64::from(waiting) * self.mean_prefill
            }
            _ => 0.0,
        }
    }

    /// The first response byte of `ticket`'s request went by, `elapsed_ms` after the
    /// decision.
    pub fn first_byte(&mut self, ticket: u64, elapsed_ms: u32, now_ms: u64) -> Option<Reported> {
        self.in_flight.first_byte(ticket, elapsed_ms, now_ms)
    }

    /// `ticket`'s request ended with `status` (0: none).
    pub fn end(&mut self, ticket: u64, status: u32, now_ms: u64) -> Option<Reported> {
        self.in_flight.end(ticket, status, now_ms)
    }

    /// Closes tickets whose reports never came.
    pub fn expire(&mut self, now_ms: u64) {
        self.in_flight.expire(now_ms);
    }

    /// Whether decisions may choose `replica` (its health). When none is available,
    /// decisions use all of them: a request routed somewhere beats one refused.
    pub fn set_available(&mut self, replica: usize, available: bool) {
        if let Some(a) = self.available.get_mut(replica) {
            *a = available;
        }
    }

    /// Engine-reported requests waiting (queued, not yet prefilling) on `replica`.
    pub fn report_engine_queue(&mut self, replica: usize, waiting: u32, now_ms: u64) {
        if let Some(q) = self.queued.get_mut(replica) {
            *q = Some((waiting, now_ms));
        }
    }

    /// Engine-reported requests in flight and queued on `replica` at `now_ms`; raises
    /// that replica's load while fresh. Returns false for an unknown replica.
    pub fn report_engine_load(
        &mut self,
        replica: usize,
        in_flight: u32,
        queued: u32,
        now_ms: u64,
    ) -> bool {
        match self.loads.get_mut(replica) {
            Some(l) => {
                l.report(in_flight.saturating_add(queued), now_ms);
                true
            }
            None => false,
        }
    }

    /// Whether every one of `blocks` counts as held on `replica` at `now_ms` (recorded
    /// within its cache TTL and not evicted from the modelled cache).
    pub fn holds(&self, replica: usize, blocks: &[u64], now_ms: u64) -> bool {
        self.states
            .get(replica)
            .is_some_and(|state| state.matched(blocks, now_ms) == blocks.len())
    }

    /// Whether the replicas differ on `blocks` at `now_ms`: some holds more of its leading
    /// blocks than another. When they do not (a cold prompt, or one whose only shared part
    /// is a trunk every replica holds), any replica serves it as well as another, so its
    /// decision can wait for those of the same burst that have a home (see
    /// `[policy] burst_order` in docs/BATCHER.md).
    /// Stops at the first replica that differs from the first one, and a cold prompt costs
    /// one look-up per replica.
    pub fn prefix_prefers_a_replica(&self, blocks: &[u64], now_ms: u64) -> bool {
        let mut matched = self.states.iter().map(|s| s.matched(blocks, now_ms));
        let first = matched.next().unwrap_or(0);
        matched.any(|m| m != first)
    }

    /// A warm-up computed `blocks` on `replica`: they count as held for `resident_ms`, as
    /// if a request had sent them (no load: the warm-up ran on idle capacity).
    pub fn warmed(&mut self, replica: usize, blocks: &[u64], now_ms: u64, resident_ms: u64) {
        if let Some(state) = self.states.get_mut(replica) {
            state.record(blocks, now_ms, now_ms.saturating_add(resident_ms));
        }
    }

    /// Assigned requests not ended on each replica (from the filters' progress reports).
    pub fn in_flight(&self) -> Vec<u32> {
        (0..self.states.len())
            .map(|r| self.in_flight.replica(r).in_flight)
            .collect()
    }

    /// Per-replica load, prefix-state size and evictions, and decision counts, at `now_ms`.
    pub fn snapshot(&self, now_ms: u64) -> PolicySnapshot {
        let decay = self.decay();
        let ttl = self.config.report_ttl_ms;
        PolicySnapshot {
            replicas: (0..self.states.len())
                .map(|r| ReplicaSnapshot {
                    load: self.loads[r].effective_with(now_ms, decay, ttl, self.mean_work),
                    blocks_held: self.states[r].len(),
                    evictions: self.states[r].evictions(),
                    assigned: self.assigned[r],
                    in_flight: self.in_flight.replica(r).in_flight,
                    pending_work: self.in_flight.replica(r).pending_work,
                    available: self.available[r],
                })
                .collect(),
            reasons: self.reasons,
            cohorts: self.owners.len(),
            live: self.in_flight.is_live(now_ms, self.config.live_window_ms),
            tickets_expired: self.in_flight.expired(),
        }
    }
}
