//! The root context: reads the plugin configuration and defines the stats, once per VM,
//! hands both to every HTTP context (in [`Shared`]), and drains the observation outbox into
//! the batcher.
//!
//! Envoy runs one VM per worker thread (and one on the main thread); each has its own
//! root context, so this runs on each. Defining a metric that exists returns its id.
//!
//! Observations: HTTP contexts of this VM push into [`Shared::outbox`]; every tick the root
//! context opens (or reopens, after a backoff) one `Observe` stream per batcher shard and
//! sends what is queued in batches. Only the root context can send on a stream it opened,
//! which is why the queue is shared and the sending is here. A stream is opened only once
//! there is something to send, so the main thread's VM, which sees no requests, opens none.
//!
//! The per-group response stats (`crate::response_stats`): HTTP contexts count each
//! response's status and tokens in the VM; every tick the root context adds them to Envoy's
//! counters (a tick is set for that alone when neither observations nor the breaker need one).
//!
//! The breaker ([`crate::breaker`]): HTTP contexts record their outcomes in
//! [`Shared::breaker`]; every [`BREAKER_SYNC`] the root context folds them into the state
//! all workers share (proxy-wasm shared data, compare-and-swap) and reads the state back.

use crate::batcher::{Closed, Flush, Outbox};
use crate::breaker::{self, Breaker};
use crate::config::FilterConfig;
use crate::grpc_target::grpc_target;
use crate::http::CohortHttp;
use crate::response_stats::ResponseStats;
use crate::shared::{unix_ms, BreakerLocal, Shared};
use crate::stats::{Sampler, Stats};
use cohort_proto as pb;
use log::{error, info, warn};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, Status};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

/// How often queued observations are sent.
const OBSERVE_TICK: Duration = Duration::from_millis(20);
/// The tick when only the breaker needs one.
const BREAKER_TICK: Duration = Duration::from_millis(100);
/// How often a worker folds its outcomes into the shared breaker and reads its state.
pub const BREAKER_SYNC: Duration = Duration::from_millis(500);
/// Tries of one fold against concurrent writers before keeping the outcomes for later.
const CAS_TRIES: usize = 8;

pub struct CohortRoot {
    shared: Rc<Shared>,
}

impl Default for CohortRoot {
    fn default() -> Self {
        CohortRoot {
            shared: Rc::new(Shared {
                config: Err("not configured yet".into()),
                stats: None,
                response_stats: None,
                histogram_sampler: Sampler::new(1),
                response_sampler: Sampler::new(1),
                outbox: RefCell::new(Outbox::new(0)),
                breaker: RefCell::new(BreakerLocal::default()),
                learned_key: String::new(),
                batcher_targets: Vec::new(),
            }),
        }
    }
}

impl CohortRoot {
    fn now_ms(&self) -> u64 {
        unix_ms(self.get_current_time())
    }

