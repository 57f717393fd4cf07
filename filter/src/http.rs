//! The HTTP context: thin glue between Envoy's callbacks and [`crate::decision`].
//!
//! Headers: remove reserved headers a client sent; for an LLM API request within the
//! guards, pause and buffer the body. Body: once complete, fingerprint it, write the
//! `x-cohort-*` headers, clear the route cache so Envoy routes on them, continue. Any
//! failure (guards, parse errors, a body over the limit) is a bypass: the request goes on
//! unchanged except for `x-cohort-bypass: <reason>`, and the reason is counted. Response:
//! `x-cohort: <version>; mode=…; cluster=…; sketch=v2; codebook=v1` (or `bypass=…`), and
//! for a routed request that set knobs with no effect in its mode, `x-cohort-ignored`
//! ([`crate::knob_effect`]).
//!
//! Assign mode: after the headers are written (so the request is already routable by key),
//! the request waits for a unary `Assign` call to its batcher shard, at most the configured
//! deadline. An answer adds `x-cohort-shard` / `x-cohort-cluster` and the request is routed
//! again; a timeout, an error or an unusable reply leaves it routed by key (affinity), counted.
//! Either way the request's observation is queued for the root context to stream.

use crate::batcher::{self, AssignCounter, AssignFallback, AssignOutcome};
use crate::breaker::{self, Group};
use crate::config::{FilterConfig, Mode};
use crate::decision::{self, reason, Admission, HeadersVerdict, RequestPlan, Routing};
use crate::knob_effect::{self, Knob};
use crate::learned_table::SharedTable;
use crate::response_series::Group as ResponseGroup;
use crate::response_stats::{Measured, RouteId};
use crate::shared::{unix_ms, Shared};
use crate::usage::{self, TailWindow};
use cohort_fingerprint::{IntentSketch, CODEBOOK_VERSION, SKETCH_VERSION};
use cohort_proto as pb;
use log::debug;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType};
use std::rc::Rc;
use std::time::{Duration, SystemTime};

/// A request waiting for the batcher's answer.
struct Assigning {
    token: u32,
    plan: Box<RequestPlan>,
    routing: Routing,
    shard_index: usize,
    started: SystemTime,
    /// The body as read for the fingerprint (kept, not copied, for the batcher's
    /// `exemplar_wanted`), or empty where it cannot become an exemplar.
    body: Vec<u8>,
}

enum State {
    /// Not an LLM API request, or nothing to say on the response.
    Untouched,
    /// Waiting for the end of the body.
    Buffering(Box<RequestPlan>),
    /// Waiting for the batcher's `Assign` answer.
    Assigning(Box<Assigning>),
    /// Routed on the fingerprint; `cluster` goes into the response header, `shard` when the
    /// batcher assigned one, `fallback` when assign mode fell back to the key.
    Routed {
        cluster: String,
        shard: Option<String>,
        fallback: Option<AssignFallback>,
        /// Knobs the batcher that assigned it cannot act on.
        inert: Vec<Knob>,
    },
    /// Passed through untouched for this reason.
    Bypassed(&'static str),
}

/// An assigned request whose progress the batcher asked for (its reply had a ticket).
struct Progress {
    ticket: u64,
    shard: String,
    shard_index: usize,
    /// When the Assign reply came.
    since: SystemTime,
    first_byte_reported: bool,
}

/// A counted request's response as it goes by, for the per-group response stats.
struct Measure {
    /// The route it is counted under.
    route: RouteId,
    /// Its user's unit (while a hold-out exists).
    unit: Option<u8>,
    /// Whether its times are recorded (one request in `histogram_sample_every`).
    timed: bool,
    status: u16,
    headers_at: Option<SystemTime>,
    first_byte_at: Option<SystemTime>,
    /// The end of the response body, for the usage it reports.
    tail: TailWindow,
}

pub struct CohortHttp {
    shared: Rc<Shared>,
    state: State,
    /// Bytes of request body buffered so far.
    buffered: usize,
    /// Assign mode: what to report as the response goes by.
    progress: Option<Progress>,
    /// When the request headers came (a counted request, while the breaker judges or its
    /// response is timed for the response stats).
    started: Option<SystemTime>,
    /// The response stats' measurement (a counted request, response stats on).
    measure: Option<Measure>,
    /// The knob headers the request set (LLM API requests only).
    knobs_sent: Vec<Knob>,
}

impl CohortHttp {
    pub fn new(shared: Rc<Shared>) -> Self {
        CohortHttp {
            shared,
            state: State::Untouched,
            buffered: 0,
            progress: None,
            started: None,
            measure: None,
            knobs_sent: Vec::new(),
        }
    }

