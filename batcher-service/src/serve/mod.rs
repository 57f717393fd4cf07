//! `cohort serve`: the batcher service. A gRPC server (`cohort.v1.Batcher`: Assign,
//! Observe, Status) and an HTTP server (`/metrics`, `/healthz`, `/readyz`) over one
//! shared [`brain::Brain`], with a once-a-second upkeep task (TTL expiry of fingerprints
//! and cohorts). When the replicas have URLs, batch mode's HTTP front
//! ([`crate::front`]) listens too, with one engine probe task per replica. With
//! `[discovery]`, one task keeps the replica set from DNS and probes it
//! ([`crate::discovery`]). Each replica with `kv_events` has a task following its KV
//! cache events ([`crate::kv_events`]).
//!
//! With `[picker] listen`, the endpoint picker ([`picker`]) serves Envoy's ext_proc
//! and gRPC health on its own port over the same brain.
//!
//! Shutdown (SIGTERM or Ctrl-C) runs in two stages. First, for `drain_delay_ms`, everything
//! keeps serving while the batcher tells its callers to go elsewhere: `/readyz` and the
//! front's `/health` answer 503, and every front answer carries `connection: close` (and
//! Envoy's immediate health-check failure header), so proxies stop reusing pooled
//! connections and take the front out of their load balancing. Then open `Observe` streams
//! are ended, all servers stop accepting and finish what is in flight (at most `drain_s`),
//! the upkeep task stops, and the process exits 0. Closing the listener at once instead
//! would fail requests a proxy writes onto a pooled connection as it closes.

pub(crate) mod brain;
mod grpc;
mod http;
mod inspect;
mod picker;

use crate::clock::Clock;
use crate::config::ServeConfig;
use crate::fleet::{self, Fleet};
use crate::front::Front;
use crate::metrics::{Metrics, Scrape};
use anyhow::Context as _;
use axum::serve::ListenerExt as _;
use brain::Brain;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tracing::info;

/// The largest gRPC message the batcher accepts: an `ObservationBatch` of 256 observations,
/// each with an exemplar of at most 64 KiB, fits.
const OBSERVE_MESSAGE_LIMIT: usize = 32 << 20;

