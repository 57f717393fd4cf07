//! What the front sends on its own, beside callers' requests: warm-ups of predicted cohorts
//! (at a leader's first byte, on the predicted cohort's owner replica when it has idle
//! capacity; tracked, so a drain waits for them, and none starts while draining) and LoRA
//! adapter loads (before the first request that needs one).

use super::{lock, Front};
use axum::body::Bytes;
use axum::http::Method;
use cohort_batcher_core::batch::Release;
use cohort_batcher_core::engines::{warmup_body, LoraAdapter, Member};
use cohort_batcher_core::predict::PrefetchPolicy;
use cohort_fingerprint::knobs::Prefetch;
use serde_json::Value;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tracing::warn;

/// What a leader's prefetch needs.
#[derive(Clone)]
pub(super) struct WarmPlan {
    pub tenant_hash: u64,
    pub cohort: u64,
    pub level: Prefetch,
    pub salt: Option<String>,
    /// A replica no warm-up goes to: the one about to prefill the request that triggered
    /// the plan, when the plan runs before that request's first byte.
    pub avoid: Option<usize>,
    /// Assign mode: how long a warmed prefix counts as held (the triggering request's
    /// `x-cohort-cache-ttl`), seconds.
    pub resident_s: u32,
}

/// Assign mode's view of the fleet, which the front's own books do not have: the
/// batcher's (`serve::brain`).
pub trait LiveFleet: Send + Sync {
    /// Assigned requests in flight per replica (the filters' progress reports).
    fn in_flight(&self) -> Vec<u32>;
    /// Whether `blocks` all count as held on `replica` now (within their cache TTL).
    fn holds(&self, replica: usize, blocks: &[u64]) -> bool;
    /// A warm-up computed `blocks` on `replica`: they count as held for `resident_s`.
    fn warmed(&self, replica: usize, blocks: &[u64], resident_s: u32);
}

/// How the replicas' state is known, for the idle guard.
#[derive(Clone, Copy)]
pub(super) enum Busy<'a> {
    /// Batch mode: the front's own books (slots, requests in flight), which see all the
    /// traffic.
    FrontBooks,
    /// Assign mode, where the front sees none of it: the batcher's books.
    Live(&'a Arc<dyn LiveFleet>),
}

impl Front {
    /// Warms the cohorts predicted to follow this one, on their owner replicas, when
    /// those have idle capacity (the level's idle guard). Called at the leader's first
    /// byte, so its own prefill is never slowed by a warm-up on the same replica.
    pub(super) fn warm_predicted(self: &Arc<Self>, parsed: &WarmPlan, busy: Busy<'_>) {
        let Some(policy) = PrefetchPolicy::of(parsed.level) else {
            return;
        };
        if self.is_draining() {
            return;
        }
        let now = self.clock.now_ms();
        let mut in_flight: Option<Vec<u32>> = None;
        for (prediction, exemplar) in
            self.prefetch
                .plan(parsed.tenant_hash, parsed.cohort, now, policy)
        {
            let replica = exemplar.replica;
            let target = &self.engines[replica];
            if !target.is_healthy() {
                continue;
            }
            if parsed.avoid == Some(replica) {
                continue;
            }
            let slot = if let Busy::Live(live) = busy {
                // A prefix still held within its cache TTL needs no warm-up: the TTL is
                // what decides when prefetch warms it again.
                if !exemplar.blocks.is_empty() && live.holds(replica, &exemplar.blocks) {
                    continue;
                }
                let in_flight = in_flight.get_or_insert_with(|| live.in_flight());
                // Nothing queued at the engine, and the level's idle slots free (on an
                // engine without slots, fewer than 4 × the guard in flight, as below).
                let Some(running) = in_flight.get_mut(replica) else {
                    continue;
                };
                let count = *running as usize;
                // This plan's own warm-ups count too (the brain's book does not see them).
                *running = running.saturating_add(1);
                let running = count;
                let queued = target.metrics().waiting.unwrap_or(0.0) > 0.0;
                let full = if target.engine.release() == Release::SameSlot {
                    running + policy.idle_slots > lock(&self.slots).slots(replica)
                } else {
                    running >= 4 * policy.idle_slots
                };
                if queued || full {
                    continue;
                }
                None
            } else if target.engine.release() == Release::SameSlot {
                let mut slots = lock(&self.slots);
                if slots.holds(replica, prediction.cohort)
                    || slots.idle_slots(replica) < policy.idle_slots
                {
                    continue;
                }
                Some(slots.pick(replica, prediction.cohort, now))
            } else {
                let waiting = target.metrics().waiting.unwrap_or(0.0);
                if waiting > 0.0 || target.in_flight() >= 4 * policy.idle_slots {
                    continue;
                }
                None
            };
            self.prefetch.issued(prediction.cohort, replica, now);
            // Assign mode: once the warm-up is answered, its prefix counts as held there
            // for the request's TTL (a failed one records nothing, so it is tried again).
            let held = match busy {
                Busy::Live(live) => Some((Arc::clone(live), exemplar.blocks.clone())),
                Busy::FrontBooks => None,
            };
            let resident_s = parsed.resident_s;
            let mut body = warmup_body(exemplar.api, &exemplar.body);
            target.engine.prepare(
                &mut body,
                &Member {
                    salt: parsed.salt.as_deref(),
                    slot,
                },
            );
            let adapter = self
                .lora
                .needed(body.get("model").and_then(Value::as_str), prediction.cohort)
                .cloned();
            let front = Arc::clone(self);
            let cohort = prediction.cohort;
            let api = exemplar.api;
            self.spawn_background(async move {
                if let Some(adapter) = adapter {
                    front.ensure_lora(replica, &adapter).await;
                }
                if let Some(s) = slot {
                    lock(&front.slots).started(replica, s);
                }
                let target = &front.engines[replica];
                let result = front
                    .engines
                    .upstream()
                    .call(
                        Method::POST,
                        &target.base,
                        api.path(),
                        Some(Bytes::from(serde_json::to_vec(&body).unwrap_or_default())),
                        Duration::from_secs(60),
                    )
                    .await;
                if let Some(s) = slot {
                    lock(&front.slots).finished(replica, s, front.clock.now_ms());
                }
                if !matches!(result, Ok((200..=299, _))) {
                    front.prefetch.failed(cohort);
                } else if let Some((live, blocks)) = held {
                    live.warmed(replica, &blocks, resident_s);
                }
            });
        }
    }

    /// Loads `adapter` on `replica` unless it is there (engines that load at run time).
    pub(super) async fn ensure_lora(&self, replica: usize, adapter: &LoraAdapter) {
        if self.lora.is_loaded(replica, adapter) {
            return;
        }
        let target = &self.engines[replica];
        let Some(call) = target.engine.lora_load(adapter) else {
            return;
        };
        let body = Bytes::from(call.body.to_string());
        let result = self
            .engines
            .upstream()
            .call(
                Method::POST,
                &target.base,
                call.path,
                Some(body),
                Duration::from_secs(30),
            )
            .await;
        match result {
            Ok((status, _)) if (200..300).contains(&status) => {
                self.lora.mark_loaded(replica, adapter);
                self.stats.lora_loads.fetch_add(1, Ordering::Relaxed);
            }
            other => {
                self.stats.lora_load_errors.fetch_add(1, Ordering::Relaxed);
                warn!(replica = %target.name, adapter = %adapter.name, result = ?other.map(|(s, _)| s), "LoRA load failed");
            }
        }
    }
}