    /// Queues a progress report of an assigned request for its batcher shard.
    fn report_progress(&self, phase: pb::request_progress::Phase, status: u32) {
        let Some(progress) = &self.progress else {
            return;
        };
        let now = self.get_current_time();
        let elapsed_ms = now
            .duration_since(progress.since)
            .map_or(0, |d| u32::try_from(d.as_millis()).unwrap_or(u32::MAX));
        let observation = batcher::progress_observation(
            progress.ticket,
            phase,
            status,
            elapsed_ms,
            &progress.shard,
            unix_ms(now),
        );
        let queued = self
            .shared
            .outbox
            .borrow_mut()
            .push(progress.shard_index, observation);
        if !queued {
            if let Some(stats) = &self.shared.stats {
                stats.inc(stats.observe_dropped);
            }
        }
    }

    /// Queues a passed-through request's reason for the batcher's audit (when a batcher is
    /// configured, observations are on, and the request has an id).
    fn audit_bypass(&self, plan: &RequestPlan, reason: &'static str) {
        let Ok(config) = &self.shared.config else {
            return;
        };
        let Some(request_id) = plan.request_id.as_deref().filter(|_| config.observe) else {
            return;
        };
        let Some(shard) = batcher::bypass_shard(config, request_id) else {
            return;
        };
        let now = unix_ms(self.get_current_time());
        let observation = batcher::bypass_observation(plan, config.mode, reason, now);
        if !self.shared.outbox.borrow_mut().push(shard, observation) {
            if let Some(stats) = &self.shared.stats {
                stats.inc(stats.observe_dropped);
            }
        }
    }

    /// [`Self::bypass`] of a request whose headers were read (it has a plan): the reason
    /// also goes to the batcher's audit.
    fn bypass_planned(&mut self, plan: &RequestPlan, reason: &'static str) {
        self.audit_bypass(plan, reason);
        self.bypass(reason);
    }

    fn bypass(&mut self, reason: &'static str) {
        if let Ok(config) = &self.shared.config {
            self.set_http_request_header(&config.headers.bypass, Some(reason));
        }
        if let Some(stats) = &self.shared.stats {
            stats.count_bypass(reason);
        }
        debug!("cohort: bypass {reason}");
        self.state = State::Bypassed(reason);
    }

    /// Leaves the request exactly as it came (nothing written upstream) for `reason`: the
    /// hold-out or a disabled route. Counted, named in the response header and in the
    /// batcher's audit.
    fn untouched(&mut self, plan: &RequestPlan, reason: &'static str) {
        self.audit_bypass(plan, reason);
        if let Some(stats) = &self.shared.stats {
            stats.count_bypass(reason);
        }
        debug!("cohort: untouched ({reason})");
        self.state = State::Bypassed(reason);
    }

    /// Reports the response's outcome to the breaker when it judges and the request belongs
    /// to one of the groups it compares (routed by Cohort, or held out).
    fn record_outcome(&self, config: &FilterConfig, status: u16, now: SystemTime) {
        let Some(started) = self.started.filter(|_| config.breaker_judges()) else {
            return;
        };
        let group = match &self.state {
            State::Routed { .. } => Group::Cohort,
            State::Bypassed(why) if *why == reason::HOLDOUT => Group::Holdout,
            _ => return,
        };
        let latency_ms = now
            .duration_since(started)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0);
        self.shared.breaker.borrow_mut().pending.record(
            unix_ms(now),
            group,
            status >= 500,
            latency_ms,
        );
    }

