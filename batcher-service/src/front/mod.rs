//! Batch mode's HTTP front: OpenAI (`/v1/chat/completions`, `/v1/completions`,
//! `/v1/responses`) and Anthropic (`/v1/messages`) requests in, each answered by an engine
//! replica, with the requests of one cohort co-batched so their shared prefix is computed
//! once.
//!
//! Envoy sends a request here when the filter marked it batchable (`x-cohort-batch`); the
//! filter has already asked the batcher for a replica (`x-cohort-shard`) and keyed the
//! cohort (`x-cohort-key`, tenant-salted). Without those headers (a client calling the
//! front directly) the front fingerprints the body itself.
//!
//! Per request ([`parse`], [`admit`], [`dispatch`]):
//! 1. parse and fingerprint the body; anything unparseable goes straight to an engine
//!    (counted `direct`), which answers it as it would without us;
//! 2. admit it into its cohort's batch ([`cohort_batcher_core::batch`]): the leader goes
//!    at once; followers go to the leader's replica — pinned to the leader's slot on
//!    llama.cpp, or held until the leader's first byte on engines with a shared prefix
//!    cache (at most `max_hold_ms`; when `max_held` followers are already held, the
//!    request goes on directly, counted `overflow`);
//! 3. send it with the adapter's rewrite (slot, cache salt) and relay the engine's answer
//!    unchanged — status, headers, JSON or SSE, frame by frame. A caller that disconnects
//!    drops only its own engine request;
//! 4. learn the cohort sequence and warm the predicted next cohorts on idle replicas
//!    ([`prefetch`], [`warm`]); load LoRA adapters where their cohorts go ([`lora`]).
//!
//! If the chosen replica is unreachable the request goes to the next healthy one; only
//! when none answers does the caller get a 502 naming the cause. On shutdown, first (the
//! drain delay) `/health` answers 503 and every answer closes its connection and tells
//! Envoy to fail the front's health check at once, so proxies move to the replicas before
//! the listener closes; then held followers are released at once and every accepted
//! request is answered.
//!
//! The engines themselves (health, load, the HTTP client) are [`crate::fleet`]: the
//! front sends through that fleet and listens to its probes ([`EngineEvents`]). The front
//! reads the configuration, the clock and the metrics leaf, and nothing of `serve`, which
//! composes it.

mod admit;
mod assigned;
mod dispatch;
mod drain;
mod lora;
mod parse;
mod prefetch;
mod stats;
mod warm;

use crate::audit::AuditLog;
use crate::clock::Clock;
use crate::config::{BatchSection, ServeConfig};
use crate::fleet::{EngineEvents, Fleet};
use crate::metrics::{MetricSource, Scrape};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::HeaderMap;
use axum::routing::post;
use axum::Router;
use cohort_batcher_core::batch::{BatchConfig, BatchId, BatchTable, SlotTable};
use cohort_batcher_core::engines::FrontApi;
use cohort_batcher_core::predict::PredictConfig;
use cohort_fingerprint::headers::HeaderNames;
use cohort_fingerprint::knobs::policy::KnobPolicy;
use lora::Lora;
use lru::LruCache;
use prefetch::Prefetcher;
use stats::FrontStats;
use std::collections::HashMap;
use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinSet;
pub use warm::LiveFleet;

/// Assign-mode warm plans waiting for their request's first byte.
const FIRST_BYTE_PLANS: usize = 4096;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A batch the front is serving: where it goes and whether its leader has a first byte.
struct BatchState {
    slot: Option<usize>,
    opened: Instant,
    members: usize,
    prefilled: watch::Sender<bool>,
}

/// Batch mode's shared state.
pub struct Front {
    engines: Arc<Fleet>,
    config: BatchSection,
    /// The operator's knob defaults and bounds: the prefetch level a request gets.
    knob_policy: KnobPolicy,
    batches: Mutex<BatchTable>,
    slots: Mutex<SlotTable>,
    states: Mutex<HashMap<BatchId, BatchState>>,
    held: AtomicUsize,
    prefetch: Prefetcher,
    /// Assign mode: what to warm at each assigned request's first byte, by ticket
    /// ([`assigned`]); bounded, as a request may never report one.
    first_byte_plans: Mutex<LruCache<u64, warm::WarmPlan>>,
    lora: Lora,
    stats: FrontStats,
    clock: Clock,
    stop: watch::Receiver<bool>,
    /// Set at SIGTERM, before `stop`: still serving, but telling callers to go elsewhere.
    draining: Arc<AtomicBool>,
    /// The deployment secret keying engine cache salts and the front's own fingerprints.
    secret: Vec<u8>,
    /// The header contract, as configured (the same names as the filter's).
    headers: HeaderNames,
    tenant_header: String,
    /// What the front sends on its own (warm-ups), tracked so that a drain waits for it.
    background: Mutex<JoinSet<()>>,
    /// The per-request audit the brain opened at Assign; the front adds the batch role.
    audit: Arc<AuditLog>,
}

