//! Sending one request to an engine and relaying its answer: the adapter's body rewrite,
//! failover to the next healthy replica when one is unreachable (a 502 naming the cause
//! only when none answers), and the relay that reports the first byte (a leader's prefix
//! is computed; the heatmap; the prefetch trigger) and the end (slot free; cancelled).

use super::upstream::{Relay, UpstreamError};
use super::{lock, Dispatch, Front, SendBody};
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, Method, Response, StatusCode};
use cohort_batcher_core::engines::Member;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tracing::warn;

impl Front {
    /// Sends one request, failing over to the next healthy replica when the engine is
    /// unreachable, and relays the answer.
    pub(super) async fn send(
        self: Arc<Self>,
        send: Dispatch,
        headers: &HeaderMap,
    ) -> Response<Body> {
        let n = self.replicas.len();
        let mut replica = send.replica;
        let mut slot = send.slot;
        for attempt in 0..n {
            if attempt > 0 {
                replica = self.healthy_from((replica + 1) % n);
                slot = None;
                self.stats.failovers.fetch_add(1, Ordering::Relaxed);
            }
            let target = &self.replicas[replica];
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
            target.in_flight.fetch_add(1, Ordering::Relaxed);
            let result = self
                .upstream
                .send(Method::POST, &target.base, send.api.path(), headers, body)
                .await;
            match result {
                Ok(response) => return self.relay(response, &send, replica, slot),
                Err(error) => {
                    target.in_flight.fetch_sub(1, Ordering::Relaxed);
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
        let tag = format!("{};replica={}", send.role, self.replicas[replica].name);
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
            front.replicas[replica]
                .in_flight
                .fetch_sub(1, Ordering::Relaxed);
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
