//! What a decision reads from the stores, timed and counted.
//!
//! An Assign with a sketch makes two store queries before the policy chooses:
//! 1. **cohorts**: the nearest cohort centroids of the request's tenant and semantic mode
//!    (`Cohorts::locate`, a top-k on the centroid store). It gives the request's cohort and
//!    the cohorts a neighbour search probes;
//! 2. **neighbours**: the probed cohorts' recent members (`Neighbours`) re-ranked exactly
//!    on the fingerprint store (`Store::top_k_among`), or with `neighbour_search = "exact"`
//!    a top-k scan of every fingerprint of the tenant; the replicas that served the most
//!    similar of them vote for one (`neighbours::vote`), which the policy uses where the
//!    cohort has no owner yet, to break ties after the expected cost (reason `similar`;
//!    `policy/mod.rs`, rule 3). The recent members are the default:
//!    their cost does not grow with the store (an exact scan of a million fingerprints
//!    takes milliseconds on a CPU), and they say where similar requests went lately, which
//!    is where a cache may still hold their prefix.
//!
//! Both stores are of the kind `--store` chose, so with `--store gpu` the centroid search
//! runs on the device. Each query's count and time are exported
//! (`cohort_store_queries_total{query}`, `cohort_store_query_seconds_total{query}`), so the
//! share of an Assign spent in the stores is a ratio of two rates.

use super::{lock, read, secs, Brain};
use crate::config::NeighbourSearch;
use cohort_batcher_core::neighbours;
use cohort_batcher_core::store::{SketchBytes, Store};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Nearest past fingerprints that vote for a replica.
const NEIGHBOURS_K: usize = 8;

/// The store queries a decision makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Query {
    Cohorts = 0,
    Neighbours = 1,
}

impl Query {
    pub(super) const ALL: [Query; 2] = [Query::Cohorts, Query::Neighbours];

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Query::Cohorts => "cohorts",
            Query::Neighbours => "neighbours",
        }
    }
}

/// Store queries made and the time spent in them, per [`Query`].
#[derive(Default)]
pub(super) struct StoreReads {
    queries: [AtomicU64; 2],
    nanos: [AtomicU64; 2],
}

impl StoreReads {
    fn count(&self, query: Query, started: Instant) {
        let i = query as usize;
        self.queries[i].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.nanos[i].fetch_add(nanos, Ordering::Relaxed);
    }

    pub(super) fn queries(&self, query: Query) -> u64 {
        self.queries[query as usize].load(Ordering::Relaxed)
    }

    pub(super) fn seconds(&self, query: Query) -> f64 {
        self.nanos[query as usize].load(Ordering::Relaxed) as f64 / 1e9
    }
}

/// The space a sketch is compared in: its tenant and semantic mode (sketches of different
/// modes are not comparable, so their cohorts and neighbours never mix). The default mode,
/// `intent` (or unspecified), is the tenant's hash alone, the space the inspector's
/// playground looks in.
pub(crate) fn space(tenant: &str, semantic_mode: i32) -> u32 {
    const UNSPECIFIED: i32 = cohort_proto::SemanticMode::Unspecified as i32;
    const INTENT: i32 = cohort_proto::SemanticMode::Intent as i32;
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    hasher.update(tenant.as_bytes());
    if !matches!(semantic_mode, UNSPECIFIED | INTENT) {
        hasher.update(&[0xff]);
        hasher.update(&semantic_mode.to_le_bytes());
    }
    hasher.digest() as u32
}

/// Totals of [`StoreReads`] (the decision-path benchmark reads them).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReadTotals {
    pub queries: u64,
    pub seconds: f64,
}

/// What the stores say of one request.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Lookup {
    /// Its cohort, when one is within the threshold.
    pub cohort: Option<u32>,
    /// The replica the most similar past requests went to.
    pub similar: Option<usize>,
}

impl Brain {
    /// The request's cohort and similar replica (see the module doc).
    pub(super) fn lookup(
        &self,
        space: u32,
        sketch: &SketchBytes,
        threshold: f32,
        now_ms: u64,
    ) -> Lookup {
        let now_s = secs(now_ms);
        let started = Instant::now();
        let (membership, probes) = read(&self.cohorts).locate(space, sketch, threshold, now_s);
        self.reads.count(Query::Cohorts, started);
        // One look at the lists: whether the search is on, and the recent members to rank.
        let (off, keys) = {
            let lists = lock(&self.neighbours);
            (lists.per_cohort() == 0, lists.candidates(&probes))
        };
        let hits = match self.neighbour_search {
            _ if off => Vec::new(),
            NeighbourSearch::Recent => {
                if keys.is_empty() {
                    Vec::new()
                } else {
                    let started = Instant::now();
                    let hits = self
                        .store
                        .top_k_among(space, sketch, &keys, NEIGHBOURS_K, now_s);
                    self.reads.count(Query::Neighbours, started);
                    hits
                }
            }
            NeighbourSearch::Exact => {
                let started = Instant::now();
                let hits = self.store.top_k(space, sketch, NEIGHBOURS_K, now_s);
                // The vote needs the hits' sketches (their norms): a look-up each.
                let keys: Vec<u64> = hits.iter().map(|h| h.key).collect();
                let hits = self
                    .store
                    .top_k_among(space, sketch, &keys, NEIGHBOURS_K, now_s);
                self.reads.count(Query::Neighbours, started);
                hits
            }
        };
        let similar =
            neighbours::vote(sketch, &hits, threshold, super::read(&self.members).slots());
        Lookup {
            cohort: membership.map(|m| m.cohort),
            similar,
        }
    }

    /// Store queries made by decisions and the seconds spent in them, all kinds together.
    pub(crate) fn store_reads(&self) -> ReadTotals {
        ReadTotals {
            queries: Query::ALL.iter().map(|&q| self.reads.queries(q)).sum(),
            seconds: Query::ALL.iter().map(|&q| self.reads.seconds(q)).sum(),
        }
    }

    /// Batched scans the two stores ran and the queries they answered, together.
    pub(crate) fn store_scans(&self) -> (u64, u64) {
        let (centroid_scans, centroid_queries) = read(&self.cohorts).store().scans();
        let (scans, queries) = self.store.scans();
        (centroid_scans + scans, centroid_queries + queries)
    }

    /// What the stores are: `cpu`, or the GPU store's description.
    pub(crate) fn store_description(&self) -> &str {
        &self.store_description
    }

    /// Memory the fingerprint store holds.
    pub(crate) fn store_bytes(&self) -> u64 {
        self.store.stats().bytes
    }

    /// Record an observed fingerprint (stored under `key`) as the newest member of its
    /// cohort's list.
    pub(super) fn remember(&self, cohort: u32, key: u64) {
        lock(&self.neighbours).record(cohort, key);
    }

    /// Drop the lists of cohorts that expired.
    pub(super) fn forget_expired_cohorts(&self) {
        let cohorts = read(&self.cohorts);
        lock(&self.neighbours).retain(|c| cohorts.contains(c));
    }
}