    /// Records the response in its group's series (response stats on, the request counted
    /// and ended routed, held out or bypassed).
    fn record_response(&mut self) {
        let Some(measure) = self.measure.take() else {
            return;
        };
        let Some(stats) = &self.shared.response_stats else {
            return;
        };
        let group = match &self.state {
            State::Routed { .. } => ResponseGroup::Routed,
            State::Bypassed(why) => ResponseGroup::of_bypass(why),
            State::Untouched | State::Buffering(_) | State::Assigning(_) => return,
        };
        // Times only for a timed request (its start, response headers and first byte were
        // read from the clock then).
        let started = self.started.filter(|_| measure.timed);
        let ms = |at: SystemTime| {
            started.map(|started| {
                at.duration_since(started)
                    .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            })
        };
        let measured = Measured {
            status: measure.status,
            headers_ms: measure.headers_at.and_then(ms),
            ttfb_ms: measure.first_byte_at.and_then(ms),
            total_ms: started.and_then(|_| ms(self.get_current_time())),
            usage: usage::scan(measure.tail.bytes()),
        };
        stats.record(group, measure.route, measure.unit, &measured);
    }

    /// The Envoy route this request matched (`xds.route_name`), if the host says.
    fn route_name(&self) -> Option<String> {
        let bytes = self.get_property(vec!["xds", "route_name"])?;
        String::from_utf8(bytes).ok()
    }

    /// With an invalid configuration nothing is touched, but LLM API requests (by the
    /// default paths) are still counted as `invalid_config` bypasses so the problem shows.
    fn count_unconfigured_request(&self, shared: &Shared) {
        let Some(stats) = &shared.stats else { return };
        let headers = self.request_headers();
        if decision::is_api_request(&FilterConfig::default(), &headers) {
            stats.inc(stats.requests);
            stats.count_bypass(reason::INVALID_CONFIG);
        }
    }

    /// Fingerprints the complete buffered body and writes the routing headers (or bypasses);
    /// in assign mode, asks the batcher and tells the caller to keep the request paused.
    fn route_buffered_body(&mut self) -> Action {
        let shared = Rc::clone(&self.shared);
        let (Ok(config), State::Buffering(_)) = (&shared.config, &self.state) else {
            return Action::Continue;
        };
        let State::Buffering(plan) = std::mem::replace(&mut self.state, State::Untouched) else {
            return Action::Continue;
        };
        let Some(body) = self.get_http_request_body(0, self.buffered) else {
            self.bypass_planned(&plan, reason::NO_BODY);
            return Action::Continue;
        };
        // Timed only when sampled: a clock read is a call out of the VM.
        let timed = shared.stats.is_some() && shared.histogram_sampler.take();
        let mut sketch_us = 0;
        let started = timed.then(|| self.get_current_time());
        let routed = decision::route_body_with(
            config,
            &plan,
            &body,
            |text, mode| {
                if !timed {
                    return IntentSketch::of_text(text, mode);
                }
                let sketch_started = self.get_current_time();
                let intent = IntentSketch::of_text(text, mode);
                sketch_us = self.elapsed_us(sketch_started);
                intent
            },
            &mut SharedTable {
                key: &shared.learned_key,
            },
        );
        let fingerprint_us = started.map(|started| self.elapsed_us(started));
        let routing = match routed {
            Ok(routing) => routing,
            Err(reason) => {
                self.bypass_planned(&plan, reason);
                return Action::Continue;
            }
        };
        self.write_headers(&routing.headers);
        if let Some(stats) = &shared.stats {
            stats.inc(stats.fingerprinted);
            match routing.learned {
                Some(placed) if placed.started && placed.changed => {
                    stats.inc(stats.learned_started)
                }
                Some(placed) if !placed.started => stats.inc(stats.learned_joined),
                _ => {}
            }
            if let Some(fingerprint_us) = fingerprint_us {
                stats.record(stats.fingerprint_us, fingerprint_us);
                stats.record(stats.sketch_us, sketch_us);
                stats.record(stats.body_bytes, body.len() as u64);
            }
        }
        let shard_index = batcher::shard_index(config, &routing.fingerprint);
        if let (Mode::Assign | Mode::Batch, Some(index)) = (config.mode, shard_index) {
            let now = self.get_current_time();
            // Batch mode too: the front sends leaders and lone requests where Assign said,
            // and followers mostly there as well (they share the leader's prefix), so the
            // ends Envoy sees keep the batcher's in-flight book as live as in assign mode.
            let reports_progress = config.observe;
            let request = batcher::assign_request(
                &plan,
                &routing.fingerprint,
                config.mode,
                unix_ms(now),
                reports_progress,
            );
            let message = prost::Message::encode_to_vec(&request);
            match hostcalls::dispatch_grpc_call(
                &shared.batcher_targets[index],
                pb::SERVICE,
                pb::METHOD_ASSIGN,
                Vec::new(),
                Some(&message),
                Duration::from_millis(config.assign_deadline_ms),
            ) {
                Ok(token) => {
                    self.state = State::Assigning(Box::new(Assigning {
                        token,
                        plan,
                        routing,
                        shard_index: index,
                        started: now,
                        // Kept only where it can become the batcher's exemplar (assign
                        // mode, reporting, small enough); otherwise freed now.
                        body: if config.mode == Mode::Assign
                            && reports_progress
                            && body.len() <= cohort_proto::EXEMPLAR_MAX_BYTES
                        {
                            body
                        } else {
                            Vec::new()
                        },
                    }));
                    return Action::Pause;
                }
                Err(status) => {
                    debug!("cohort: Assign not dispatched: {status:?}");
                    if let Some(stats) = &shared.stats {
                        stats.inc(stats.assign_error);
                    }
                    self.observe(&plan, &routing, shard_index, None, Vec::new());
                    self.state = State::Routed {
                        cluster: routing.cluster,
                        shard: None,
                        fallback: Some(AssignFallback::Error),
                        inert: Vec::new(),
                    };
                    return Action::Continue;
                }
            }
        }
        self.observe(&plan, &routing, shard_index, None, Vec::new());
        self.state = State::Routed {
            cluster: routing.cluster,
            shard: None,
            fallback: None,
            inert: Vec::new(),
        };
        Action::Continue
    }

