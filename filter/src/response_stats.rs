//! The per-group response stats in Envoy: what one response measured
//! ([`Measured`]) recorded in its series ([`crate::response_series`] names them).
//!
//! A series' metrics are defined the first time this VM counts a response in it (a few
//! calls out of the VM, once each), then found in a map keyed by small numbers. Routes get
//! series of their own up to `response_stats.max_routes`: the list of routes that have one
//! is kept in Envoy's shared data so all workers agree ([`RouteTable`], compare-and-swap as
//! the learned table does), and each VM remembers where it placed a route name, so the shared
//! data is read once per route and a request costs one map lookup of its route's name.
//!
//! Per request: its status class and tokens are counted in the VM and added to Envoy's
//! counters on the root context's tick (at most [`FLUSH_TICK`] later), so they cost no call
//! out of the VM; the three latency histograms are recorded only for a sampled request (one
//! in `histogram_sample_every`, as the fingerprint histograms), which also saves the two
//! clock reads they need.

use crate::response_series::{
    route_tag, stat_name, Group, Metric, RouteTable, SeriesKey, StatusClass, OTHER_ROUTE,
};
use crate::usage::Usage;
use proxy_wasm::hostcalls::{self, define_metric, increment_metric, record_metric};
use proxy_wasm::types::{MetricType, Status};
use std::cell::RefCell;
use std::collections::hash_map::Entry;
use std::collections::HashMap;

/// The root context's tick when nothing else needs one: how late the counters may be.
pub const FLUSH_TICK: std::time::Duration = std::time::Duration::from_millis(200);

/// Tries of one route placement against concurrent writers.
const CAS_TRIES: usize = 4;
/// Route names one VM remembers the placement of; past this each new name reads the
/// shared table (only a configuration with thousands of routes gets there).
const REMEMBERED_ROUTES: usize = 1024;

/// The counters of a series, by index: the status classes ([`StatusClass::index`]), then
/// the prompt and the cached tokens.
const COUNTERS: usize = 8;
const PROMPT_TOKENS: usize = 6;
const CACHED_TOKENS: usize = 7;

fn counter_metric(index: usize) -> Metric {
    match index {
        PROMPT_TOKENS => Metric::PromptTokens,
        CACHED_TOKENS => Metric::CachedTokens,
        class => Metric::Responses(StatusClass::ALL[class.min(5)]),
    }
}

/// One series: its histograms' ids, and its counters, counted here and added to Envoy's on
/// the root context's tick ([`ResponseStats::flush`]): a request then makes no call out of
/// the VM for them. A counter is defined when it is first added to, so a series exports only
/// what happened (Envoy exports every defined metric, zero or not).
struct Series {
    key: SeriesKey,
    ttfb_ms: u32,
    headers_ms: u32,
    total_ms: u32,
    counters: [Option<u32>; COUNTERS],
    pending: [u64; COUNTERS],
}

impl Series {
    fn define(key: SeriesKey) -> Result<Series, Status> {
        let histogram = |m| define_metric(MetricType::Histogram, &stat_name(&key, m));
        Ok(Series {
            ttfb_ms: histogram(Metric::TtfbMs)?,
            headers_ms: histogram(Metric::HeadersMs)?,
            total_ms: histogram(Metric::TotalMs)?,
            counters: [None; COUNTERS],
            pending: [0; COUNTERS],
            key,
        })
    }

    /// Adds what was counted since the last flush to Envoy's counters.
    fn flush(&mut self) {
        for index in 0..COUNTERS {
            let n = std::mem::take(&mut self.pending[index]);
            if n == 0 {
                continue;
            }
            if self.counters[index].is_none() {
                let name = stat_name(&self.key, counter_metric(index));
                self.counters[index] = define_metric(MetricType::Counter, &name).ok();
            }
            if let Some(id) = self.counters[index] {
                let _ = increment_metric(id, i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
    }
}

/// What one response measured, in ms from its request headers; the times only for a
/// sampled request (`histogram_sample_every`).
#[derive(Debug, Default)]
pub struct Measured {
    /// Its HTTP status (0: no response headers came).
    pub status: u16,
    pub headers_ms: Option<u64>,
    pub ttfb_ms: Option<u64>,
    pub total_ms: Option<u64>,
    pub usage: Option<Usage>,
}

/// A route as this VM knows it: an index into [`ResponseStats::tags`].
pub type RouteId = u16;

/// The map key of a series: its group, route and unit.
type Key = (Group, RouteId, Option<u8>);

/// This VM's response stats.
pub struct ResponseStats {
    series: RefCell<HashMap<Key, Series>>,
    /// The route names this VM met (as the host gives them), by where it placed them.
    placed: RefCell<HashMap<String, RouteId>>,
    /// The tags of the places, by [`RouteId`].
    tags: RefCell<Vec<String>>,
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
            tags: RefCell::new(vec![OTHER_ROUTE.into()]),
            routes_key,
            max_routes,
        }
    }

    /// Whether the route is worth asking the host for.
    pub fn wants_route(&self) -> bool {
        self.max_routes > 0
    }

    /// The route a request on route `name` is counted under.
    pub fn route(&self, name: Option<&str>) -> RouteId {
        const OTHER: RouteId = 0;
        if self.max_routes == 0 {
            return OTHER;
        }
        let name = name.unwrap_or("");
        if let Some(id) = self.placed.borrow().get(name) {
            return *id;
        }
        let tag = self.place_shared(&route_tag(Some(name)));
        let mut tags = self.tags.borrow_mut();
        let id = match tags.iter().position(|t| *t == tag) {
            Some(i) => i as RouteId,
            None if tags.len() < usize::from(RouteId::MAX) => {
                tags.push(tag);
                (tags.len() - 1) as RouteId
            }
            None => OTHER,
        };
        let mut placed = self.placed.borrow_mut();
        if placed.len() < REMEMBERED_ROUTES {
            placed.insert(name.to_owned(), id);
        }
        id
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

    /// Records one response of `group` on `route`, for `unit`: its times in the histograms
    /// now, its status and tokens in the counters at the next [`Self::flush`].
    pub fn record(&self, group: Group, route: RouteId, unit: Option<u8>, measured: &Measured) {
        let unit = unit.filter(|_| group.compared());
        let mut series = self.series.borrow_mut();
        let series = match series.entry((group, route, unit)) {
            Entry::Occupied(entry) => entry.into_mut(),
            Entry::Vacant(entry) => {
                let key = SeriesKey {
                    group,
                    route: self
                        .tags
                        .borrow()
                        .get(usize::from(route))
                        .cloned()
                        .unwrap_or_else(|| OTHER_ROUTE.into()),
                    unit,
                };
                match Series::define(key) {
                    Ok(series) => entry.insert(series),
                    Err(_) => return,
                }
            }
        };
        series.pending[StatusClass::of(measured.status).index()] += 1;
        if let Some(usage) = measured.usage {
            series.pending[PROMPT_TOKENS] += usage.prompt_tokens;
            series.pending[CACHED_TOKENS] += usage.cached_tokens;
        }
        for (id, ms) in [
            (series.headers_ms, measured.headers_ms),
            (series.ttfb_ms, measured.ttfb_ms),
            (series.total_ms, measured.total_ms),
        ] {
            if let Some(ms) = ms {
                let _ = record_metric(id, ms);
            }
        }
    }

    /// Adds every series' counts since the last flush to Envoy's counters (the root
    /// context's tick: they lag the responses by at most one tick).
    pub fn flush(&self) {
        for series in self.series.borrow_mut().values_mut() {
            series.flush();
        }
    }
}
