//! Engine health and metrics, scraped in the background: one task per replica, every
//! `scrape_interval_s`, stopped by the shutdown signal.
//!
//! Health: any HTTP answer below 500 on the adapter's health path counts as up (a server
//! that answers is reachable; some answer 404 on paths they lack). Metrics: the adapter's
//! Prometheus page, parsed by the adapter. llama.cpp replicas configured without `slots`
//! get their slot count from `GET /props` (`total_slots`) at the first successful probe.
//!
//! What the probes learn is kept on the [`Fleet`]; what others must act on goes to an
//! [`EngineEvents`] listener: a replica that goes down loses its LoRA adapters and slot
//! contents in the batch front's books (an engine that restarts comes back empty).

use super::Fleet;
use axum::http::Method;
use cohort_batcher_core::engines::{EngineKind, EngineMetrics};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tracing::{info, warn};

const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// What a probe tells its listeners (the batch front, and the brain's replica choice).
pub trait EngineEvents: Send + Sync {
    /// The replica stopped answering its health probe.
    fn engine_down(&self, _replica: usize) {}
    /// The replica answers its health probe again (or for the first time).
    fn engine_up(&self, _replica: usize) {}
    /// The replica was probed, answering (`up`) or not: every probe, changed or not.
    fn engine_probed(&self, _replica: usize, _up: bool) {}
    /// The replica reported how many slots it runs (llama.cpp `/props`).
    fn engine_slots(&self, _replica: usize, _slots: usize) {}
    /// The replica published its metrics (queue, KV usage, token counters).
    fn engine_metrics(&self, _replica: usize, _metrics: &EngineMetrics) {}
}

/// Spawns the scrape tasks; they end when `stop` turns true.
pub fn spawn(
    fleet: Arc<Fleet>,
    listeners: Vec<Arc<dyn EngineEvents>>,
    stop: watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let listeners: Arc<[Arc<dyn EngineEvents>]> = listeners.into();
    (0..fleet.len())
        .map(|index| {
            let fleet = Arc::clone(&fleet);
            let events = Arc::clone(&listeners);
            let mut stop = stop.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(fleet.scrape_interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = tick.tick() => probe(&fleet, &events, index).await,
                        _ = async { let _ = stop.wait_for(|s| *s).await; } => break,
                    }
                }
            })
        })
        .collect()
}

async fn probe(fleet: &Fleet, listeners: &[Arc<dyn EngineEvents>], index: usize) {
    let replica = &fleet[index];
    let engine = replica.engine;
    let upstream = fleet.upstream();
    let health = upstream
        .call(
            Method::GET,
            &replica.base,
            engine.health_path(),
            None,
            PROBE_TIMEOUT,
        )
        .await;
    let up = matches!(health, Ok((status, _)) if status < 500);
    let was_up = replica.set_healthy(up);
    if up != was_up {
        if up {
            info!(replica = %replica.name, "engine replica is up");
        } else {
            warn!(replica = %replica.name, error = ?health.err(), "engine replica is down");
        }
    }
    for events in listeners {
        events.engine_probed(index, up);
        // Every probe, not only changes: a listener that joined late still learns.
        if up {
            events.engine_up(index);
        } else if up != was_up {
            events.engine_down(index);
        }
    }
    if !up {
        return;
    }
    if engine.kind() == EngineKind::LlamaCpp && replica.needs_slot_count() {
        if let Ok((200, body)) = upstream
            .call(Method::GET, &replica.base, "/props", None, PROBE_TIMEOUT)
            .await
        {
            let slots = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("total_slots")?.as_u64());
            if let Some(slots) = slots.filter(|&n| n > 0) {
                for events in listeners {
                    events.engine_slots(index, slots as usize);
                }
                replica.mark_slots_known();
                info!(replica = %replica.name, slots, "slot count from /props");
            }
        }
    }
    if let Some(path) = engine.metrics_path() {
        if let Ok((200, body)) = upstream
            .call(Method::GET, &replica.base, path, None, PROBE_TIMEOUT)
            .await
        {
            let text = String::from_utf8_lossy(&body);
            let metrics = engine.parse_metrics(&text);
            replica.set_metrics(metrics);
            for events in listeners {
                events.engine_metrics(index, &metrics);
            }
        }
    }
}