    /// Sets request headers and makes Envoy pick the route again on them (Envoy 1.40
    /// also does so by itself after a header change during a paused filter).
    fn write_headers(&self, headers: &[(String, String)]) {
        for (name, value) in headers {
            self.set_http_request_header(name, Some(value));
        }
        let _ = hostcalls::call_foreign_function("clear_route_cache", Some(&[]));
    }

    /// Queues the request's observation for the root context, if observations are on;
    /// `exemplar` is the body when the batcher asked for it (else empty).
    fn observe(
        &self,
        plan: &RequestPlan,
        routing: &Routing,
        shard_index: Option<usize>,
        shard: Option<&str>,
        exemplar: Vec<u8>,
    ) {
        let (Ok(config), Some(index)) = (&self.shared.config, shard_index) else {
            return;
        };
        if !config.observe {
            return;
        }
        let now = unix_ms(self.get_current_time());
        let mut observation =
            batcher::observation(plan, &routing.fingerprint, config.mode, shard, now);
        observation.exemplar = exemplar;
        let queued = self.shared.outbox.borrow_mut().push(index, observation);
        if !queued {
            if let Some(stats) = &self.shared.stats {
                stats.inc(stats.observe_dropped);
            }
        }
    }

    /// The request headers, read as bytes: the SDK's string getters panic (and so kill the
    /// VM) on a value that is not UTF-8, which any client can send.
    fn request_headers(&self) -> Vec<(String, String)> {
        decision::headers_as_text(self.get_http_request_headers_bytes())
    }

    fn peer_principal(&self) -> Option<String> {
        let bytes = self.get_property(vec!["source", "principal"])?;
        String::from_utf8(bytes).ok()
    }

    fn elapsed_us(&self, since: std::time::SystemTime) -> u64 {
        self.get_current_time()
            .duration_since(since)
            .map_or(0, |d| d.as_micros() as u64)
    }
}