    /// One tick of one shard: open its stream, or send what is queued.
    fn flush_shard(&self, shard: usize, cluster: &str, target: &str) {
        let now = self.now_ms();
        let flush = self.shared.outbox.borrow_mut().flush(shard, now);
        match flush {
            Flush::Idle => {}
            Flush::Open => {
                match hostcalls::open_grpc_stream(
                    target,
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

impl CohortRoot {
    /// Folds this VM's outcomes into the shared breaker and reads its state back.
    fn sync_breaker(&self, config: &FilterConfig, now: u64) {
        let (pending, key) = {
            let mut local = self.shared.breaker.borrow_mut();
            if now < local.next_sync_ms {
                return;
            }
            local.next_sync_ms = now + BREAKER_SYNC.as_millis() as u64;
            (std::mem::take(&mut local.pending), local.key.clone())
        };
        for _ in 0..CAS_TRIES {
            let Ok((bytes, cas)) = hostcalls::get_shared_data(&key) else {
                break;
            };
            let mut shared: Breaker = bytes
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or_default();
            let transition = shared.update(&config.breaker, &pending, now);
            let Ok(encoded) = serde_json::to_vec(&shared) else {
                break;
            };
            match hostcalls::set_shared_data(&key, Some(&encoded), cas) {
                Ok(()) => {
                    self.shared.breaker.borrow_mut().state = shared.state;
                    let stats = self.shared.stats.as_ref();
                    if let Some(t) = transition {
                        match &t.trip {
                            Some(why) => warn!(
                                "cohort: breaker {} -> {} ({why})",
                                t.from.as_str(),
                                t.to.as_str()
                            ),
                            None => {
                                warn!("cohort: breaker {} -> {}", t.from.as_str(), t.to.as_str())
                            }
                        }
                        if let (breaker::State::Open, Some(stats)) = (t.to, stats) {
                            stats.inc(stats.breaker_trips);
                            if let Some(why) = &t.trip {
                                stats.inc(stats.breaker_trips_by(why.rule()));
                            }
                        }
                    }
                    if let Some(stats) = stats {
                        stats.record(stats.breaker_state, shared.state.gauge());
                    }
                    return;
                }
                Err(Status::CasMismatch) => continue,
                Err(_) => break,
            }
        }
        // Not written: keep the outcomes (those still in the window) for the next fold.
        let mut local = self.shared.breaker.borrow_mut();
        local.pending.merge(&pending);
        local.pending.prune(now, config.breaker.window_s);
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
        let shards = config
            .batcher_clusters
            .iter()
            .zip(&self.shared.batcher_targets);
        for (shard, (cluster, target)) in shards.enumerate() {
            self.flush_shard(shard, cluster, target);
        }
        if config.breaker_judges() {
            self.sync_breaker(config, self.now_ms());
        }
        if let Some(response_stats) = &self.shared.response_stats {
            response_stats.flush();
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
        let breaker_on = config.as_ref().is_ok_and(FilterConfig::breaker_judges);
        let tick = if shards > 0 {
            Some(OBSERVE_TICK)
        } else if breaker_on {
            Some(BREAKER_TICK)
        } else if config.is_ok() && stats.is_some() {
            Some(crate::response_stats::FLUSH_TICK)
        } else {
            None
        };
        if let Some(tick) = tick {
            if let Err(status) = hostcalls::set_tick_period(tick) {
                warn!("cohort: no tick ({status:?}); observations and the breaker stand still");
            }
        }
        let plugin = self
            .get_property(vec!["plugin_name"])
            .and_then(|b| String::from_utf8(b).ok())
            .unwrap_or_default();
        let breaker = BreakerLocal {
            key: format!("cohort.breaker.{plugin}"),
            ..BreakerLocal::default()
        };
        let learned_key = format!("cohort.learned.{plugin}");
        if config.as_ref().is_ok_and(|c| c.learned_cohorts.is_some()) {
            crate::learned_table::create(&learned_key);
        }
        let response_stats = match (&config, &stats) {
            (Ok(config), Some(_)) => Some(ResponseStats::new(
                format!("cohort.routes.{plugin}"),
                config.response_stats.max_routes,
            )),
            _ => None,
        };
        let sample_every = config.as_ref().map_or(1, |c| c.histogram_sample_every);
        // Validated with the configuration, so the name itself is only a formality.
        let batcher_targets = config.as_ref().map_or(Vec::new(), |c| {
            c.batcher_clusters
                .iter()
                .map(|cluster| grpc_target(cluster).unwrap_or_else(|_| cluster.clone()))
                .collect()
        });
        self.shared = Rc::new(Shared {
            config,
            stats,
            response_stats,
            histogram_sampler: Sampler::new(sample_every),
            response_sampler: Sampler::new(sample_every),
            outbox: RefCell::new(Outbox::new(shards)),
            breaker: RefCell::new(breaker),
            learned_key,
            batcher_targets,
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
