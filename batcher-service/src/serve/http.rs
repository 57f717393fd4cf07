//! The batcher's HTTP endpoints for operators: `/metrics` (Prometheus text), `/healthz`
//! (the process is up) and `/readyz` (listening and not draining; a Kubernetes readiness
//! probe takes a draining batcher out of its Service before it stops), and the inspector
//! page under `/ui` (see [`super::inspect`]).

use super::brain::Brain;
use super::metrics::Page;
use super::Clock;
use crate::front::Front;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Clone)]
pub struct HttpState {
    pub brain: Arc<Brain>,
    pub clock: Clock,
    pub ready: Arc<AtomicBool>,
    /// Batch mode's front, when it runs: its metrics join the page.
    pub front: Option<Arc<Front>>,
    /// Where the inspector's browser build lives (`pkg/`), if installed.
    pub ui_assets: Option<std::path::PathBuf>,
}

pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .merge(super::inspect::routes())
        .with_state(state)
}

async fn metrics(State(state): State<HttpState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        {
            let mut text = state.brain.metrics(state.clock.now_ms());
            if let Some(front) = &state.front {
                let mut page = Page::default();
                front.write_metrics(&mut page);
                text.push_str(&page.finish());
            }
            text
        },
    )
}

async fn readyz(State(state): State<HttpState>) -> impl IntoResponse {
    if state.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n")
    }
}
