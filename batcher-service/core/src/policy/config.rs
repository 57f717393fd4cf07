//! The policy's settings, with the defaults `cohort serve` starts from (each is a
//! `[policy]` key, docs/BATCHER.md).

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
    /// exact pending prefill work per replica ([`super::in_flight`]) instead of the estimate.
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
