//! The engine replicas as the batcher reaches them: one home for everything the batcher
//! knows of an engine and every way it talks to one.
//!
//! - [`Fleet`]: the replicas in configuration order (the index every decision uses), each
//!   with its adapter ([`cohort_batcher_core::engines`]: request rewrites, health and
//!   metrics paths, LoRA calls), its health, the requests in flight on it, and the last
//!   metrics it published (queue, KV usage, prompt and cached tokens);
//! - [`probe`]: the background tasks that keep health, metrics and slot counts fresh, and
//!   tell their listener ([`EngineEvents`]) when a replica goes down or reports its slots;
//! - [`upstream`]: the pooled HTTP client to the engines and the response relay.
//!
//! The batch front sends through the fleet and listens to the probes; it does not own
//! them. This module reads the configuration and writes metrics, and nothing else of the
//! binary.

pub mod probe;
pub mod upstream;

use crate::config::ServeConfig;
use crate::metrics::{MetricSource, Scrape};
use axum::http::Uri;
use cohort_batcher_core::engines::{Engine, EngineMetrics};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use upstream::Upstream;

pub use probe::EngineEvents;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One engine replica: where it is, how to speak to it, and what is known of its state.
pub struct EngineReplica {
    pub name: String,
    pub base: Uri,
    pub engine: &'static dyn Engine,
    slots_known: AtomicBool,
    healthy: AtomicBool,
    in_flight: AtomicUsize,
    metrics: Mutex<EngineMetrics>,
}

impl EngineReplica {
    /// Records a probe; returns the previous state.
    pub fn set_healthy(&self, up: bool) -> bool {
        self.healthy.swap(up, Ordering::Relaxed)
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Whether the slot count is still to be asked of the engine (llama.cpp `/props`).
    pub fn needs_slot_count(&self) -> bool {
        !self.slots_known.load(Ordering::Relaxed)
    }

    pub fn mark_slots_known(&self) {
        self.slots_known.store(true, Ordering::Relaxed);
    }

    pub fn set_metrics(&self, metrics: EngineMetrics) {
        *lock(&self.metrics) = metrics;
    }

    /// The engine's last published metrics.
    pub fn metrics(&self) -> EngineMetrics {
        *lock(&self.metrics)
    }

    /// A request to this replica started (the batch front's own count).
    pub fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// A request to this replica ended, whichever way.
    pub fn request_ended(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }
}

/// All engine replicas, by configuration index, and the client that reaches them.
pub struct Fleet {
    replicas: Vec<EngineReplica>,
    upstream: Upstream,
    scrape_interval: Duration,
}

impl Fleet {
    /// The configured replicas (their URLs and engines were checked by the configuration).
    pub fn new(config: &ServeConfig) -> Fleet {
        let replicas = config
            .replicas
            .iter()
            .map(|r| EngineReplica {
                name: r.name.clone(),
                base: r.url.as_ref().map(|u| u.uri().clone()).unwrap_or_default(),
                engine: r.engine.adapter(),
                slots_known: AtomicBool::new(r.slots.is_some()),
                healthy: AtomicBool::new(true),
                in_flight: AtomicUsize::new(0),
                metrics: Mutex::new(EngineMetrics::default()),
            })
            .collect();
        Fleet {
            replicas,
            upstream: Upstream::new(),
            scrape_interval: Duration::from_secs(config.batch.scrape_interval_s),
        }
    }

    pub fn len(&self) -> usize {
        self.replicas.len()
    }

    /// The index of the replica named `name`.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.replicas.iter().position(|r| r.name == name)
    }

    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    /// `preferred` if it is up, else the next replica that is.
    pub fn healthy_from(&self, preferred: usize) -> usize {
        let n = self.replicas.len();
        (0..n)
            .map(|i| (preferred + i) % n)
            .find(|&r| self.replicas[r].is_healthy())
            .unwrap_or(preferred)
    }

    /// Whether the replica's KV cache is at least `threshold` full (its own report).
    pub fn kv_usage_at_least(&self, replica: usize, threshold: f64) -> bool {
        lock(&self.replicas[replica].metrics)
            .kv_usage
            .is_some_and(|u| u >= threshold)
    }
}

/// The engines' part of `/metrics`: health, the front's requests in flight, and what each
/// engine last reported of itself.
impl MetricSource for Fleet {
    fn write_metrics(&self, scrape: &mut Scrape<'_>) {
        let per_replica = |f: &dyn Fn(&EngineReplica) -> Option<f64>| -> Vec<(String, f64)> {
            self.replicas
                .iter()
                .filter_map(|r| f(r).map(|v| (r.name.clone(), v)))
                .collect()
        };
        scrape.labelled_gauge(
            "cohort_engine_up",
            "Whether the engine replica answered its last health probe.",
            "replica",
            &per_replica(&|r| Some(if r.is_healthy() { 1.0 } else { 0.0 })),
        );
        scrape.labelled_gauge(
            "cohort_engine_in_flight",
            "Requests the front has in flight on the replica.",
            "replica",
            &per_replica(&|r| Some(r.in_flight() as f64)),
        );
        scrape.labelled_counter(
            "cohort_engine_prompt_tokens_total",
            "Prompt tokens the engine reports processing (its own counter).",
            "replica",
            &per_replica(&|r| lock(&r.metrics).prompt_tokens_total),
        );
        scrape.labelled_counter(
            "cohort_engine_cached_tokens_total",
            "Prompt tokens the engine reports serving from its prefix cache.",
            "replica",
            &per_replica(&|r| lock(&r.metrics).cached_tokens_total),
        );
        scrape.labelled_gauge(
            "cohort_engine_kv_usage",
            "KV-cache usage the engine reports (0-1).",
            "replica",
            &per_replica(&|r| lock(&r.metrics).kv_usage),
        );
    }
}

impl std::ops::Index<usize> for Fleet {
    type Output = EngineReplica;

    fn index(&self, replica: usize) -> &EngineReplica {
        &self.replicas[replica]
    }
}
