//! Sending one request to an engine and relaying its answer: the adapter's body rewrite,
//! failover to the next healthy replica when one is unreachable (a 502 naming the cause
//! only when none answers), and the relay that reports the first byte (a leader's prefix
//! is computed; the heatmap; the prefetch trigger) and the end (slot free; cancelled).

use super::warm::WarmPlan;
use super::{lock, Front};
use crate::engines::upstream::{Relay, UpstreamError};
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, Method, Response, StatusCode};
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
            if let Some(s) = slot {
                lock(&self.slots).started(replica, s);
            }
            target.request_started();
            let result = self
                .engines
                .upstream()
                .send(Method::POST, &target.base, send.api.path(), headers, body)
                .await;
            match result {
                Ok(response) => return self.relay(response, &send, replica, slot),
                Err(error) => {
                    target.request_ended();
                    if let Some(s) = slot {
                        lock(&self.slots).finished(replica, s, self.clock.now_ms());
                    }
                    warn!(replica = %target.name, %error, "engine request failed");
                    if matches!(error, UpstreamError::Connect(_)) {
                        target.set_healthy(false);
                        continue;
                    }
                    break;
                }
            }
        }
        if let Some((cohort, batch)) = send.leads {
            self.leader_prefilled(cohort, batch);
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
        replica: usize,
        slot: Option<usize>,
    ) -> Response<Body> {
        let (mut parts, incoming) = response.into_parts();
        for name in ["connection", "keep-alive", "transfer-encoding"] {
            parts.headers.remove(name);
        }
        let tag = format!("{};replica={}", send.role, self.engines[replica].name);
        if let Ok(value) = HeaderValue::from_str(&tag) {
            parts.headers.insert("x-cohort-batch", value);
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
                    front.warm_predicted(&plan);
                }
            })
        };
        let front = Arc::clone(self);
        let on_end = Box::new(move |finished: bool| {
            front.engines[replica].request_ended();
            if let Some(s) = slot {
                lock(&front.slots).finished(replica, s, front.clock.now_ms());
            }
            if !finished {
                front.stats.cancelled.fetch_add(1, Ordering::Relaxed);
            }
        });
        Response::from_parts(parts, Body::new(Relay::new(incoming, on_first, on_end)))
    }
}
