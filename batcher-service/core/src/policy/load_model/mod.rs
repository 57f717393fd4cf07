//! The two cost models of the replica choice, behind one trait.
//!
//! For one request, every replica `r` gets a [`Candidate`]: how much of the prompt it
//! holds (`matched`), the uncached part it would prefill, and its projected cost `P_r`.
//! What `P_r` means, how far above the cheapest replica a replica may be and still be
//! chosen (the *bound*), and how replicas equal on prefix are ordered depend on what the
//! policy knows of the load:
//!
//! - [`live::LiveLoad`]: the filters' progress reports are arriving, so the policy knows
//!   each replica's queue of prefill work exactly: `P_r` is an expected time to first
//!   token, in ms;
//! - [`estimated::EstimatedLoad`]: no reports, so the policy knows only the work it
//!   assigned, decaying with time: `P_r` is that load plus the request's own work.
//!
//! [`super::Policy::choose`] asks [`LoadModel`] these three questions and nothing else
//! differs between the two models.

pub mod estimated;
pub mod live;

use std::cmp::Ordering;

/// What one replica would be for the request being decided.
#[derive(Debug, Clone, Copy, Default)]
pub struct Candidate {
    /// Leading blocks of the request this replica holds.
    pub matched: usize,
    /// Requests that brought the last matched block here (1: a private prefix).
    pub uses: u32,
    /// The estimated model's work: the uncached prompt + `per_request_work`.
    pub work: f64,
    /// The estimated model's load: decaying assigned work, raised by engine reports.
    pub load: f64,
    /// The live model's prefill work: the uncached prompt + `prefill_base_work`.
    pub prefill: f64,
    /// `P_r`, the model's projected cost.
    pub projected: f64,
    /// Whether a decision may choose it (health; all are when none is).
    pub usable: bool,
    /// Blocks in its prefix state (its cache room: fewer is more).
    pub blocks_held: usize,
    /// 2: the request's cohort's primary owner, 1: its secondary, 0: neither.
    pub owner_rank: u8,
    /// 1: the replica the most similar past requests went to (while the cohort has no
    /// owner), else 0.
    pub similar_rank: u8,
}

/// What the bound of one decision is computed from.
#[derive(Debug, Clone, Copy)]
pub struct Fleet {
    /// The balance knob (≥ 1).
    pub balance: f64,
    /// Replicas.
    pub replicas: usize,
    /// The least projected cost among usable replicas.
    pub cheapest: f64,
    /// Σ of the replicas' estimated load.
    pub total_load: f64,
    /// The least estimated work of the request on any replica.
    pub least_work: f64,
    /// The request's prompt size, in `cost` units.
    pub cost: f64,
    /// Whether the request's longest prefix is private (one earlier request brought it).
    pub private_prefix: bool,
}

/// One way of costing replicas for a request (see the module doc).
pub trait LoadModel {
    /// `P_r` of the candidate on replica `replica`.
    fn projected(&self, replica: usize, candidate: &Candidate) -> f64;

    /// The greatest `P_r` a replica may have and still be chosen for its prefix.
    fn bound(&self, fleet: &Fleet) -> f64;

    /// Between two replicas holding equally much of the prompt: `Greater` when `r` should
    /// be chosen over `b`.
    fn order_equal_prefixes(&self, r: &Candidate, b: &Candidate) -> Ordering;
}

/// A non-finite or negative number as 0.
pub(crate) fn finite_or_zero(x: f64) -> f64 {
    if x.is_finite() {
        x.max(0.0)
    } else {
        0.0
    }
}
