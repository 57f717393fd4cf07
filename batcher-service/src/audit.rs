//! The per-request cost audit: what the layer did with one request, and what it cost.
//!
//! An operator asks "what did request X cost, and did Cohort help it". The key is the
//! request id Envoy already puts on every request (`x-request-id`), which the filter
//! passes to the batcher on `Assign`. Three parts of `cohort serve` fill a record:
//!
//! - the brain, at `Assign`: mode, cohort, replica, why that replica, the prefix blocks
//!   matched there out of the prompt's, and from those the estimated prompt tokens, the
//!   tokens the replica should find cached, and the prefill that leaves (at the fleet's
//!   learnt prefill rate, the same calibration the policy decides with);
//! - the filter's progress reports: time to first byte, total time, status;
//! - the batch front (batch mode): the batch role (leader, follower, direct), the replica
//!   that actually answered, and whether a warm-up served it.
//!
//! Bounded memory: the most recent `audit_max_records` requests per batcher (default
//! 65,536; least recently written evicted; 0 turns the audit off), a few
//! hundred bytes each. Tenant-scoped: a record is keyed by a hash of its tenant and found
//! only with that tenant, so one tenant cannot read another's requests by guessing ids.
//! Never any prompt text: only hashes, counts and names.

use lru::LruCache;
use serde::Serialize;
use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Mutex;

/// What the layer did with one request.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AuditRecord {
    pub request_id: String,
    /// `assign` or `batch` (the filter's mode).
    pub mode: String,
    /// The batcher's cohort id (hex), empty when the request had no sketch.
    pub cohort: String,
    /// The replica the batcher chose.
    pub replica: String,
    /// Why: `prefix`, `cohort`, `load_spill`, `least_loaded`.
    pub reason: String,
    /// Prefix blocks of the prompt, and how many the chosen replica was believed to hold.
    pub prefix_blocks: u32,
    pub matched_blocks: u32,
    /// Prompt tokens (estimated from the canonical prompt's bytes), of which the matched
    /// prefix should be served from cache.
    pub prompt_tokens_est: u64,
    pub cached_tokens_est: u64,
    /// The prefill the uncached tokens cost at the fleet's learnt rate, ms.
    pub prefill_ms_est: f64,
    /// Batch mode: `leader`, `follower` or `direct`, as the front sent it.
    pub batch_role: Option<String>,
    /// Batch mode: the replica that answered (another one after a failover).
    pub answered_by: Option<String>,
    /// Batch mode: a warm-up of its cohort chose its replica.
    pub warmed: Option<bool>,
    /// Why the filter passed the request through (`holdout`, `breaker_open`,
    /// `invalid_json`, …); the routing fields are then empty.
    pub bypass: Option<String>,
    /// From the filter's progress reports (assign and batch mode).
    pub status: Option<u32>,
    pub first_byte_ms: Option<u32>,
    pub total_ms: Option<u32>,
}

/// A record's key: its tenant's hash and the request id.
type Key = (u64, String);

fn key(tenant: &str, request_id: &str) -> Key {
    (
        xxhash_rust::xxh3::xxh3_64(tenant.as_bytes()),
        request_id.to_owned(),
    )
}

struct Inner {
    records: LruCache<Key, AuditRecord>,
    /// Assign tickets of records still waiting for progress reports.
    tickets: HashMap<u64, Key>,
}

/// The audit records of one batcher.
pub struct AuditLog {
    inner: Mutex<Inner>,
    enabled: bool,
}

