//! The HTTP context: thin glue between Envoy's callbacks and [`crate::decision`].
//!
//! Headers: remove reserved headers a client sent; for an LLM API request within the
//! guards, pause and buffer the body. Body: once complete, fingerprint it, write the
//! `x-cohort-*` headers, clear the route cache so Envoy routes on them, continue. Any
//! failure (guards, parse errors, a body over the limit) is a bypass: the request goes on
//! unchanged except for `x-cohort-bypass: <reason>`, and the reason is counted. Response:
//! `x-cohort: <version>; mode=…; cluster=…` (or `bypass=…`).

use crate::config::FilterConfig;
use crate::decision::{self, reason, HeadersVerdict, RequestPlan};
use crate::root::Shared;
use log::debug;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use std::rc::Rc;

enum State {
    /// Not an LLM API request, or nothing to say on the response.
    Untouched,
    /// Waiting for the end of the body.
    Buffering(Box<RequestPlan>),
    /// Routed on the fingerprint; `cluster` goes into the response header.
    Routed { cluster: String },
    /// Passed through untouched for this reason.
    Bypassed(&'static str),
}

pub struct CohortHttp {
    shared: Rc<Shared>,
    state: State,
    /// Bytes of request body buffered so far.
    buffered: usize,
}

impl CohortHttp {
    pub fn new(shared: Rc<Shared>) -> Self {
        CohortHttp {
            shared,
            state: State::Untouched,
            buffered: 0,
        }
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

    /// With an invalid configuration nothing is touched, but LLM API requests (by the
    /// default paths) are still counted as `invalid_config` bypasses so the problem shows.
    fn count_unconfigured_request(&self, shared: &Shared) {
        let Some(stats) = &shared.stats else { return };
        let method = self.get_http_request_header(":method");
        let path = self.get_http_request_header(":path").unwrap_or_default();
        if method.as_deref() == Some("POST") && FilterConfig::default().is_api_path(&path) {
            stats.inc(stats.requests);
            stats.count_bypass(reason::INVALID_CONFIG);
        }
    }

    /// Fingerprints the complete buffered body and writes the routing headers (or bypasses).
    fn route_buffered_body(&mut self) {
        let shared = Rc::clone(&self.shared);
        let (Ok(config), State::Buffering(plan)) = (&shared.config, &self.state) else {
            return;
        };
        let Some(body) = self.get_http_request_body(0, self.buffered) else {
            self.bypass(reason::NO_BODY);
            return;
        };
        let started = self.get_current_time();
        let routed = decision::route_body(config, plan, &body);
        let fingerprint_us = self.elapsed_us(started);
        match routed {
            Ok(routing) => {
                for (name, value) in &routing.headers {
                    self.set_http_request_header(name, Some(value));
                }
                // Envoy picked a route before the body arrived; make it pick again on the
                // new headers (Envoy 1.40 also does so by itself).
                let _ = hostcalls::call_foreign_function("clear_route_cache", Some(&[]));
                if let Some(stats) = &shared.stats {
                    stats.inc(stats.fingerprinted);
                    stats.record(stats.fingerprint_us, fingerprint_us);
                    stats.record(stats.body_bytes, body.len() as u64);
                }
                self.state = State::Routed {
                    cluster: routing.cluster,
                };
            }
            Err(reason) => self.bypass(reason),
        }
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

impl Context for CohortHttp {}

impl HttpContext for CohortHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let shared = Rc::clone(&self.shared);
        let Ok(config) = &shared.config else {
            self.count_unconfigured_request(&shared);
            return Action::Continue;
        };
        let headers = self.get_http_request_headers();
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
        if !matches!(verdict, HeadersVerdict::Ignore) {
            if let Some(stats) = &shared.stats {
                stats.inc(stats.requests);
            }
        }
        match verdict {
            HeadersVerdict::Ignore => Action::Continue,
            HeadersVerdict::Bypass(reason) => {
                self.bypass(reason);
                Action::Continue
            }
            HeadersVerdict::Buffer(_) if end_of_stream => {
                self.bypass(reason::NO_BODY);
                Action::Continue
            }
            HeadersVerdict::Buffer(plan) => {
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
            self.bypass(reason::BODY_TOO_LARGE);
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        self.route_buffered_body();
        Action::Continue
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        // A body followed by trailers ends here, not with end_of_stream.
        if let State::Buffering(_) = &self.state {
            self.route_buffered_body();
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let Ok(config) = &self.shared.config else {
            return Action::Continue;
        };
        let detail = match &self.state {
            State::Routed { cluster } => format!("cluster={cluster}"),
            State::Bypassed(reason) => format!("bypass={reason}"),
            State::Untouched | State::Buffering(_) => return Action::Continue,
        };
        let value = format!(
            "{}; mode={}; {detail}",
            env!("CARGO_PKG_VERSION"),
            crate::config::Mode::Affinity.as_str()
        );
        let name = config.headers.response.clone();
        self.add_http_response_header(&name, &value);
        Action::Continue
    }
}
