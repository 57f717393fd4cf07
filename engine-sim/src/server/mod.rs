//! The simulator's HTTP layer: N replicas in one process, each an axum server on its own
//! port with its own [`Replica`] state (behind a mutex, held only for arithmetic) and its own
//! FIFO slot semaphore. Handlers live in [`completions`] (the OpenAI APIs, where time is
//! spent) and [`info`] (everything else); [`respond`] holds the response helpers. With KV
//! events on ([`bind_with`]), each replica also publishes its cache's changes on ZeroMQ
//! ([`kv_events`]).

mod completions;
mod info;
mod kv_events;
mod respond;

pub use kv_events::{KvEventsConfig, KvEventsPorts};

use crate::cost::CostModel;
use crate::replica::Replica;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::serve::ListenerExt as _;
use axum::Router;
use serde_json::Value;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;

/// Largest request body accepted (long prompts are the point of a prefix cache).
const BODY_LIMIT: usize = 64 << 20;

/// Everything a simulator run is configured with.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub replicas: usize,
    pub host: String,
    /// First port; replica i listens on `base_port + i`, or on an ephemeral port if 0.
    pub base_port: u16,
    pub kv_blocks: usize,
    pub block_tokens: usize,
    pub slots: usize,
    pub model: String,
    pub max_model_len: usize,
    pub time_scale: f64,
    /// Unscaled constants (from the calibration).
    pub cost: CostModel,
    /// Where the constants came from and the calibration's fit error (for `/server_info`).
    pub calibration: Value,
}

/// One replica's shared state.
pub(crate) struct ReplicaCtx {
    pub index: usize,
    pub config: Arc<SimConfig>,
    pub state: Mutex<Replica>,
    pub slots: Arc<Semaphore>,
    pub epoch: Instant,
    /// Every replica, for `/sim/stats` from any port.
    pub all: std::sync::OnceLock<Vec<Arc<ReplicaCtx>>>,
    /// The KV events publisher, when events are on.
    pub events: Option<Arc<kv_events::Publisher>>,
}

impl ReplicaCtx {
    /// The state; a poisoned lock (a panic elsewhere) still yields it, counters are plain
    /// numbers.
    pub fn lock(&self) -> MutexGuard<'_, Replica> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Milliseconds since this replica started.
    pub fn now_ms(&self) -> f64 {
        self.ms_at(Instant::now())
    }

    pub fn ms_at(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.epoch).as_secs_f64() * 1000.0
    }

    pub fn instant_at(&self, ms: f64) -> Instant {
        self.epoch + std::time::Duration::from_secs_f64(ms.max(0.0) / 1000.0)
    }
}

/// Bound listeners, ready to serve.
pub struct BoundSim {
    listeners: Vec<TcpListener>,
    contexts: Vec<Arc<ReplicaCtx>>,
    ports: Vec<u16>,
    event_sockets: Vec<kv_events::Sockets>,
    kv_events_ports: Vec<KvEventsPorts>,
}

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("cannot bind the KV events socket {endpoint}: {source}")]
    KvEvents {
        endpoint: String,
        source: zeromq::ZmqError,
    },
    #[error("server: {0}")]
    Serve(std::io::Error),
}

/// Checks the configuration and binds every replica's port, without KV events.
pub async fn bind(config: SimConfig) -> Result<BoundSim, SimError> {
    bind_with(config, None).await
}

