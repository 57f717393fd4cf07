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
//! Per request:
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

mod dispatch;
mod engine_watch;
mod lora;
mod prefetch;
mod stats;
mod upstream;
mod warm;

use crate::serve::config::ServeConfig;
use crate::serve::metrics::Page;
use crate::serve::Clock;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, Response, StatusCode, Uri};
use axum::routing::post;
use axum::Router;
use cohort_batcher_core::batch::{
    Admission, BatchConfig, BatchId, BatchTable, Release, ReplicaTraits, SlotTable,
};
use cohort_batcher_core::engines::{
    cache_salt, Engine, EngineKind, EngineMetrics, FrontApi, LoraAdapter,
};
use cohort_batcher_core::predict::{PredictConfig, PrefetchLevel};
use cohort_fingerprint::shard::jump_hash;
use lora::Lora;
use prefetch::{Exemplar, Prefetcher};
use serde_json::{Map, Value};
use stats::{Direct, FrontStats};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use upstream::Upstream;

pub use engine_watch::spawn as spawn_engine_watch;

/// `x-cohort-prefetch` values.
pub fn prefetch_level(value: &str) -> Option<PrefetchLevel> {
    match value.trim() {
        "high" => Some(PrefetchLevel::High),
        "medium" => Some(PrefetchLevel::Medium),
        "low" => Some(PrefetchLevel::Low),
        "none" => Some(PrefetchLevel::None),
        _ => None,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One engine replica as the front sees it.
pub struct ReplicaHandle {
    pub name: String,
    base: Uri,
    engine: &'static dyn Engine,
    slots_known: AtomicBool,
    healthy: AtomicBool,
    in_flight: AtomicUsize,
    metrics: Mutex<EngineMetrics>,
}

impl ReplicaHandle {
    /// Records a probe; returns the previous state.
    fn set_healthy(&self, up: bool) -> bool {
        self.healthy.swap(up, Ordering::Relaxed)
    }

    fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    fn needs_slot_count(&self) -> bool {
        !self.slots_known.load(Ordering::Relaxed)
    }

    fn set_metrics(&self, metrics: EngineMetrics) {
        *lock(&self.metrics) = metrics;
    }
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
    replicas: Vec<ReplicaHandle>,
    config: crate::serve::config::BatchSection,
    default_level: PrefetchLevel,
    batches: Mutex<BatchTable>,
    slots: Mutex<SlotTable>,
    states: Mutex<HashMap<BatchId, BatchState>>,
    held: AtomicUsize,
    prefetch: Prefetcher,
    lora: Lora,
    upstream: Upstream,
    stats: FrontStats,
    clock: Clock,
    stop: watch::Receiver<bool>,
    /// Set at SIGTERM, before `stop`: still serving, but telling callers to go elsewhere.
    draining: Arc<AtomicBool>,
    /// The deployment secret keying engine cache salts.
    secret: Vec<u8>,
}

/// What the front knows about one request after parsing.
struct Parsed {
    api: FrontApi,
    body: Map<String, Value>,
    cohort: u64,
    hint: usize,
    /// The engine cache salt ([`cache_salt`]).
    salt: Option<String>,
    tenant_hash: u64,
    context: u64,
    level: PrefetchLevel,
    received: Instant,
}

/// Where and how to send one request.
struct Dispatch {
    api: FrontApi,
    replica: usize,
    slot: Option<usize>,
    salt: Option<String>,
    body: SendBody,
    role: &'static str,
    /// `(cohort, batch)` when this is a batch leader.
    leads: Option<(u64, BatchId)>,
    /// When the front received the request (the heatmap's time to first byte).
    received: Instant,
    /// A leader's prefetch, started at its first byte (not before: a warm-up on the
    /// leader's replica would otherwise prefill alongside the leader and delay it).
    warm_after: Option<WarmPlan>,
}

/// What a leader's prefetch needs.
#[derive(Clone)]
struct WarmPlan {
    tenant_hash: u64,
    cohort: u64,
    level: PrefetchLevel,
    salt: Option<String>,
}

enum SendBody {
    Json(Map<String, Value>),
    Raw(Bytes),
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

fn hash(text: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(text.as_bytes())
}

impl Front {
    pub fn new(
        config: &ServeConfig,
        clock: Clock,
        stop: watch::Receiver<bool>,
        draining: Arc<AtomicBool>,
    ) -> Front {
        let replicas: Vec<ReplicaHandle> = config
            .replicas
            .iter()
            .map(|r| ReplicaHandle {
                name: r.name.clone(),
                base: r
                    .url
                    .as_deref()
                    .unwrap_or_default()
                    .parse()
                    .unwrap_or_default(),
                engine: EngineKind::parse(&r.engine)
                    .unwrap_or(EngineKind::OpenAi)
                    .adapter(),
                slots_known: AtomicBool::new(r.slots.is_some()),
                healthy: AtomicBool::new(true),
                in_flight: AtomicUsize::new(0),
                metrics: Mutex::new(EngineMetrics::default()),
            })
            .collect();
        let slots: Vec<usize> = config
            .replicas
            .iter()
            .map(|r| r.slots.unwrap_or(1))
            .collect();
        let b = &config.batch;
        Front {
            replicas,
            default_level: prefetch_level(&config.prefetch.default_level)
                .unwrap_or(PrefetchLevel::Medium),
            batches: Mutex::new(BatchTable::new(BatchConfig {
                window_ms: b.window_ms,
                max_hold_ms: b.max_hold_ms,
                max_batch: b.max_batch,
                max_batch_pressured: b.max_batch_pressured,
                max_batch_same_slot: b.max_batch_same_slot,
            })),
            slots: Mutex::new(SlotTable::new(&slots)),
            states: Mutex::new(HashMap::new()),
            held: AtomicUsize::new(0),
            prefetch: Prefetcher::new(PredictConfig {
                horizon_ms: config.prefetch.horizon_ms,
                half_life_ms: config.prefetch.half_life_ms,
                ..PredictConfig::default()
            }),
            lora: Lora::new(&config.lora),
            upstream: Upstream::new(),
            stats: FrontStats::default(),
            config: config.batch.clone(),
            clock,
            stop,
            draining,
            secret: config.salt_secret.as_bytes().to_vec(),
        }
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
            .route("/health", axum::routing::get(health))
            .layer(DefaultBodyLimit::max(limit))
            .layer(axum::middleware::map_response_with_state(
                Arc::clone(&self),
                while_draining,
            ))
            .with_state(self)
    }

    fn set_slots(&self, replica: usize, slots: usize) {
        lock(&self.slots).resize(replica, slots);
        self.replicas[replica]
            .slots_known
            .store(true, Ordering::Relaxed);
    }

    fn forget_slots(&self, replica: usize) {
        lock(&self.slots).forget(replica);
    }

    fn pressured(&self, replica: usize) -> bool {
        lock(&self.replicas[replica].metrics)
            .kv_usage
            .is_some_and(|u| u >= self.config.kv_pressure)
    }

    /// `preferred` if it is up, else the next replica that is.
    fn healthy_from(&self, preferred: usize) -> usize {
        let n = self.replicas.len();
        (0..n)
            .map(|i| (preferred + i) % n)
            .find(|&r| self.replicas[r].is_healthy())
            .unwrap_or(preferred)
    }

    fn parse(&self, api: FrontApi, headers: &HeaderMap, body: &[u8]) -> Option<Parsed> {
        let map: Map<String, Value> = serde_json::from_slice(body).ok()?;
        let tenant = header(headers, "x-cohort-tenant").map(str::to_owned);
        let cohort =
            match header(headers, "x-cohort-key").and_then(|k| u64::from_str_radix(k, 16).ok()) {
                Some(key) => key,
                None => {
                    let request = cohort_fingerprint::Request {
                        path: Some(api.path()),
                        salt: cohort_fingerprint::TenantSalt::new(b"", tenant.as_deref()),
                        ..cohort_fingerprint::Request::new(body)
                    };
                    cohort_fingerprint::fingerprint(&request)
                        .ok()?
                        .routing_key
                        .0
                }
            };
        let hint = header(headers, "x-cohort-shard")
            .and_then(|name| self.replicas.iter().position(|r| r.name == name))
            .unwrap_or_else(|| jump_hash(cohort, self.replicas.len() as u32) as usize);
        let tenant_hash = hash(tenant.as_deref().unwrap_or(""));
        let context = header(headers, "x-cohort-session")
            .map(|s| hash(s) ^ tenant_hash.rotate_left(1))
            .unwrap_or(tenant_hash);
        let level = header(headers, "x-cohort-prefetch")
            .and_then(prefetch_level)
            .unwrap_or(self.default_level);
        let client_salt = map.get("cache_salt").and_then(Value::as_str);
        let salt = cache_salt(&self.secret, tenant.as_deref(), client_salt);
        Some(Parsed {
            api,
            body: map,
            cohort,
            hint,
            salt,
            tenant_hash,
            context,
            level,
            received: Instant::now(),
        })
    }

    async fn serve(
        self: Arc<Self>,
        api: FrontApi,
        headers: HeaderMap,
        body: Bytes,
    ) -> Response<Body> {
        let Some(parsed) = self.parse(api, &headers, &body) else {
            self.stats.direct(Direct::Unparsed);
            let replica = self
                .healthy_from(jump_hash(hash_bytes(&body), self.replicas.len() as u32) as usize);
            let send = Dispatch {
                api,
                replica,
                slot: None,
                salt: None,
                body: SendBody::Raw(body),
                role: "direct",
                leads: None,
                received: Instant::now(),
                warm_after: None,
            };
            return self.send(send, &headers).await;
        };
        let now = self.clock.now_ms();
        let cohort = parsed.cohort;
        self.prefetch
            .observe(parsed.tenant_hash, parsed.context, cohort, now);
        let model = parsed
            .body
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let adapter = self.lora.needed(model.as_deref(), cohort).cloned();
        let admission = {
            let warmed = self.prefetch.take_warm(cohort, now);
            let mut used_warmup = false;
            let admission = lock(&self.batches).admit(
                cohort,
                now,
                || {
                    if let Some(r) = warmed.filter(|&r| self.replicas[r].is_healthy()) {
                        used_warmup = true;
                        return r;
                    }
                    if let Some(adapter) = &adapter {
                        let on = self.lora.loaded_on(adapter);
                        if let Some(&r) = on.iter().find(|&&r| self.replicas[r].is_healthy()) {
                            return r;
                        }
                    }
                    self.healthy_from(parsed.hint)
                },
                |r| ReplicaTraits {
                    pressured: self.pressured(r),
                    release: self.replicas[r].engine.release(),
                },
            );
            (admission, used_warmup)
        };
        match admission {
            (Admission::Lead { batch, replica }, used_warmup) => {
                self.lead(parsed, batch, replica, used_warmup, adapter, &headers)
                    .await
            }
            (Admission::Follow { batch, replica, .. }, _) => {
                self.follow(parsed, batch, replica, &headers).await
            }
        }
    }

    async fn lead(
        self: Arc<Self>,
        parsed: Parsed,
        batch: BatchId,
        replica: usize,
        used_warmup: bool,
        adapter: Option<LoraAdapter>,
        headers: &HeaderMap,
    ) -> Response<Body> {
        let now = self.clock.now_ms();
        let engine = self.replicas[replica].engine;
        let (slot, warm) = if engine.release() == Release::SameSlot {
            let mut slots = lock(&self.slots);
            let warm = slots.holds(replica, parsed.cohort);
            (Some(slots.pick(replica, parsed.cohort, now)), warm)
        } else {
            (None, false)
        };
        lock(&self.states).insert(
            batch,
            BatchState {
                slot,
                opened: Instant::now(),
                members: 1,
                prefilled: watch::channel(false).0,
            },
        );
        self.stats.leaders.fetch_add(1, Ordering::Relaxed);
        self.prefetch.leader_sent(
            parsed.cohort,
            Exemplar {
                api: parsed.api,
                body: parsed.body.clone(),
                replica,
            },
            used_warmup,
            warm,
        );
        let warm_after = Some(WarmPlan {
            tenant_hash: parsed.tenant_hash,
            cohort: parsed.cohort,
            level: parsed.level,
            salt: parsed.salt.clone(),
        });
        if let Some(adapter) = adapter {
            self.ensure_lora(replica, &adapter).await;
        }
        let send = Dispatch {
            api: parsed.api,
            replica,
            slot,
            salt: parsed.salt,
            body: SendBody::Json(parsed.body),
            role: "leader",
            leads: Some((parsed.cohort, batch)),
            received: parsed.received,
            warm_after,
        };
        self.send(send, headers).await
    }

    async fn follow(
        self: Arc<Self>,
        parsed: Parsed,
        batch: BatchId,
        replica: usize,
        headers: &HeaderMap,
    ) -> Response<Body> {
        let state = lock(&self.states).get_mut(&batch).map(|s| {
            s.members += 1;
            (s.slot, s.prefilled.subscribe(), s.opened)
        });
        let engine = self.replicas[replica].engine;
        let mut slot = None;
        let mut role = "follower";
        if let Some((batch_slot, mut prefilled, opened)) = state {
            slot = batch_slot;
            if engine.release() == Release::AfterLeaderPrefill && !*prefilled.borrow() {
                if self.held.fetch_add(1, Ordering::SeqCst) >= self.config.max_held {
                    self.held.fetch_sub(1, Ordering::SeqCst);
                    self.stats.direct(Direct::Overflow);
                    role = "direct";
                } else {
                    let _held = HeldGuard(&self.held);
                    let started = Instant::now();
                    let limit = Duration::from_millis(self.config.max_hold_ms)
                        .saturating_sub(opened.elapsed());
                    let mut stop = self.stop.clone();
                    tokio::select! {
                        _ = async { let _ = prefilled.wait_for(|p| *p).await; } => {}
                        _ = tokio::time::sleep(limit) => {}
                        _ = async { let _ = stop.wait_for(|s| *s).await; } => {}
                    }
                    self.stats
                        .queue_wait
                        .0
                        .observe(started.elapsed().as_secs_f64());
                }
            }
        }
        if role == "follower" {
            self.stats.followers.fetch_add(1, Ordering::Relaxed);
        }
        let send = Dispatch {
            api: parsed.api,
            replica,
            slot,
            salt: parsed.salt,
            body: SendBody::Json(parsed.body),
            role,
            leads: None,
            received: parsed.received,
            warm_after: None,
        };
        self.send(send, headers).await
    }

    fn leader_prefilled(&self, cohort: u64, batch: BatchId) {
        lock(&self.batches).leader_prefilled(cohort, batch);
        if let Some(state) = lock(&self.states).get(&batch) {
            state.prefilled.send_replace(true);
        }
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

    /// The front's part of `/metrics`.
    pub fn write_metrics(&self, page: &mut Page) {
        self.stats.write(page);
        self.prefetch.write(page);
        let per_replica = |f: &dyn Fn(&ReplicaHandle) -> Option<f64>| -> Vec<(String, f64)> {
            self.replicas
                .iter()
                .filter_map(|r| f(r).map(|v| (r.name.clone(), v)))
                .collect()
        };
        page.labelled(
            "cohort_engine_up",
            "gauge",
            "Whether the engine replica answered its last health probe.",
            "replica",
            &per_replica(&|r| Some(if r.is_healthy() { 1.0 } else { 0.0 })),
        );
        page.labelled(
            "cohort_engine_in_flight",
            "gauge",
            "Requests the front has in flight on the replica.",
            "replica",
            &per_replica(&|r| Some(r.in_flight.load(Ordering::Relaxed) as f64)),
        );
        page.labelled(
            "cohort_engine_prompt_tokens_total",
            "counter",
            "Prompt tokens the engine reports processing (its own counter).",
            "replica",
            &per_replica(&|r| lock(&r.metrics).prompt_tokens_total),
        );
        page.labelled(
            "cohort_engine_cached_tokens_total",
            "counter",
            "Prompt tokens the engine reports serving from its prefix cache.",
            "replica",
            &per_replica(&|r| lock(&r.metrics).cached_tokens_total),
        );
        page.labelled(
            "cohort_engine_kv_usage",
            "gauge",
            "KV-cache usage the engine reports (0-1).",
            "replica",
            &per_replica(&|r| lock(&r.metrics).kv_usage),
        );
        page.gauge(
            "cohort_batches_open",
            "Batches open for joining.",
            lock(&self.batches).open_batches() as f64,
        );
        page.gauge(
            "cohort_followers_held",
            "Followers held for their leader's prefix right now.",
            self.held.load(Ordering::Relaxed) as f64,
        );
    }
}

impl Front {
    fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst) || *self.stop.borrow()
    }
}

/// While draining, every answer closes its connection (no request is then written onto a
/// pooled connection as the listener closes) and carries Envoy's
/// `x-envoy-immediate-health-check-fail`, which fails the front's active health check at
/// once so Envoy moves new requests to the replicas.
async fn while_draining(
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
async fn health(State(front): State<Arc<Front>>) -> (StatusCode, &'static str) {
    if front.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n")
    } else {
        (StatusCode::OK, "ok\n")
    }
}

fn hash_bytes(body: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(body)
}

/// Counts a held follower for as long as it is held, also if its caller goes away.
struct HeldGuard<'a>(&'a AtomicUsize);

impl Drop for HeldGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
