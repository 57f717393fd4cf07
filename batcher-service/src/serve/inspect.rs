//! The inspector page (`/ui`) and its JSON API, on the operator HTTP port.
//!
//! - `GET /ui`, `/ui/inspector.js`: the page (compiled into the binary);
//! - `GET /ui/pkg/{file}`: the wasm-bindgen build of the fingerprint core, read from the
//!   `ui_assets` directory (`scripts/build-wasm` writes `target/ui/pkg/`, `scripts/setup`
//!   installs it as `.cohort/ui/pkg/`); only its two file names are served;
//! - `GET /ui/api/state`: live cohorts, batch pivot, store statistics, the replicas
//!   (health, probe, in flight, Assign share, time to first byte, blocks held), and the
//!   batch front's latency heatmap when the front runs;
//! - `POST /ui/api/nearest` `{"tenant": "...", "sketch_i8": [32 ints]}`: the nearest live
//!   cohorts of that tenant.
//!
//! Nothing here shows prompt text: cohorts are ids, sources are tenant names.

use super::brain::Brain;
use crate::clock::Clock;
use crate::front::Front;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;

const PAGE: &str = include_str!("../../ui/index.html");
const SCRIPT: &str = include_str!("../../ui/inspector.js");
/// The files `wasm-bindgen --target web` writes for `cohort-fingerprint-web`.
const PKG_FILES: [(&str, &str); 2] = [
    ("cohort_fingerprint_web.js", "text/javascript"),
    ("cohort_fingerprint_web_bg.wasm", "application/wasm"),
];

/// What the inspector reads.
#[derive(Clone)]
pub struct InspectState {
    pub brain: Arc<Brain>,
    pub clock: Clock,
    /// Batch mode's front, when it runs: its latency heatmap joins the page.
    pub front: Option<Arc<Front>>,
    /// Where the inspector's browser build lives (`pkg/`), if installed.
    pub ui_assets: Option<PathBuf>,
}

pub fn routes(inspect: InspectState) -> Router {
    Router::new()
        .route("/ui", get(|| async { Html(PAGE) }))
        .route(
            "/ui/inspector.js",
            get(|| async { ([(header::CONTENT_TYPE, "text/javascript")], SCRIPT) }),
        )
        .route("/ui/pkg/{file}", get(pkg))
        .route("/ui/api/state", get(state))
        .route("/ui/api/nearest", post(nearest))
        .with_state(inspect)
}

async fn pkg(State(state): State<InspectState>, Path(file): Path<String>) -> Response {
    let Some((name, mime)) = PKG_FILES.iter().find(|(name, _)| *name == file) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let Some(dir) = &state.ui_assets else {
        return (
            StatusCode::NOT_FOUND,
            "the browser build is not installed (scripts/build-wasm)\n",
        )
            .into_response();
    };
    match tokio::fs::read(dir.join("pkg").join(name)).await {
        Ok(bytes) => ([(header::CONTENT_TYPE, *mime)], bytes).into_response(),
        Err(e) => (StatusCode::NOT_FOUND, format!("{name}: {e}\n")).into_response(),
    }
}

async fn state(State(state): State<InspectState>) -> Json<serde_json::Value> {
    let now = state.clock.now_ms();
    Json(json!({
        "batcher": state.brain.inspector_state(now),
        "front": state.front.as_ref().map(|f| f.inspector_state()),
        "replicas": state.brain.replicas_state(now),
    }))
}

#[derive(Deserialize)]
struct NearestQuery {
    #[serde(default)]
    tenant: String,
    sketch_i8: Vec<i8>,
}

async fn nearest(State(state): State<InspectState>, Json(query): Json<NearestQuery>) -> Response {
    let Ok(sketch) = <[i8; 32]>::try_from(query.sketch_i8.as_slice()) else {
        return (StatusCode::BAD_REQUEST, "sketch_i8 must hold 32 values\n").into_response();
    };
    let nearest = state
        .brain
        .nearest_cohorts(&query.tenant, &sketch, state.clock.now_ms());
    Json(json!({
        "nearest": nearest.iter().map(|(cohort, cos)| json!({"cohort": cohort, "similarity": cos})).collect::<Vec<_>>(),
    }))
    .into_response()
}
