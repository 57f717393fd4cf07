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

#[cfg(test)]
mod tests {
    //! A replica's KV events stream from socket to page: a publisher built like vLLM's (a
    //! PUB socket, a ROUTER replay socket keeping every batch) sends the real vLLM
    //! recording, the stream's task follows it, and `/metrics` and `/ui/api/state` show it.
    use super::*;
    use crate::config::{KvEventsSection, Replica, ServeConfig};
    use crate::kv_events;
    use crate::metrics::{MetricSource, Metrics};
    use cohort_kv_events::testing::{recording, serve_replays, zmq_message as message};
    use serde_json::Value;
    use std::time::{Duration, Instant};
    use tokio::sync::watch;
    use zeromq::{PubSocket, RouterSocket, Socket, SocketSend};

    async fn until(what: &str, done: impl Fn() -> bool) {
        let start = Instant::now();
        while !done() {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "timed out: {what}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn page_has(metrics: &Metrics, line: &str) -> bool {
        metrics.render().lines().any(|l| l == line)
    }

    #[tokio::test]
    async fn a_stream_is_followed_replayed_and_shown_until_it_goes_silent() {
        let mut publisher = PubSocket::new();
        let endpoint = publisher.bind("tcp://127.0.0.1:0").await.unwrap();
        let mut router = RouterSocket::new();
        let replay_endpoint = router.bind("tcp://127.0.0.1:0").await.unwrap();
        let recording = recording("stream.jsonl");
        tokio::spawn(serve_replays(router, recording.clone()));

        let with_topic = |topic: &str| {
            let mut config = ServeConfig {
                replicas: vec![Replica::named("r0"), Replica::named("r1")],
                kv_events: KvEventsSection {
                    block_size: 128,
                    topic: topic.to_owned(),
                    silence_s: 1,
                    ..KvEventsSection::default()
                },
                ..ServeConfig::default()
            };
            config.replicas[0].kv_events = Some(endpoint.to_string().try_into().unwrap());
            config.replicas[0].kv_events_replay =
                Some(replay_endpoint.to_string().try_into().unwrap());
            config
        };
        let clock = Clock::start();
        let brain = Arc::new(Brain::new(&with_topic("kv"), clock));
        // Another batcher subscribed to a topic the engine does not publish.
        let elsewhere = Arc::new(kv_events::Streams::new(&with_topic("other"), clock));
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut tasks = kv_events::spawn(brain.kv_events(), stop_rx.clone());
        tasks.extend(kv_events::spawn(Arc::clone(&elsewhere), stop_rx));
        let mut metrics = Metrics::default();
        metrics.add(brain.kv_events() as Arc<dyn MetricSource>);
        let inspect = InspectState {
            brain: Arc::clone(&brain),
            clock,
            front: None,
            ui_assets: None,
        };
        let shown = || async {
            let Json(page) = state(State(inspect.clone())).await;
            page["replicas"].as_array().unwrap().clone()
        };
        let view = || brain.kv_events().get("r0").unwrap().view(clock.now_ms());
        // A PUB drops what it sends before a subscription reaches it: message 0 goes out
        // until it is applied (a second copy that arrives reads as a restart, harmless).
        let start = Instant::now();
        while view().totals.applied == 0 {
            assert!(start.elapsed() < Duration::from_secs(5), "never subscribed");
            publisher.send(message(recording[0].clone())).await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The rest of the recording goes out live but for message 3, which only the
        // replay has.
        for (seq, frames) in recording.iter().enumerate().skip(1) {
            if seq != 3 {
                publisher.send(message(frames.clone())).await.unwrap();
            }
        }
        until("all nine applied", || view().totals.applied == 9).await;
        let v = view();
        assert!(v.totals.replays >= 1, "{v:?}");
        assert_eq!((v.totals.gaps_lost, v.totals.malformed), (0, 0), "{v:?}");
        assert!(v.healthy && v.complete, "{v:?}");
        // After the reset, the last request's three full blocks.
        assert_eq!(v.blocks_held, 3);
        until("the metrics move", || {
            page_has(
                &metrics,
                "cohort_kv_events_applied_total{replica=\"r0\"} 9.0",
            ) && page_has(&metrics, "cohort_kv_events_blocks_held{replica=\"r0\"} 3.0")
                && page_has(&metrics, "cohort_kv_events_healthy{replica=\"r0\"} 1.0")
        })
        .await;
        let rows = shown().await;
        let (r0, r1) = (&rows[0], &rows[1]);
        assert_eq!(
            (r0["name"].as_str(), r1["name"].as_str()),
            (Some("r0"), Some("r1"))
        );
        assert_eq!(r0["kv_events"]["health"], "healthy", "{r0}");
        assert_eq!(r0["kv_events"]["blocks_held"], 3, "{r0}");
        assert_eq!(r0["kv_events"]["totals"]["applied"], 9, "{r0}");
        assert_eq!(r0["kv_events"]["messages_seen"], true, "{r0}");
        assert!(r0["kv_events"]["lag_s"].as_f64().unwrap() < 1.0, "{r0}");
        assert_eq!(r1["kv_events"], Value::Null, "no stream configured: {r1}");
        // The publisher goes quiet: past silence_s the stream is unhealthy, its lag grows.
        until("silent", || !view().healthy).await;
        assert_eq!(view().health, "degraded (silent)");
        until("the gauge drops", || {
            page_has(&metrics, "cohort_kv_events_healthy{replica=\"r0\"} 0.0")
        })
        .await;
        let rows = shown().await;
        let kv = &rows[0]["kv_events"];
        assert_eq!(kv["healthy"], false, "{kv}");
        assert!(kv["lag_s"].as_f64().unwrap() >= 1.0, "{kv}");
        assert_eq!(kv["blocks_held"], 3, "the residency stays, degraded: {kv}");

        // The engine restarts and publishes again (its sequence from 0): healthy again,
        // the old residency dropped for the new one.
        let restarts = view().totals.restarts;
        publisher.send(message(recording[0].clone())).await.unwrap();
        until("healthy again", || view().healthy).await;
        let v = view();
        assert_eq!(
            (v.totals.restarts, v.blocks_held),
            (restarts + 1, 3),
            "{v:?}"
        );
        assert!(v.lag_s < 1.0, "{v:?}");

        let other = elsewhere.get("r0").unwrap().view(clock.now_ms());
        assert_eq!(
            (other.totals.applied, other.messages_seen),
            (0, false),
            "another topic hears nothing, a second after the first message: {other:?}"
        );

        // The tasks end with the batcher.
        stop_tx.send(true).unwrap();
        for task in tasks {
            tokio::time::timeout(Duration::from_secs(2), task)
                .await
                .expect("the task stops")
                .unwrap();
        }
    }
}
