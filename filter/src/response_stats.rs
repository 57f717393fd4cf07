//! The per-group response stats in Envoy: what one response measured
//! ([`Measured`]) recorded in its series ([`crate::response_series`] names them).
//!
//! A series' metrics are defined the first time this VM counts a response in it (a few
//! calls out of the VM, once each), then found in a map. Routes get series of their own up to
//! `response_stats.max_routes`: the list of routes that have one is kept in Envoy's shared
//! data so all workers agree ([`RouteTable`], compare-and-swap as the learned table does),
//! and each VM remembers where it placed a route so the shared data is read once per route.

use crate::response_series::{
    route_tag, stat_name, Metric, RouteTable, SeriesKey, StatusClass, OTHER_ROUTE,
};
use crate::usage::Usage;
use proxy_wasm::hostcalls::{self, define_metric, increment_metric, record_metric};
use proxy_wasm::types::{MetricType, Status};
use std::cell::RefCell;
use std::collections::HashMap;

/// Tries of one route placement against concurrent writers.
const CAS_TRIES: usize = 4;
/// Route names one VM remembers the placement of; past this each new name reads the
/// shared table (only a configuration with thousands of routes gets there).
const REMEMBERED_ROUTES: usize = 1024;

/// Metric ids of one series. The latency histograms are defined with the series; a status
/// class's counter and the usage counters when first counted, so a series exports only
/// what happened (Envoy exports every defined metric, zero or not).
struct SeriesIds {
    ttfb_ms: u32,
    headers_ms: u32,
    total_ms: u32,
    /// By [`StatusClass::index`].
    responses: [Option<u32>; 6],
    /// Responses that reported usage, their prompt tokens, of which cached.
    usage: Option<[u32; 3]>,
}

impl SeriesIds {
    fn define(key: &SeriesKey) -> Result<SeriesIds, Status> {
        let histogram = |m| define_metric(MetricType::Histogram, &stat_name(key, m));
        Ok(SeriesIds {
            ttfb_ms: histogram(Metric::TtfbMs)?,
            headers_ms: histogram(Metric::HeadersMs)?,
            total_ms: histogram(Metric::TotalMs)?,
            responses: [None; 6],
            usage: None,
        })
    }
}

fn counter(key: &SeriesKey, metric: Metric) -> Option<u32> {
    define_metric(MetricType::Counter, &stat_name(key, metric)).ok()
}

fn add(id: u32, n: u64) {
    if n > 0 {
        let _ = increment_metric(id, i64::try_from(n).unwrap_or(i64::MAX));
    }
}

/// What one response measured, in ms from its request headers.
#[derive(Debug, Default)]
pub struct Measured {
    /// Its HTTP status (0: no response headers came).
    pub status: u16,
    pub headers_ms: Option<u64>,
    pub ttfb_ms: Option<u64>,
    pub total_ms: u64,
    pub usage: Option<Usage>,
}

/// This VM's response stats.
pub struct ResponseStats {
    series: RefCell<HashMap<SeriesKey, SeriesIds>>,
    /// Where this VM placed each route tag it met.
    placed: RefCell<HashMap<String, String>>,
    /// The shared-data key of the route table.
    routes_key: String,
    max_routes: usize,
}

impl ResponseStats {
    pub fn new(routes_key: String, max_routes: usize) -> ResponseStats {
        // The host compares versions only for a key that exists: create it, empty, so two
        // workers' first writes cannot overwrite each other.
        if max_routes > 0 {
            if let Ok((None, _)) = hostcalls::get_shared_data(&routes_key) {
                let _ = hostcalls::set_shared_data(&routes_key, Some(&[]), None);
            }
        }
        ResponseStats {
            series: RefCell::new(HashMap::new()),
            placed: RefCell::new(HashMap::new()),
            routes_key,
            max_routes,
        }
    }

    /// Whether the route is worth asking the host for.
    pub fn wants_route(&self) -> bool {
        self.max_routes > 0
    }

    /// The route tag a request on route `name` is counted under.
    pub fn route(&self, name: Option<&str>) -> String {
        if self.max_routes == 0 {
            return OTHER_ROUTE.into();
        }
        let tag = route_tag(name);
        if let Some(placed) = self.placed.borrow().get(&tag) {
            return placed.clone();
        }
        let placed = self.place_shared(&tag);
        let mut remembered = self.placed.borrow_mut();
        if remembered.len() < REMEMBERED_ROUTES {
            remembered.insert(tag, placed.clone());
        }
        placed
    }

    fn place_shared(&self, tag: &str) -> String {
        for _ in 0..CAS_TRIES {
            let Ok((bytes, cas)) = hostcalls::get_shared_data(&self.routes_key) else {
                break;
            };
            let mut table = RouteTable::from_bytes(&bytes.unwrap_or_default());
            let placement = table.place(tag, self.max_routes);
            if !placement.added {
                return placement.tag;
            }
            match hostcalls::set_shared_data(&self.routes_key, Some(&table.to_bytes()), cas) {
                Ok(()) => return placement.tag,
                Err(Status::CasMismatch) => continue,
                Err(_) => break,
            }
        }
        OTHER_ROUTE.into()
    }

    /// Records one response in series `key`.
    pub fn record(&self, key: SeriesKey, measured: &Measured) {
        let mut series = self.series.borrow_mut();
        if !series.contains_key(&key) {
            let Ok(ids) = SeriesIds::define(&key) else {
                return;
            };
            series.insert(key.clone(), ids);
        }
        let Some(ids) = series.get_mut(&key) else {
            return;
        };
        let class = StatusClass::of(measured.status);
        let responses = &mut ids.responses[class.index()];
        if responses.is_none() {
            *responses = counter(&key, Metric::Responses(class));
        }
        if let Some(id) = *responses {
            add(id, 1);
        }
        if let Some(ms) = measured.headers_ms {
            let _ = record_metric(ids.headers_ms, ms);
        }
        if let Some(ms) = measured.ttfb_ms {
            let _ = record_metric(ids.ttfb_ms, ms);
        }
        let _ = record_metric(ids.total_ms, measured.total_ms);
        if let Some(usage) = measured.usage {
            if ids.usage.is_none() {
                ids.usage = (|| {
                    Some([
                        counter(&key, Metric::Usage)?,
                        counter(&key, Metric::PromptTokens)?,
                        counter(&key, Metric::CachedTokens)?,
                    ])
                })();
            }
            if let Some([responses, prompt, cached]) = ids.usage {
                add(responses, 1);
                add(prompt, usage.prompt_tokens);
                add(cached, usage.cached_tokens);
            }
        }
    }
}