/// Runs until SIGTERM or Ctrl-C.
pub async fn run(config: ServeConfig) -> anyhow::Result<()> {
    let clock = Clock::start();
    let brain = Arc::new(Brain::new(&config, clock));
    let ready = Arc::new(AtomicBool::new(false));
    let draining = Arc::new(AtomicBool::new(false));
    let (stop_tx, stop_rx) = watch::channel(false);

    let grpc_listener = tokio::net::TcpListener::bind(config.grpc_listen)
        .await
        .with_context(|| format!("cannot listen for gRPC on {}", config.grpc_listen))?;
    let http_listener = tokio::net::TcpListener::bind(config.http_listen)
        .await
        .with_context(|| format!("cannot listen for HTTP on {}", config.http_listen))?;
    info!(
        grpc = %grpc_listener.local_addr()?,
        http = %http_listener.local_addr()?,
        shard = config.shard_index,
        shards = config.shard_count,
        replicas = ?config.replicas.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
        "cohort serve listening"
    );

    let front = if config.front_enabled() {
        let listener = tokio::net::TcpListener::bind(config.batch.listen)
            .await
            .with_context(|| {
                format!(
                    "cannot listen for the batch front on {}",
                    config.batch.listen
                )
            })?;
        info!(front = %listener.local_addr()?, "batch front listening");
        let fleet = Arc::new(Fleet::new(&config));
        let front = Arc::new(Front::new(
            &config,
            Arc::clone(&fleet),
            clock,
            stop_rx.clone(),
            Arc::clone(&draining),
            brain.audit(),
        ));
        Some((front, fleet, listener))
    } else {
        None
    };
    let mut metrics = Metrics::default();
    metrics.add(Arc::new({
        let brain = Arc::clone(&brain);
        move |scrape: &mut Scrape<'_>| brain.write_metrics(scrape, clock.now_ms())
    }));
    let mut front_tasks = Vec::new();
    if let Some(settings) = crate::discovery::Settings::from_config(&config)? {
        let discovery = Arc::new(crate::discovery::Discovery::new(settings));
        metrics.add(Arc::clone(&discovery) as _);
        front_tasks.push(crate::discovery::spawn(
            discovery,
            Arc::clone(&brain) as _,
            stop_rx.clone(),
        ));
    }
    let kv_events = brain.kv_events();
    if !kv_events.is_empty() {
        metrics.add(Arc::clone(&kv_events) as _);
        front_tasks.extend(crate::kv_events::spawn(kv_events, stop_rx.clone()));
    }
    let front = front.map(|(front, fleet, listener)| {
        metrics.add(Arc::clone(&front) as _);
        metrics.add(Arc::clone(&fleet) as _);
        // The probes tell the front (slots, adapters) and the brain (health and queues
        // for assign decisions).
        front_tasks.extend(fleet::probe::spawn(
            fleet,
            vec![Arc::clone(&front) as _, Arc::clone(&brain) as _],
            stop_rx.clone(),
        ));
        let mut stop = stop_rx.clone();
        let router = Arc::clone(&front).router();
        // TCP_NODELAY: the front relays SSE event by event; with Nagle's algorithm the first
        // event after the headers would wait for Envoy's delayed ACK (40 ms).
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        front_tasks.push(tokio::spawn(async move {
            let serve = axum::serve(listener, router).with_graceful_shutdown(async move {
                let _ = stop.wait_for(|s| *s).await;
            });
            if let Err(error) = serve.await {
                tracing::error!(%error, "batch front stopped");
            }
        }));
        front
    });

    let picker = match config.picker.listen {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen for the endpoint picker on {addr}"))?;
            info!(picker = %listener.local_addr()?, "endpoint picker listening");
            let picker = Arc::new(picker::Picker::new(&config, Arc::clone(&brain), clock)?);
            metrics.add(Arc::new({
                let metrics = Arc::clone(&picker.metrics);
                move |scrape: &mut Scrape<'_>| metrics.write_metrics(scrape)
            }));
            Some(picker::serve(
                listener,
                picker,
                stop_rx.clone(),
                Arc::clone(&draining),
            ))
        }
        None => None,
    };
    let service = grpc::BatcherService {
        brain: Arc::clone(&brain),
        front: front.clone(),
        clock,
        shutdown: stop_rx.clone(),
    };
    let grpc = tokio::spawn({
        let mut stop = stop_rx.clone();
        let incoming =
            tonic::transport::server::TcpIncoming::from(grpc_listener).with_nodelay(Some(true));
        tonic::transport::Server::builder()
            .add_service(
                cohort_proto::batcher_server::BatcherServer::new(service)
                    // A batch of observations may carry exemplars (assign-mode prefetch):
                    // up to OUTBOX_BATCH_LIMIT × EXEMPLAR_MAX_BYTES, above tonic's 4 MiB.
                    .max_decoding_message_size(OBSERVE_MESSAGE_LIMIT),
            )
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = stop.wait_for(|s| *s).await;
            })
    });
    let http = tokio::spawn({
        let mut stop = stop_rx.clone();
        let router = http::router(
            http::HttpState {
                ready: Arc::clone(&ready),
                metrics: Arc::new(metrics),
                audit: brain.audit(),
                tenant_header: config.tenant_header.clone(),
            },
            inspect::InspectState {
                brain: Arc::clone(&brain),
                clock,
                front: front.clone(),
                ui_assets: config.ui_assets_dir(),
            },
        );
        async move {
            axum::serve(http_listener, router)
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await
        }
    });
    let upkeep = tokio::spawn({
        let brain = Arc::clone(&brain);
        let front = front.clone();
        let mut stop = stop_rx.clone();
        async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        brain.expire(clock.now_ms());
                        if let Some(front) = &front {
                            front.upkeep(clock.now_ms());
                        }
                    }
                    _ = stop.wait_for(|s| *s) => break,
                }
            }
        }
    });
    ready.store(true, Ordering::SeqCst);

    shutdown_signal().await;
    let delay = Duration::from_millis(config.drain_delay_ms);
    info!(
        ?delay,
        "cohort serve draining: still serving, callers told to go elsewhere"
    );
    ready.store(false, Ordering::SeqCst);
    draining.store(true, Ordering::SeqCst);
    // A second signal skips the rest of the delay.
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = shutdown_signal() => {}
    }
    info!("cohort serve draining: no longer accepting, finishing what is in flight");
    let _ = stop_tx.send(true);
    let drain = Duration::from_secs(config.drain_s);
    let joined = tokio::time::timeout(drain, async {
        let (grpc, http, _) = tokio::join!(grpc, http, upkeep);
        for task in front_tasks {
            let _ = task.await;
        }
        if let Some((server, health)) = picker {
            let _ = health.await;
            server
                .await
                .context("endpoint picker task")?
                .context("endpoint picker")?;
        }
        // Then the front's own requests (warm-ups) still running.
        if let Some(front) = &front {
            front.finish_background().await;
        }
        grpc.context("gRPC server task")?.context("gRPC server")?;
        http.context("HTTP server task")?.context("HTTP server")?;
        anyhow::Ok(())
    })
    .await;
    match joined {
        Ok(result) => result?,
        Err(_) => tracing::warn!("drain took longer than {drain:?}; exiting"),
    }
    info!("cohort serve stopped");
    Ok(())
}

async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
}