impl AuditLog {
    /// A log of at most `capacity` records; 0: the audit is off (nothing is kept).
    pub fn new(capacity: usize) -> AuditLog {
        AuditLog {
            inner: Mutex::new(Inner {
                records: LruCache::new(NonZeroUsize::new(capacity.max(1)).expect("at least 1")),
                tickets: HashMap::new(),
            }),
            enabled: capacity > 0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The brain's record of an Assign decision (`ticket` 0: no progress will come).
    pub fn assigned(&self, tenant: &str, record: AuditRecord, ticket: u64) {
        if record.request_id.is_empty() || !self.enabled {
            return;
        }
        let key = key(tenant, &record.request_id);
        let mut inner = self.lock();
        if ticket != 0 {
            inner.tickets.insert(ticket, key.clone());
        }
        inner.records.push(key, record);
        // Tickets whose records were evicted or never ended: pruned past twice the
        // records' capacity.
        let cap = inner.records.cap().get();
        if inner.tickets.len() > 2 * cap {
            let Inner { records, tickets } = &mut *inner;
            tickets.retain(|_, key| records.contains(key));
        }
    }

    /// A request the filter passed through, and why.
    pub fn bypassed(&self, tenant: &str, request_id: &str, mode: &str, reason: &str) {
        let record = AuditRecord {
            request_id: request_id.to_owned(),
            mode: mode.to_owned(),
            bypass: Some(reason.to_owned()),
            ..AuditRecord::default()
        };
        self.assigned(tenant, record, 0);
    }

    /// A progress report under `ticket`: the first byte, or the end with its status.
    pub fn progress(&self, ticket: u64, first_byte_ms: Option<u32>, end: Option<(u32, u32)>) {
        let mut inner = self.lock();
        let Some(key) = inner.tickets.get(&ticket).cloned() else {
            return;
        };
        if let Some(record) = inner.records.peek_mut(&key) {
            if first_byte_ms.is_some() {
                record.first_byte_ms = first_byte_ms;
            }
            if let Some((status, total_ms)) = end {
                record.status = Some(status);
                record.total_ms = Some(total_ms);
            }
        }
        if end.is_some() {
            inner.tickets.remove(&ticket);
        }
    }

    /// The batch front's part: how it sent the request and who answered.
    pub fn front(
        &self,
        tenant: &str,
        request_id: &str,
        role: &str,
        answered_by: &str,
        warmed: bool,
    ) {
        if !self.enabled {
            return;
        }
        let key = key(tenant, request_id);
        let mut inner = self.lock();
        if let Some(record) = inner.records.peek_mut(&key) {
            record.batch_role = Some(role.to_owned());
            record.answered_by = Some(answered_by.to_owned());
            record.warmed = Some(warmed);
        }
    }

    /// The record of `request_id`, if it was made for `tenant`.
    pub fn get(&self, tenant: &str, request_id: &str) -> Option<AuditRecord> {
        self.lock().records.peek(&key(tenant, request_id)).cloned()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().records.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> AuditRecord {
        AuditRecord {
            request_id: id.into(),
            mode: "assign".into(),
            replica: "r0".into(),
            ..AuditRecord::default()
        }
    }

    #[test]
    fn records_are_found_only_with_their_tenant() {
        let log = AuditLog::new(8);
        log.assigned("tenant-a", record("req-1"), 7);
        assert_eq!(log.get("tenant-a", "req-1").unwrap().replica, "r0");
        assert_eq!(log.get("tenant-b", "req-1"), None);
        assert_eq!(log.get("tenant-a", "req-2"), None);
        // No id, no record.
        log.assigned("tenant-a", record(""), 8);
        assert_eq!(log.len(), 1);
    }

    #[test]
    fn progress_and_the_front_complete_a_record() {
        let log = AuditLog::new(8);
        log.assigned("t", record("req-1"), 7);
        log.progress(7, Some(120), None);
        log.progress(7, None, Some((200, 900)));
        log.front("t", "req-1", "follower", "r1", false);
        let r = log.get("t", "req-1").unwrap();
        assert_eq!(
            (r.first_byte_ms, r.status, r.total_ms),
            (Some(120), Some(200), Some(900))
        );
        assert_eq!(r.batch_role.as_deref(), Some("follower"));
        assert_eq!(r.answered_by.as_deref(), Some("r1"));
        // The ticket is done: a late report changes nothing.
        log.progress(7, None, Some((500, 1)));
        assert_eq!(log.get("t", "req-1").unwrap().status, Some(200));
        // Another tenant's front report does not touch it.
        log.front("other", "req-1", "leader", "r2", true);
        assert_eq!(
            log.get("t", "req-1").unwrap().batch_role.as_deref(),
            Some("follower")
        );
    }

    #[test]
    fn a_bypass_is_recorded_with_its_reason() {
        let log = AuditLog::new(8);
        log.bypassed("t", "req-9", "assign", "holdout");
        let r = log.get("t", "req-9").unwrap();
        assert_eq!(r.bypass.as_deref(), Some("holdout"));
        assert_eq!(r.replica, "");
        assert_eq!(log.get("u", "req-9"), None);
    }

    #[test]
    fn capacity_zero_keeps_nothing() {
        let log = AuditLog::new(0);
        log.assigned("t", record("req-1"), 1);
        assert_eq!(log.get("t", "req-1"), None);
        assert_eq!(log.len(), 0);
    }

    #[test]
    fn memory_is_bounded() {
        let log = AuditLog::new(100);
        for i in 0..10_000u64 {
            log.assigned("t", record(&format!("req-{i}")), i + 1);
        }
        assert_eq!(log.len(), 100);
        assert!(log.get("t", "req-9999").is_some());
        assert!(log.get("t", "req-0").is_none());
        assert!(log.lock().tickets.len() <= 200);
    }
}
