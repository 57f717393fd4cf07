//! The live load of assign mode: what reaches the replica choice besides the decisions
//! themselves.
//!
//! - **Progress reports** from the filter (first byte, end, under the decision's ticket)
//!   keep the policy's in-flight book exact ([`cohort_batcher_core::policy::in_flight`]);
//! - **Health**: a replica whose probe fails, or that answered a request with a 5xx, is not
//!   chosen: until its probe answers again, or for [`ERROR_HOLD_MS`] after the last 5xx
//!   (a success of a request decided after that 5xx clears it at once);
//! - **Engine queues**: each probe's scrape of the engine's metrics (requests waiting)
//!   raises the pending prefill of that replica when the engine is further behind than
//!   this batcher's own book shows (other shards' work).

use super::{lock, Brain};
use crate::engines::EngineEvents;
use cohort_batcher_core::engines::EngineMetrics;
use cohort_batcher_core::policy::Policy;
use cohort_proto as pb;
use pb::request_progress::Phase;
use std::sync::atomic::{AtomicU64, Ordering};

/// How long a replica that answered 5xx is left out of decisions, ms.
pub const ERROR_HOLD_MS: u64 = 5_000;

/// Per replica: what says it should not be chosen.
#[derive(Debug, Default)]
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

    pub fn available(&self, replica: usize, now_ms: u64) -> bool {
        !self.probe_down[replica] && now_ms >= self.error_until_ms[replica]
    }

    /// Tells the policy which replicas it may choose now.
    pub fn apply(&self, policy: &mut Policy, now_ms: u64) {
        for r in 0..self.probe_down.len() {
            policy.set_available(r, self.available(r, now_ms));
        }
    }
}

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
        let Some(status) = reported.status else {
            return;
        };
        let mut health = lock(&self.health);
        let r = reported.replica;
        if status >= 500 {
            c.server_errors.fetch_add(1, Ordering::Relaxed);
            health.error_until_ms[r] = now_ms + ERROR_HOLD_MS;
            health.error_at_ms[r] = now_ms;
        } else if status > 0 && reported.opened_ms > health.error_at_ms[r] {
            // Decided after the last 5xx and answered: the replica works again. (A success
            // of a request already in flight at the 5xx says nothing new.)
            health.error_until_ms[r] = 0;
        }
    }
}

/// The engine probes' news, for the replica choice.
impl EngineEvents for Brain {
    fn engine_down(&self, replica: usize) {
        if let Some(down) = lock(&self.health).probe_down.get_mut(replica) {
            *down = true;
        }
    }

    fn engine_up(&self, replica: usize) {
        if let Some(down) = lock(&self.health).probe_down.get_mut(replica) {
            *down = false;
        }
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