/// [`bind`], and with `kv_events` each replica's KV events sockets too.
pub async fn bind_with(
    config: SimConfig,
    kv_events: Option<KvEventsConfig>,
) -> Result<BoundSim, SimError> {
    if config.replicas == 0 || config.slots == 0 || config.block_tokens == 0 {
        return Err(SimError::Config(
            "replicas, slots and block-tokens must be at least 1".to_owned(),
        ));
    }
    if !(config.time_scale.is_finite() && config.time_scale >= 0.0) {
        return Err(SimError::Config("time-scale must be >= 0".to_owned()));
    }
    if !config.cost.is_valid() {
        return Err(SimError::Config("cost constants must be >= 0".to_owned()));
    }
    let config = Arc::new(config);
    let scaled = config.cost.scaled(config.time_scale);
    let mut listeners = Vec::new();
    let mut ports = Vec::new();
    let mut contexts = Vec::new();
    let mut event_sockets = Vec::new();
    let mut kv_events_ports = Vec::new();
    for index in 0..config.replicas {
        let port = match config.base_port {
            0 => 0,
            base => base
                .checked_add(index as u16)
                .ok_or_else(|| SimError::Config("base-port + replicas > 65535".to_owned()))?,
        };
        let addr = format!("{}:{port}", config.host);
        let listener = TcpListener::bind(&addr)
            .await
            .map_err(|source| SimError::Bind {
                addr: addr.clone(),
                source,
            })?;
        let local: SocketAddr = listener.local_addr().map_err(|source| SimError::Bind {
            addr: addr.clone(),
            source,
        })?;
        ports.push(local.port());
        listeners.push(listener);
        let events = match &kv_events {
            Some(events_config) => {
                let (publisher, sockets) =
                    kv_events::bind(&config.host, index, events_config).await?;
                kv_events_ports.push(publisher.ports());
                event_sockets.push(sockets);
                Some(publisher)
            }
            None => None,
        };
        contexts.push(Arc::new(ReplicaCtx {
            index,
            config: Arc::clone(&config),
            state: Mutex::new(Replica::new(config.kv_blocks, config.block_tokens, scaled)),
            slots: Arc::new(Semaphore::new(config.slots)),
            epoch: Instant::now(),
            all: std::sync::OnceLock::new(),
            events,
        }));
    }
    for ctx in &contexts {
        let _ = ctx.all.set(contexts.clone());
    }
    Ok(BoundSim {
        listeners,
        contexts,
        ports,
        event_sockets,
        kv_events_ports,
    })
}

impl BoundSim {
    /// The replicas' ports, in replica order.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// The replicas' KV events ports, in replica order (empty without events).
    pub fn kv_events_ports(&self) -> &[KvEventsPorts] {
        &self.kv_events_ports
    }

    /// Serves every replica until `shutdown` resolves, then finishes in-flight requests.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), SimError> {
        let (stop_tx, stop_rx) = watch::channel(false);
        // The events' sockets stop after the HTTP servers, so that the batches of requests
        // still in flight at shutdown are published.
        let (events_stop_tx, events_stop_rx) = watch::channel(false);
        let mut event_tasks = Vec::new();
        for (sockets, ctx) in self.event_sockets.into_iter().zip(&self.contexts) {
            if let Some(publisher) = &ctx.events {
                let run = kv_events::run(sockets, Arc::clone(publisher), events_stop_rx.clone());
                event_tasks.push(tokio::spawn(run));
            }
        }
        let mut tasks = Vec::new();
        for (listener, ctx) in self.listeners.into_iter().zip(self.contexts) {
            let mut stop = stop_rx.clone();
            let app = router(ctx);
            // TCP_NODELAY: a streamed answer is many small writes (headers, then one SSE
            // event per token); with Nagle's algorithm the first event after the headers
            // waits for the peer's delayed ACK, 40 ms on Linux.
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            tasks.push(tokio::spawn(async move {
                axum::serve(listener, app)
                    .with_graceful_shutdown(async move {
                        let _ = stop.wait_for(|s| *s).await;
                    })
                    .await
            }));
        }
        shutdown.await;
        let _ = stop_tx.send(true);
        let mut result = Ok(());
        for task in tasks {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => result = Err(SimError::Serve(e)),
                Err(e) => result = Err(SimError::Serve(std::io::Error::other(e))),
            }
        }
        let _ = events_stop_tx.send(true);
        for task in event_tasks {
            if let Err(e) = task.await {
                result = Err(SimError::Serve(std::io::Error::other(e)));
            }
        }
        result
    }
}

fn router(ctx: Arc<ReplicaCtx>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(completions::chat))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions/render", post(info::render))
        .route("/v1/completions/render", post(info::render))
        .route("/tokenize", post(info::tokenize))
        .route("/detokenize", post(info::detokenize))
        .route("/health", get(info::health))
        .route("/health_generate", get(info::health))
        .route("/v1/models", get(info::models))
        .route("/model_info", get(info::model_info))
        .route("/get_model_info", get(info::model_info))
        .route("/server_info", get(info::server_info))
        .route("/get_server_info", get(info::server_info))
        .route("/metrics", get(info::metrics))
        .route("/sim/stats", get(info::stats))
        .route("/reset_prefix_cache", post(info::reset_prefix_cache))
        .fallback(info::not_found)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(ctx)
}
