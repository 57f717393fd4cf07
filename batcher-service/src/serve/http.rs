//! The batcher's HTTP endpoints for operators: `/metrics` (OpenMetrics text), `/healthz`
//! (the process is up) and `/readyz` (listening and not draining; a Kubernetes readiness
//! probe takes a draining batcher out of its Service before it stops), with the inspector
//! page under `/ui` ([`super::inspect`]) on the same port.

use super::inspect::{self, InspectState};
use crate::metrics::{Metrics, CONTENT_TYPE};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Clone)]
pub struct HttpState {
    pub ready: Arc<AtomicBool>,
    /// Every part's metrics (the brain's; the front's and the engines' when it runs).
    pub metrics: Arc<Metrics>,
}

pub fn router(state: HttpState, inspect: InspectState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state)
        .merge(inspect::routes(inspect))
}

async fn metrics(State(state): State<HttpState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        state.metrics.render(),
    )
}

async fn readyz(State(state): State<HttpState>) -> impl IntoResponse {
    if state.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n")
    }
}
