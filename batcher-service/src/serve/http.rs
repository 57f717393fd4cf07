//! The batcher's HTTP endpoints for operators: `/metrics` (OpenMetrics text), `/healthz`
//! (the process is up), `/readyz` (listening and not draining; a Kubernetes readiness
//! probe takes a draining batcher out of its Service before it stops) and
//! `/v1/audit/{request_id}` (one request's cost record, [`crate::audit`], found only with
//! the tenant header of the tenant it was made for), with the inspector page under `/ui`
//! ([`super::inspect`]) on the same port.

use super::inspect::{self, InspectState};
use crate::audit::AuditLog;
use crate::metrics::{Metrics, CONTENT_TYPE};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
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
    pub audit: Arc<AuditLog>,
    /// The header naming the tenant (as the filter's `tenant_header`).
    pub tenant_header: String,
}

pub fn router(state: HttpState, inspect: InspectState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/v1/audit/{request_id}", get(audit))
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

/// One request's audit record, for the tenant in the tenant header (none: the empty
/// tenant, as the filter sends a request without one). 404 for an unknown id and for
/// another tenant's: the answer does not tell the two apart.
async fn audit(
    State(state): State<HttpState>,
    Path(request_id): Path<String>,
    headers: HeaderMap,
) -> impl IntoResponse {
    let tenant = headers
        .get(state.tenant_header.as_str())
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    match state.audit.get(tenant, &request_id) {
        Some(record) => (StatusCode::OK, axum::Json(serde_json::json!(record))),
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(serde_json::json!({
                "error": "no audit record of this request id for this tenant"
            })),
        ),
    }
}
