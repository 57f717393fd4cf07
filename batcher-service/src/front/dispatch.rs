//! Sending one request to an engine and relaying its answer: the adapter's body rewrite,
//! failover to the next healthy replica when one is unreachable (a 502 naming the cause
//! only when none answers), and the relay that reports the first byte (a leader's prefix
//! is computed; the heatmap; the prefetch trigger) and the end (slot free; cancelled).
//!
//! Every count a request holds on its replica (in flight, its llama.cpp slot) is a
//! [`Claim`], released exactly once by its `Drop`: when the relay ends, when the engine
//! call fails, or when the caller hangs up while the engine is still computing (axum then
//! drops the request's future, and the claim with it). A leader's claim also tells its
//! followers to stop waiting when it goes without a first byte.

use super::warm::{Busy, WarmPlan};
use super::{lock, Front};
use crate::fleet::upstream::{Relay, UpstreamError};
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode};
use cohort_batcher_core::batch::BatchId;
use cohort_batcher_core::engines::FrontApi;
use cohort_batcher_core::engines::Member;
use serde_json::{Map, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tracing::warn;

/// Where and how to send one request.
pub(super) struct Dispatch {
    pub api: FrontApi,
    pub replica: usize,
    pub slot: Option<usize>,
    pub salt: Option<String>,
    pub body: SendBody,
    pub role: &'static str,
    /// `(cohort, batch)` when this is a batch leader.
    pub leads: Option<(u64, BatchId)>,
    /// When the front received the request (the heatmap's time to first byte).
    pub received: Instant,
    /// A leader's prefetch, started at its first byte (not before: a warm-up on the
    /// leader's replica would otherwise prefill alongside the leader and delay it).
    pub warm_after: Option<WarmPlan>,
    /// A warm-up of its cohort chose the replica (the audit's `warmed`).
    pub warmed: bool,
}

impl Dispatch {
    /// A request sent on without batching (`role` direct): no slot, no batch, no warm-up.
    pub fn direct(
        api: FrontApi,
        replica: usize,
        salt: Option<String>,
        body: SendBody,
        received: Instant,
    ) -> Dispatch {
        Dispatch {
            api,
            replica,
            slot: None,
            salt,
            body,
            role: "direct",
            leads: None,
            received,
            warm_after: None,
            warmed: false,
        }
    }
}

pub(super) enum SendBody {
    Json(Map<String, Value>),
    Raw(Bytes),
}

impl Front {
    /// Sends one request, failing over to the next healthy replica when the engine is
    /// unreachable, and relays the answer.
    pub(super) async fn send(
        self: Arc<Self>,
        send: Dispatch,
        headers: &HeaderMap,
    ) -> Response<Body> {
        let audited = self.audit_key(headers);
        let headers = &self.engine_headers(headers);
        let n = self.engines.len();
        let mut replica = send.replica;
        let mut slot = send.slot;
        for attempt in 0..n {
            if attempt > 0 {
                replica = self.engines.healthy_from((replica + 1) % n);
                slot = None;
                self.stats.failovers.fetch_add(1, Ordering::Relaxed);
            }
            let target = &self.engines[replica];
            let body = match &send.body {
                SendBody::Raw(bytes) => bytes.clone(),
                SendBody::Json(map) => {
                    let mut map = map.clone();
                    target.engine.prepare(
                        &mut map,
                        &Member {
                            salt: send.salt.as_deref(),
                            slot,
                        },
                    );
                    Bytes::from(serde_json::to_vec(&map).unwrap_or_default())
                }
            };
            let claim = Claim::take(&self, replica, slot, send.leads);
            let result = self
                .engines
                .upstream()
                .send(Method::POST, &target.base, send.api.path(), headers, body)
                .await;
            match result {
                Ok(response) => {
                    if let Some((tenant, id)) = &audited {
                        self.audit
                            .front(tenant, id, send.role, &target.name, send.warmed);
                    }
                    return self.relay(response, &send, claim);
                }
                Err(error) => {
                    drop(claim);
                    warn!(replica = %target.name, %error, "engine request failed");
                    if matches!(error, UpstreamError::Connect(_)) {
                        target.set_healthy(false);
                        continue;
                    }
                    break;
                }
            }
        }
        self.stats.unreachable.fetch_add(1, Ordering::Relaxed);
        let body = serde_json::json!({"error": {
            "type": "cohort_engine_unreachable",
            "message": "cohort batch front: no engine replica answered this request",
        }});
        let mut response = Response::new(Body::from(body.to_string()));
        *response.status_mut() = StatusCode::BAD_GATEWAY;
        response
            .headers_mut()
            .insert("content-type", HeaderValue::from_static("application/json"));
        response
    }

    fn relay(
        self: &Arc<Self>,
        response: Response<hyper::body::Incoming>,
        send: &Dispatch,
        claim: Claim,
    ) -> Response<Body> {
        let replica = claim.replica;
        let (mut parts, incoming) = response.into_parts();
        for name in ["connection", "keep-alive", "transfer-encoding"] {
            parts.headers.remove(name);
        }
        let tag = format!("{};replica={}", send.role, self.engines[replica].name);
        if let Ok(value) = HeaderValue::from_str(&tag) {
            if let Ok(name) = HeaderName::from_bytes(self.headers.batch.as_bytes()) {
                parts.headers.insert(name, value);
            }
        }
        let on_first: Box<dyn FnOnce() + Send + Sync> = {
            let front = Arc::clone(self);
            let (leads, received) = (send.leads, send.received);
            let warm_after = send.warm_after.clone();
            Box::new(move || {
                front.stats.heatmap.record(received.elapsed());
                if let Some((cohort, batch)) = leads {
                    front.leader_prefilled(cohort, batch);
                }
                if let Some(plan) = warm_after {
                    front.warm_predicted(&plan, Busy::FrontBooks);
                }
            })
        };
        let on_end = Box::new(move |finished: bool| {
            if !finished {
                claim.front.stats.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            drop(claim);
        });
        Response::from_parts(parts, Body::new(Relay::new(incoming, on_first, on_end)))
    }
}

/// A request's hold on its replica: counted in flight there (and on its slot) from before
/// the engine call until this is dropped.
pub(super) struct Claim {
    front: Arc<Front>,
    replica: usize,
    slot: Option<usize>,
    /// `(cohort, batch)` of a leader: its followers are released when it goes.
    leads: Option<(u64, BatchId)>,
}

impl Claim {
    fn take(
        front: &Arc<Front>,
        replica: usize,
        slot: Option<usize>,
        leads: Option<(u64, BatchId)>,
    ) -> Claim {
        if let Some(s) = slot {
            lock(&front.slots).started(replica, s);
        }
        front.engines[replica].request_started();
        Claim {
            front: Arc::clone(front),
            replica,
            slot,
            leads,
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let front = &self.front;
        front.engines[self.replica].request_ended();
        if let Some(s) = self.slot {
            lock(&front.slots).finished(self.replica, s, front.clock.now_ms());
        }
        // A leader that leaves without a first byte (hang-up, failure) must not keep its
        // followers waiting for `max_hold_ms`; after its first byte this changes nothing.
        if let Some((cohort, batch)) = self.leads {
            front.leader_prefilled(cohort, batch);
        }
    }
}
