//! The root context: reads the plugin configuration and defines the stats, once per VM,
//! hands both to every HTTP context, and drains the observation outbox into the batcher.
//!
//! Envoy runs one VM per worker thread (and one on the main thread); each has its own
//! root context, so this runs on each. Defining a metric that exists returns its id.
//!
//! Observations: HTTP contexts of this VM push into [`Shared::outbox`]; every tick the root
//! context opens (or reopens, after a backoff) one `Observe` stream per batcher shard and
//! sends what is queued in batches. Only the root context can send on a stream it opened,
//! which is why the queue is shared and the sending is here. A stream is opened only once
//! there is something to send, so the main thread's VM, which sees no requests, opens none.

use crate::batcher::{Closed, Flush, Outbox};
use crate::config::FilterConfig;
use crate::http::CohortHttp;
use crate::stats::Stats;
use cohort_proto as pb;
use log::{error, info, warn};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

/// How often queued observations are sent.
const OBSERVE_TICK: Duration = Duration::from_millis(20);

/// What every HTTP context of this VM shares.
pub struct Shared {
    /// The configuration, or why it was refused (then everything passes through).
    pub config: Result<FilterConfig, String>,
    /// `None` only if the host refused to define metrics; requests still flow.
    pub stats: Option<Stats>,
    /// Observations waiting for the root context to send them, per batcher shard.
    pub outbox: RefCell<Outbox>,
}

/// Milliseconds since the Unix epoch from the host's clock.
pub fn unix_ms(now: std::time::SystemTime) -> u64 {
    now.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub struct CohortRoot {
    shared: Rc<Shared>,
}

impl Default for CohortRoot {
    fn default() -> Self {
        CohortRoot {
            shared: Rc::new(Shared {
                config: Err("not configured yet".into()),
                stats: None,
                outbox: RefCell::new(Outbox::new(0)),
            }),
        }
    }
}

impl CohortRoot {
    fn now_ms(&self) -> u64 {
        unix_ms(self.get_current_time())
    }

    /// One tick of one shard: open its stream, or send what is queued.
    fn flush_shard(&self, shard: usize, cluster: &str) {
        let now = self.now_ms();
        let flush = self.shared.outbox.borrow_mut().flush(shard, now);
        match flush {
            Flush::Idle => {}
            Flush::Open => {
                match hostcalls::open_grpc_stream(
                    cluster,
                    pb::SERVICE,
                    pb::METHOD_OBSERVE,
                    Vec::new(),
                ) {
                    Ok(token) => self.shared.outbox.borrow_mut().opened(shard, token, now),
                    Err(status) => {
                        warn!("cohort: cannot open Observe stream to {cluster}: {status:?}");
                        self.shared
                            .outbox
                            .borrow_mut()
                            .closed(Closed::Shard(shard), now);
                    }
                }
            }
            Flush::Send { token, batches } => {
                for batch in batches {
                    let count = batch.observations.len() as u64;
                    let progress = batch
                        .observations
                        .iter()
                        .filter(|o| o.progress.is_some())
                        .count() as u64;
                    let bytes = prost::Message::encode_to_vec(&batch);
                    let sent = hostcalls::send_grpc_stream_message(token, Some(&bytes), false);
                    let stats = self.shared.stats.as_ref();
                    match sent {
                        Ok(()) => {
                            if let Some(stats) = stats {
                                stats.add(stats.observe_sent, count - progress);
                                stats.add(stats.progress_sent, progress);
                            }
                        }
                        Err(_) => {
                            if let Some(stats) = stats {
                                stats.add(stats.observe_dropped, count);
                            }
                            let mut outbox = self.shared.outbox.borrow_mut();
                            outbox.lost(shard, count);
                            outbox.closed(Closed::Token(token), now);
                            let _ = hostcalls::cancel_grpc_stream(token);
                            break;
                        }
                    }
                }
            }
        }
    }
}

impl Context for CohortRoot {
    fn on_grpc_stream_close(&mut self, token_id: u32, status_code: u32) {
        let now = self.now_ms();
        if let Some(shard) = self
            .shared
            .outbox
            .borrow_mut()
            .closed(Closed::Token(token_id), now)
        {
            info!("cohort: Observe stream to shard {shard} closed (grpc status {status_code})");
        }
    }
}

impl RootContext for CohortRoot {
    fn on_tick(&mut self) {
        let Ok(config) = &self.shared.config else {
            return;
        };
        for (shard, cluster) in config.batcher_clusters.iter().enumerate() {
            self.flush_shard(shard, cluster);
        }
    }

    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let bytes = self.get_plugin_configuration().unwrap_or_default();
        let config = match FilterConfig::parse(&bytes) {
            Ok(config) => {
                info!("cohort: configured, mode {}", config.mode.as_str());
                Ok(config)
            }
            Err(e) => {
                error!("cohort: invalid configuration, passing all traffic through: {e}");
                Err(e.to_string())
            }
        };
        let stats = match Stats::define() {
            Ok(stats) => Some(stats),
            Err(status) => {
                error!("cohort: could not define stats ({status:?}); running without them");
                None
            }
        };
        let shards = match &config {
            Ok(config) if config.observe => config.batcher_clusters.len(),
            _ => 0,
        };
        if shards > 0 {
            if let Err(status) = hostcalls::set_tick_period(OBSERVE_TICK) {
                warn!("cohort: no tick ({status:?}); observations will not be sent");
            }
        }
        self.shared = Rc::new(Shared {
            config,
            stats,
            outbox: RefCell::new(Outbox::new(shards)),
        });
        // Returning true even for an invalid configuration keeps the listener serving.
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(CohortHttp::new(Rc::clone(&self.shared))))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
