//! Admitting a request into its cohort's batch ([`cohort_batcher_core::batch`]): the
//! leader opens a batch on the replica chosen for it (a fresh warm-up's replica, one
//! holding the LoRA adapter it needs, else its hint's first healthy replica) and goes at
//! once; followers go to the leader's replica, pinned to the leader's slot on llama.cpp
//! or held until the leader's first byte on engines with a shared prefix cache (at most
//! `max_hold_ms`; beyond `max_held` held followers, a request goes on directly). A
//! request that shares too little of its prompt with its batch's leader
//! (`batch.min_shared`) goes on alone, to its own hint, at once.

use super::dispatch::{Dispatch, SendBody};
use super::parse::Parsed;
use super::prefetch::Exemplar;
use super::stats::Direct;
use super::warm::WarmPlan;
use super::{lock, BatchState, Front};
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Response};
use cohort_batcher_core::batch::{Admission, BatchId, Release, ReplicaTraits};
use cohort_batcher_core::engines::{FrontApi, LoraAdapter};
use cohort_fingerprint::shard::jump_hash;
use serde_json::Value;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

impl Front {
    pub(super) async fn serve(
        self: Arc<Self>,
        api: FrontApi,
        headers: HeaderMap,
        body: Bytes,
    ) -> Response<Body> {
        let Some(parsed) = self.parse(api, &headers, &body) else {
            self.stats.direct(Direct::Unparsed);
            let replica = self
                .engines
                .healthy_from(jump_hash(hash_bytes(&body), self.engines.len() as u32) as usize);
            let send = Dispatch::direct(api, replica, None, SendBody::Raw(body), Instant::now());
            return self.send(send, &headers).await;
        };
        let now = self.clock.now_ms();
        let cohort = parsed.cohort;
        self.prefetch
            .observe(parsed.tenant_hash, parsed.context, cohort, now);
        let model = parsed
            .body
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let adapter = self.lora.needed(model.as_deref(), cohort).cloned();
        let admission = {
            let warmed = self.prefetch.take_warm(cohort, now);
            let mut used_warmup = false;
            let admission = lock(&self.batches).admit(
                cohort,
                parsed.shape(),
                now,
                || {
                    if let Some(r) = warmed.filter(|&r| self.engines[r].is_healthy()) {
                        used_warmup = true;
                        return r;
                    }
                    if let Some(adapter) = &adapter {
                        let on = self.lora.loaded_on(adapter);
                        if let Some(&r) = on.iter().find(|&&r| self.engines[r].is_healthy()) {
                            return r;
                        }
                    }
                    self.engines.healthy_from(parsed.hint)
                },
                |r| ReplicaTraits {
                    pressured: self.pressured(r),
                    release: self.engines[r].engine.release(),
                },
            );
            (admission, used_warmup)
        };
        match admission {
            (Admission::Lead { batch, replica }, used_warmup) => {
                self.lead(parsed, batch, replica, used_warmup, adapter, &headers)
                    .await
            }
            (Admission::Follow { batch, replica, .. }, _) => {
                self.follow(parsed, batch, replica, &headers).await
            }
            (Admission::Alone { .. }, _) => {
                self.stats.direct(Direct::Unshared);
                let send = Dispatch::direct(
                    parsed.api,
                    self.engines.healthy_from(parsed.hint),
                    parsed.salt,
                    SendBody::Json(parsed.body),
                    parsed.received,
                );
                self.send(send, &headers).await
            }
        }
    }

    async fn lead(
        self: Arc<Self>,
        parsed: Parsed,
        batch: BatchId,
        replica: usize,
        used_warmup: bool,
        adapter: Option<LoraAdapter>,
        headers: &HeaderMap,
    ) -> Response<Body> {
        let now = self.clock.now_ms();
        let engine = self.engines[replica].engine;
        let (slot, warm) = if engine.release() == Release::SameSlot {
            let mut slots = lock(&self.slots);
            let warm = slots.holds(replica, parsed.cohort);
            (Some(slots.pick(replica, parsed.cohort, now)), warm)
        } else {
            (None, false)
        };
        lock(&self.states).insert(
            batch,
            BatchState {
                slot,
                opened: Instant::now(),
                members: 1,
                prefilled: watch::channel(false).0,
            },
        );
        self.stats.leaders.fetch_add(1, Ordering::Relaxed);
        self.prefetch.leader_sent(
            parsed.cohort,
            Exemplar {
                api: parsed.api,
                body: parsed.body.clone(),
                replica,
                blocks: Vec::new(),
            },
            used_warmup,
            warm,
        );
        let warm_after = Some(WarmPlan {
            tenant_hash: parsed.tenant_hash,
            cohort: parsed.cohort,
            level: parsed.level,
            salt: parsed.salt.clone(),
            avoid: None,
            resident_s: 0,
        });
        if let Some(adapter) = adapter {
            self.ensure_lora(replica, &adapter).await;
        }
        let send = Dispatch {
            api: parsed.api,
            replica,
            slot,
            salt: parsed.salt,
            body: SendBody::Json(parsed.body),
            role: "leader",
            leads: Some((parsed.cohort, batch)),
            received: parsed.received,
            warm_after,
            warmed: used_warmup,
        };
        self.send(send, headers).await
    }

    async fn follow(
        self: Arc<Self>,
        parsed: Parsed,
        batch: BatchId,
        replica: usize,
        headers: &HeaderMap,
    ) -> Response<Body> {
        let state = lock(&self.states).get_mut(&batch).map(|s| {
            s.members += 1;
            (s.slot, s.prefilled.subscribe(), s.opened)
        });
        let engine = self.engines[replica].engine;
        let mut slot = None;
        let mut role = "follower";
        if let Some((batch_slot, mut prefilled, opened)) = state {
            slot = batch_slot;
            if engine.release() == Release::AfterLeaderPrefill && !*prefilled.borrow() {
                if self.held.fetch_add(1, Ordering::SeqCst) >= self.config.max_held {
                    self.held.fetch_sub(1, Ordering::SeqCst);
                    self.stats.direct(Direct::Overflow);
                    role = "direct";
                } else {
                    let _held = HeldGuard(&self.held);
                    let started = Instant::now();
                    let limit = Duration::from_millis(self.config.max_hold_ms)
                        .saturating_sub(opened.elapsed());
                    let mut stop = self.stop.clone();
                    tokio::select! {
                        _ = async { let _ = prefilled.wait_for(|p| *p).await; } => {}
                        _ = tokio::time::sleep(limit) => {}
                        _ = async { let _ = stop.wait_for(|s| *s).await; } => {}
                    }
                    self.stats
                        .queue_wait
                        .0
                        .observe(started.elapsed().as_secs_f64());
                }
            }
        }
        if role == "follower" {
            self.stats.followers.fetch_add(1, Ordering::Relaxed);
        }
        let send = Dispatch {
            api: parsed.api,
            replica,
            slot,
            salt: parsed.salt,
            body: SendBody::Json(parsed.body),
            role,
            leads: None,
            received: parsed.received,
            warm_after: None,
            warmed: false,
        };
        self.send(send, headers).await
    }

    pub(super) fn leader_prefilled(&self, cohort: u64, batch: BatchId) {
        lock(&self.batches).leader_prefilled(cohort, batch);
        if let Some(state) = lock(&self.states).get(&batch) {
            state.prefilled.send_replace(true);
        }
    }
}

fn hash_bytes(body: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(body)
}

/// Counts a held follower for as long as it is held, also if its caller goes away.
struct HeldGuard<'a>(&'a AtomicUsize);

impl Drop for HeldGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
