//! Draining: from SIGTERM until the listener closes, the front keeps serving but tells
//! callers to go elsewhere, so no request is written onto a connection as it closes.

use super::Front;
use axum::body::Body;
use axum::extract::State;
use axum::http::{Response, StatusCode};
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Front {
    pub(super) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst) || *self.stop.borrow()
    }
}

/// While draining, every answer closes its connection (no request is then written onto a
/// pooled connection as the listener closes) and carries Envoy's
/// `x-envoy-immediate-health-check-fail`, which fails the front's active health check at
/// once so Envoy moves new requests to the replicas.
pub(super) async fn while_draining(
    State(front): State<Arc<Front>>,
    mut response: Response<Body>,
) -> Response<Body> {
    if front.is_draining() {
        let headers = response.headers_mut();
        headers.insert("connection", axum::http::HeaderValue::from_static("close"));
        headers.insert(
            "x-envoy-immediate-health-check-fail",
            axum::http::HeaderValue::from_static("true"),
        );
    }
    response
}

/// 200 while serving, 503 once draining (Envoy then sends to the replicas directly).
pub(super) async fn health(State(front): State<Arc<Front>>) -> (StatusCode, &'static str) {
    if front.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n")
    } else {
        (StatusCode::OK, "ok\n")
    }
}