impl Front {
    pub fn new(
        config: &ServeConfig,
        engines: Arc<Fleet>,
        clock: Clock,
        stop: watch::Receiver<bool>,
        draining: Arc<AtomicBool>,
        audit: Arc<AuditLog>,
    ) -> Front {
        let slots: Vec<usize> = config
            .replicas
            .iter()
            .map(|r| r.slots.unwrap_or(1))
            .collect();
        let b = &config.batch;
        Front {
            engines,
            knob_policy: config.knobs.clone(),
            batches: Mutex::new(BatchTable::new(BatchConfig {
                window_ms: b.window_ms,
                max_hold_ms: b.max_hold_ms,
                max_batch: b.max_batch,
                max_batch_pressured: b.max_batch_pressured,
                max_batch_same_slot: b.max_batch_same_slot,
                min_shared: b.min_shared,
            })),
            slots: Mutex::new(SlotTable::new(&slots)),
            states: Mutex::new(HashMap::new()),
            held: AtomicUsize::new(0),
            prefetch: Prefetcher::new(PredictConfig {
                horizon_ms: config.prefetch.horizon_ms,
                half_life_ms: config.prefetch.half_life_ms,
                ..PredictConfig::default()
            }),
            first_byte_plans: Mutex::new(LruCache::new(
                NonZeroUsize::new(FIRST_BYTE_PLANS).unwrap(),
            )),
            lora: Lora::new(&config.lora),
            stats: FrontStats::default(),
            config: config.batch.clone(),
            clock,
            stop,
            draining,
            secret: config.salt_secret.as_bytes().to_vec(),
            headers: config.headers.clone(),
            tenant_header: config.tenant_header.clone(),
            background: Mutex::new(JoinSet::new()),
            audit,
        }
    }

    /// The audit key of a request (tenant, Envoy's request id), read before the contract's
    /// headers are stripped; `None` without a request id.
    fn audit_key(&self, headers: &HeaderMap) -> Option<(String, String)> {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let id = text("x-request-id").filter(|id| !id.is_empty())?;
        Some((
            text(&self.tenant_header).unwrap_or("").to_owned(),
            id.to_owned(),
        ))
    }

    /// Runs `task` beside callers' requests (a warm-up), tracked: the drain waits for it.
    fn spawn_background(&self, task: impl Future<Output = ()> + Send + 'static) {
        let mut tasks = lock(&self.background);
        while tasks.try_join_next().is_some() {}
        tasks.spawn(task);
    }

    /// Waits for the front's own requests still running (the drain's last step; no new
    /// ones start while draining).
    pub async fn finish_background(&self) {
        let mut tasks = std::mem::take(&mut *lock(&self.background));
        while tasks.join_next().await.is_some() {}
    }

    pub fn router(self: Arc<Self>) -> Router {
        let limit = self.config.max_body_bytes;
        let route = |api: FrontApi| {
            post(
                move |State(front): State<Arc<Front>>, headers: HeaderMap, body: Bytes| async move {
                    front.serve(api, headers, body).await
                },
            )
        };
        Router::new()
            .route(
                FrontApi::ChatCompletions.path(),
                route(FrontApi::ChatCompletions),
            )
            .route(FrontApi::Completions.path(), route(FrontApi::Completions))
            .route(FrontApi::Responses.path(), route(FrontApi::Responses))
            .route(FrontApi::Messages.path(), route(FrontApi::Messages))
            // Envoy health-checks the front and the engines behind it on one path.
            .route("/health", axum::routing::get(drain::health))
            .layer(DefaultBodyLimit::max(limit))
            .layer(axum::middleware::map_response_with_state(
                Arc::clone(&self),
                drain::while_draining,
            ))
            .with_state(self)
    }

    /// The caller's headers as the engine gets them: without the contract's headers
    /// (configured names; the layer has acted on them) and the tenant header.
    fn engine_headers(&self, headers: &HeaderMap) -> HeaderMap {
        let mut headers = headers.clone();
        for (_, name) in self.headers.all() {
            headers.remove(name);
        }
        headers.remove(self.tenant_header.as_str());
        headers
    }

    fn pressured(&self, replica: usize) -> bool {
        self.engines
            .kv_usage_at_least(replica, self.config.kv_pressure)
    }

    /// Once a second: close batches no one can join, and account for unused warm-ups.
    pub fn upkeep(&self, now_ms: u64) {
        lock(&self.batches).expire(now_ms);
        let keep = Duration::from_millis(self.config.max_hold_ms + self.config.window_ms);
        let mut states = lock(&self.states);
        states.retain(|_, state| {
            let open = state.opened.elapsed() <= keep;
            if !open {
                self.stats.batch_closed(state.members);
            }
            open
        });
        drop(states);
        self.prefetch.expire(now_ms);
    }

    /// The front's part of the inspector page: the live latency heatmap.
    pub fn inspector_state(&self) -> serde_json::Value {
        self.stats.heatmap.to_json()
    }
}

/// The probes' news: a replica that went down lost its adapters and slot contents (an
/// engine that restarts comes back empty); a slot count read from the engine resizes its
/// slot table.
impl EngineEvents for Front {
    fn engine_down(&self, replica: usize) {
        self.lora.forget_replica(replica);
        lock(&self.slots).forget(replica);
    }

    fn engine_slots(&self, replica: usize, slots: usize) {
        lock(&self.slots).resize(replica, slots);
    }
}

/// The front's part of `/metrics`; the engines' part is the fleet's own.
impl MetricSource for Front {
    fn write_metrics(&self, scrape: &mut Scrape<'_>) {
        self.stats.write(scrape);
        self.prefetch.write(scrape);
        scrape.count_gauge(
            "cohort_batches_open",
            "Batches open for joining.",
            lock(&self.batches).open_batches() as u64,
        );
        let busy: Vec<(String, f64)> = {
            let slots = lock(&self.slots);
            (0..self.engines.len())
                .map(|r| {
                    let busy = slots.slots(r) - slots.idle_slots(r);
                    (self.engines[r].name.clone(), busy as f64)
                })
                .collect()
        };
        scrape.labelled_gauge(
            "cohort_front_slots_busy",
            "Slots of each replica the front has a request pinned to (slot-pinned engines such as llama.cpp; 0 on others).",
            "replica",
            &busy,
        );
        scrape.count_gauge(
            "cohort_followers_held",
            "Followers held for their leader's prefix right now.",
            self.held.load(Ordering::Relaxed) as u64,
        );
    }
}
