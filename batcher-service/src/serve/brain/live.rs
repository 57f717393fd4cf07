//! What reaches the replica choice from outside, besides the decisions themselves: the
//! policy takes each as an input ([`cohort_batcher_core::policy`]).
//!
//! - **Progress reports** from the filter (first byte, end, under the decision's ticket)
//!   keep the policy's in-flight book exact ([`cohort_batcher_core::policy::in_flight`]);
//!   an end with a 5xx holds the replica out of decisions for a while
//!   ([`cohort_batcher_core::policy::health`]); each first byte's time also joins its
//!   replica's recent times to first byte, for the inspector ([`super::replica_stats`]);
//! - **Probes**: a replica whose probe fails is not chosen until it answers again; each
//!   probe's time and result are kept for the inspector;
//! - **Engine queues**: each probe's scrape of the engine's metrics (requests waiting)
//!   raises the pending prefill of that replica when the engine is further behind than
//!   this batcher's own book shows (other shards' work).

use super::{lock, Brain};
use crate::fleet::EngineEvents;
use cohort_batcher_core::engines::EngineMetrics;
use cohort_proto as pb;
use pb::request_progress::Phase;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counts of the progress reports received.
#[derive(Default)]
pub struct ProgressCounters {
    pub first_byte: AtomicU64,
    pub end: AtomicU64,
    /// Reports under a ticket this batcher does not hold (expired, or another batcher's).
    pub unknown: AtomicU64,
    /// Ends with a 5xx status.
    pub server_errors: AtomicU64,
}

impl Brain {
    /// One progress report from a filter.
    pub(super) fn progress(&self, progress: &pb::RequestProgress, now_ms: u64) {
        let c = &self.progress_counters;
        match progress.phase() {
            Phase::FirstByte => {
                self.audit
                    .progress(progress.ticket, Some(progress.elapsed_ms), None)
            }
            Phase::End => self.audit.progress(
                progress.ticket,
                None,
                Some((progress.status, progress.elapsed_ms)),
            ),
            Phase::Unspecified => {}
        }
        let reported = match progress.phase() {
            Phase::FirstByte => {
                c.first_byte.fetch_add(1, Ordering::Relaxed);
                lock(&self.policy).first_byte(progress.ticket, progress.elapsed_ms, now_ms)
            }
            Phase::End => {
                c.end.fetch_add(1, Ordering::Relaxed);
                lock(&self.policy).end(progress.ticket, progress.status, now_ms)
            }
            Phase::Unspecified => return,
        };
        let Some(reported) = reported else {
            c.unknown.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if progress.phase() == Phase::FirstByte {
            lock(&self.replica_stats).first_byte(reported.replica, progress.elapsed_ms, now_ms);
        }
        if reported.status.is_some_and(|status| status >= 500) {
            c.server_errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The engine probes' news, for the replica choice.
impl EngineEvents for Brain {
    fn engine_probed(&self, replica: usize, up: bool) {
        lock(&self.replica_stats).probed(replica, up, self.clock.now_ms());
    }

    fn engine_down(&self, replica: usize) {
        lock(&self.policy).probe(replica, false);
    }

    fn engine_up(&self, replica: usize) {
        lock(&self.policy).probe(replica, true);
    }

    fn engine_metrics(&self, replica: usize, metrics: &EngineMetrics) {
        let now = self.clock.now_ms();
        let waiting = metrics.waiting.unwrap_or(0.0).max(0.0) as u32;
        let running = metrics.running.unwrap_or(0.0).max(0.0) as u32;
        let mut policy = lock(&self.policy);
        policy.report_engine_queue(replica, waiting, now);
        policy.report_engine_load(replica, running, waiting, now);
    }
}
