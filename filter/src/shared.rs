//! What the root context hands every HTTP context of its VM ([`Shared`]): the
//! configuration, the stats, the per-group response stats, the observation outbox, this
//! VM's side of the breaker, the learned table's key and the batcher shards' gRPC targets;
//! and the host clock in Unix milliseconds ([`unix_ms`]).
//!
//! `root` builds it (once per configuration) and `http` reads it; neither needs the other
//! for it.

use crate::batcher::Outbox;
use crate::breaker::{self, Window};
use crate::config::FilterConfig;
use crate::response_stats::ResponseStats;
use crate::stats::{Sampler, Stats};
use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

/// This VM's side of the breaker.
#[derive(Default)]
pub struct BreakerLocal {
    /// The state as last read from the shared breaker.
    pub state: breaker::State,
    /// Outcomes recorded since the last fold.
    pub pending: Window,
    /// The shared-data key (one breaker per plugin).
    pub key: String,
    /// When the root context next folds `pending` into the shared breaker.
    pub next_sync_ms: u64,
}

/// What every HTTP context of this VM shares.
pub struct Shared {
    /// The configuration, or why it was refused (then everything passes through).
    pub config: Result<FilterConfig, String>,
    /// `None` only if the host refused to define metrics; requests still flow.
    pub stats: Option<Stats>,
    /// The per-group response stats; `None` with an invalid configuration or no stats.
    pub response_stats: Option<ResponseStats>,
    /// Which fingerprinted requests are timed for the histograms.
    pub histogram_sampler: Sampler,
    /// Which counted requests' responses are timed for the response stats' histograms
    /// (the same rate, its own sequence).
    pub response_sampler: Sampler,
    /// Observations waiting for the root context to send them, per batcher shard.
    pub outbox: RefCell<Outbox>,
    pub breaker: RefCell<BreakerLocal>,
    /// The shared-data key of the learned cohorts' table (one per plugin).
    pub learned_key: String,
    /// The gRPC call target of each batcher shard, as `batcher_clusters` lists them
    /// ([`crate::grpc_target`]), worked out once per configuration.
    pub batcher_targets: Vec<String>,
}

/// Milliseconds since the Unix epoch from the host's clock.
pub fn unix_ms(now: SystemTime) -> u64 {
    now.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