impl Context for CohortHttp {
    fn on_grpc_call_response(&mut self, token_id: u32, status_code: u32, response_size: usize) {
        let State::Assigning(pending) = std::mem::replace(&mut self.state, State::Untouched) else {
            return;
        };
        if pending.token != token_id {
            self.state = State::Assigning(pending);
            return;
        }
        let Assigning {
            plan,
            routing,
            shard_index,
            started,
            body,
            ..
        } = *pending;
        let shared = Rc::clone(&self.shared);
        let stats = shared.stats.as_ref();
        let elapsed_us = self.elapsed_us(started);
        if let Some(stats) = stats {
            stats.record(stats.assign_us, elapsed_us);
        }
        // Only an answered call has a reply to read.
        let reply = if status_code == 0 {
            hostcalls::get_buffer(BufferType::GrpcReceiveBuffer, 0, response_size)
                .ok()
                .flatten()
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let answer = batcher::AssignAnswer {
            grpc_status: status_code,
            reply: &reply,
            elapsed_us,
        };
        let outcome = match &shared.config {
            Ok(config) => {
                batcher::assign_outcome(config, &plan, &routing.cluster, shard_index, answer, &body)
            }
            // Not reached: a request waits for Assign only under a valid configuration.
            Err(_) => AssignOutcome::fell_back(&routing.cluster, AssignFallback::Error),
        };
        if let (Some(ticket), Some(shard)) = (outcome.progress_ticket, &outcome.shard) {
            self.progress = Some(Progress {
                ticket,
                shard: shard.clone(),
                shard_index,
                since: self.get_current_time(),
                first_byte_reported: false,
            });
        }
        if outcome.fallback.is_none() {
            self.write_headers(&outcome.headers);
        }
        if let Some(stats) = stats {
            stats.inc(match outcome.counter() {
                AssignCounter::Ok => stats.assign_ok,
                AssignCounter::Timeout => stats.assign_timeout,
                AssignCounter::Error => stats.assign_error,
            });
        }
        let exemplar = if outcome.send_exemplar {
            body
        } else {
            Vec::new()
        };
        self.observe(
            &plan,
            &routing,
            Some(shard_index),
            outcome.shard.as_deref(),
            exemplar,
        );
        self.state = State::Routed {
            cluster: outcome.cluster,
            shard: outcome.shard,
            fallback: outcome.fallback,
            inert: outcome.inert_knobs,
        };
        let _ = hostcalls::resume_http_request();
    }
}

impl HttpContext for CohortHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let shared = Rc::clone(&self.shared);
        let Ok(config) = &shared.config else {
            self.count_unconfigured_request(&shared);
            return Action::Continue;
        };
        let headers = self.request_headers();
        for name in decision::spoofed_headers(config, &headers) {
            self.set_http_request_header(name, None);
            if let Some(stats) = &shared.stats {
                stats.inc(stats.spoofed_header_removed);
            }
        }
        // The peer principal is a hostcall: ask for it only when it can become the tenant.
        let principal = if !config.trust_tenant_header && decision::is_api_request(config, &headers)
        {
            self.peer_principal()
        } else {
            None
        };
        let verdict = decision::inspect_headers(config, &headers, principal.as_deref());
        if matches!(verdict, HeadersVerdict::Ignore) {
            return Action::Continue;
        }
        if let Some(stats) = &shared.stats {
            stats.inc(stats.requests);
        }
        let response_stats = shared.response_stats.as_ref();
        let route =
            if config.rollout.filters_routes() || response_stats.is_some_and(|r| r.wants_route()) {
                self.route_name()
            } else {
                None
            };
        let timed = response_stats.is_some() && shared.response_sampler.take();
        if timed || config.breaker_judges() {
            self.started = Some(self.get_current_time());
        }
        if let Some(response_stats) = response_stats {
            self.measure = Some(Measure {
                route: response_stats.route(route.as_deref()),
                unit: None,
                timed,
                status: 0,
                headers_at: None,
                first_byte_at: None,
                tail: TailWindow::default(),
            });
        }
        match verdict {
            HeadersVerdict::Ignore => Action::Continue,
            HeadersVerdict::Bypass(reason) => {
                self.bypass(reason);
                Action::Continue
            }
            HeadersVerdict::Buffer(plan) => {
                self.knobs_sent = knob_effect::sent(&config.headers, &headers);
                if let Some(measure) = &mut self.measure {
                    measure.unit = decision::stats_unit(config, &plan, &headers);
                }
                let breaker_state = if config.breaker_judges() {
                    shared.breaker.borrow().state
                } else {
                    breaker::State::Closed
                };
                match decision::admit(config, &plan, &headers, route.as_deref(), breaker_state) {
                    Admission::Treat => {}
                    Admission::Untouched(reason) => {
                        self.untouched(&plan, reason);
                        return Action::Continue;
                    }
                    Admission::Bypass(reason) => {
                        self.bypass_planned(&plan, reason);
                        return Action::Continue;
                    }
                }
                if end_of_stream {
                    self.bypass_planned(&plan, reason::NO_BODY);
                    return Action::Continue;
                }
                if let Some(stats) = &shared.stats {
                    stats.count_invalid_knobs(&plan.knobs.invalid);
                }
                self.state = State::Buffering(plan);
                Action::Pause
            }
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let State::Buffering(_) = &self.state else {
            return Action::Continue;
        };
        self.buffered = body_size;
        let limit = self
            .shared
            .config
            .as_ref()
            .map_or(0, |c| c.body_limit_bytes);
        if body_size > limit {
            // Stop buffering before Envoy's own buffer limit could answer 413.
            if let State::Buffering(plan) = std::mem::replace(&mut self.state, State::Untouched) {
                self.bypass_planned(&plan, reason::BODY_TOO_LARGE);
            }
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        self.route_buffered_body()
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        // A body followed by trailers ends here, not with end_of_stream.
        if let State::Buffering(_) = &self.state {
            return self.route_buffered_body();
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let shared = Rc::clone(&self.shared);
        let Ok(config) = &shared.config else {
            return Action::Continue;
        };
        if self.started.is_some() || self.measure.is_some() {
            let status = self
                .get_http_response_header_bytes(":status")
                .and_then(|b| std::str::from_utf8(&b).ok()?.parse::<u16>().ok())
                .unwrap_or(0);
            let now = self.started.map(|_| self.get_current_time());
            if let Some(now) = now {
                self.record_outcome(config, status, now);
            }
            if let Some(measure) = &mut self.measure {
                measure.status = status;
                measure.headers_at = now;
            }
        }
        let detail = match &self.state {
            State::Routed {
                cluster,
                shard: Some(shard),
                ..
            } => format!(
                "mode={}; cluster={cluster}; shard={shard}; sketch=v{SKETCH_VERSION}; codebook=v{CODEBOOK_VERSION}",
                config.mode.as_str()
            ),
            State::Routed {
                cluster,
                fallback: Some(why),
                ..
            } => format!(
                "mode=affinity; cluster={cluster}; fallback={}; sketch=v{SKETCH_VERSION}; codebook=v{CODEBOOK_VERSION}",
                why.as_str()
            ),
            State::Routed { cluster, .. } => {
                format!("mode=affinity; cluster={cluster}; sketch=v{SKETCH_VERSION}; codebook=v{CODEBOOK_VERSION}")
            }
            State::Bypassed(reason) => format!("mode={}; bypass={reason}", config.mode.as_str()),
            State::Untouched | State::Buffering(_) | State::Assigning(_) => {
                return Action::Continue
            }
        };
        let value = format!("{}; {detail}", env!("CARGO_PKG_VERSION"));
        let name = config.headers.response.clone();
        self.add_http_response_header(&name, &value);
        // The mode the request was routed in, as `x-cohort` says: assigned, or by key.
        if let State::Routed { shard, inert, .. } = &self.state {
            let mode = if shard.is_some() {
                config.mode
            } else {
                Mode::Affinity
            };
            let ignored = knob_effect::ignored(mode, &self.knobs_sent, inert);
            if !ignored.is_empty() {
                let name = config.headers.ignored.clone();
                self.add_http_response_header(&name, &knob_effect::header_value(&ignored));
                if let Some(stats) = &self.shared.stats {
                    stats.count_ignored_knobs(mode, &ignored);
                }
            }
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.measure.is_some() && body_size > 0 {
            let first_byte_at = self
                .measure
                .as_ref()
                .is_some_and(|m| m.timed && m.first_byte_at.is_none())
                .then(|| self.get_current_time());
            let (start, len) = TailWindow::wanted(body_size);
            let tail = self.get_http_response_body(start, len);
            if let Some(measure) = &mut self.measure {
                if first_byte_at.is_some() {
                    measure.first_byte_at = first_byte_at;
                }
                if let Some(tail) = tail {
                    measure.tail.push(&tail);
                }
            }
        }
        if body_size > 0 || end_of_stream {
            let first = self
                .progress
                .as_ref()
                .is_some_and(|p| !p.first_byte_reported);
            if first {
                self.report_progress(pb::request_progress::Phase::FirstByte, 0);
                if let Some(progress) = &mut self.progress {
                    progress.first_byte_reported = true;
                }
            }
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        self.record_response();
        if self.progress.is_none() {
            return;
        }
        let status = self
            .get_property(vec!["response", "code"])
            .and_then(|bytes| <[u8; 8]>::try_from(bytes.as_slice()).ok())
            .map_or(0, |b| u32::try_from(u64::from_le_bytes(b)).unwrap_or(0));
        self.report_progress(pb::request_progress::Phase::End, status);
        self.progress = None;
    }
}
