//! Engine health and metrics, scraped in the background: one task per replica, every
//! `scrape_interval_s`, stopped by the shutdown signal.
//!
//! Health: any HTTP answer below 500 on the adapter's health path counts as up (a server
//! that answers is reachable; some answer 404 on paths they lack). Metrics: the adapter's
//! Prometheus page, parsed by the adapter. llama.cpp replicas configured without `slots`
//! get their slot count from `GET /props` (`total_slots`) at the first successful probe.
//! A replica that goes down loses its LoRA adapters and slot contents in the books: an
//! engine that restarts comes back empty.

use super::Front;
use axum::http::Method;
use cohort_batcher_core::engines::EngineKind;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tracing::{info, warn};

const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Spawns the scrape tasks; they end when `stop` turns true.
pub fn spawn(front: Arc<Front>, stop: watch::Receiver<bool>) -> Vec<tokio::task::JoinHandle<()>> {
    (0..front.replicas.len())
        .map(|index| {
            let front = Arc::clone(&front);
            let mut stop = stop.clone();
            tokio::spawn(async move {
                let mut tick =
                    tokio::time::interval(Duration::from_secs(front.config.scrape_interval_s));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = tick.tick() => probe(&front, index).await,
                        _ = async { let _ = stop.wait_for(|s| *s).await; } => break,
                    }
                }
            })
        })
        .collect()
}

async fn probe(front: &Front, index: usize) {
    let replica = &front.replicas[index];
    let engine = replica.engine;
    let health = front
        .upstream
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
            front.lora.forget_replica(index);
            front.forget_slots(index);
        }
    }
    if !up {
        return;
    }
    if engine.kind() == EngineKind::LlamaCpp && replica.needs_slot_count() {
        if let Ok((200, body)) = front
            .upstream
            .call(Method::GET, &replica.base, "/props", None, PROBE_TIMEOUT)
            .await
        {
            let slots = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("total_slots")?.as_u64());
            if let Some(slots) = slots.filter(|&n| n > 0) {
                front.set_slots(index, slots as usize);
                info!(replica = %replica.name, slots, "slot count from /props");
            }
        }
    }
    if let Some(path) = engine.metrics_path() {
        if let Ok((200, body)) = front
            .upstream
            .call(Method::GET, &replica.base, path, None, PROBE_TIMEOUT)
            .await
        {
            let text = String::from_utf8_lossy(&body);
            replica.set_metrics(engine.parse_metrics(&text));
        }
    }
}
