//! # cohort-wasm-floor — the least a proxy-wasm filter can do, for `cohort_tools/bench/filter_overhead.py`
//!
//! The filter-overhead benchmark compares Envoy + buffer filter with Envoy + the Cohort
//! filter. Part of what it measures is not Cohort's work but the price of being a wasm
//! filter at all: Envoy creates a context in the VM for every request and calls into V8 on
//! every stream event. This module pays only that price, so the benchmark can show how
//! much of the gap any proxy-wasm filter would leave, and how much is the fingerprint.
//!
//! Its plugin configuration picks one of these behaviours:
//! - `noop`: answer `Continue` to every callback (run behind Envoy's buffer filter, like
//!   the baseline): the cost of a wasm HTTP context and its callbacks;
//! - `body` (any other value): what any filter that routes on the body must do, in the
//!   fewest hostcalls — pause on the request headers, let Envoy buffer the body, read it
//!   once complete, write one request header and clear the route cache, continue;
//! - `body+clock:N`, `body+header:N`, `body+route:N`, `body+counter:N`, `body+response:N`:
//!   `body` and N more hostcalls of one kind (reading the clock; writing one more request
//!   header each; reading the `xds.route_name` property; incrementing a counter; reading
//!   the response body, on its every chunk), to price a hostcall against `body`;
//! - `body+grpc:CLUSTER`: `body`, then one gRPC call to the batcher at CLUSTER (`Status`,
//!   which answers from counters) before the request goes on: the least any filter that
//!   asks a service per request pays for the round trip (`cohort_tools/bench/added_time.py
//!   floor-grpc`), to set beside assign mode.
//!
//! It is not part of the product; `scripts/build-wasm` builds it next to the filter.

#[cfg(target_arch = "wasm32")]
mod floor {
    use proxy_wasm::hostcalls;
    use proxy_wasm::traits::{Context, HttpContext, RootContext};
    use proxy_wasm::types::{Action, ContextType};

    #[derive(Default, Clone)]
    pub struct FloorRoot {
        read_body: bool,
        /// Extra clock reads, header writes, route name reads, counter increments per
        /// request, and response body reads per response chunk.
        clocks: usize,
        headers: usize,
        routes: usize,
        counters: usize,
        responses: usize,
        counter: u32,
        /// The cluster of a gRPC call per request (`body+grpc:CLUSTER`).
        grpc_cluster: Option<String>,
    }

    impl Context for FloorRoot {}

    impl RootContext for FloorRoot {
        fn on_configure(&mut self, _size: usize) -> bool {
            let config = self.get_plugin_configuration().unwrap_or_default();
            let config = String::from_utf8_lossy(&config);
            self.read_body = config != "noop";
            let extra = |prefix: &str| {
                config
                    .strip_prefix(prefix)
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0)
            };
            self.clocks = extra("body+clock:");
            self.headers = extra("body+header:");
            self.routes = extra("body+route:");
            self.counters = extra("body+counter:");
            self.responses = extra("body+response:");
            if self.counters > 0 {
                self.counter = hostcalls::define_metric(
                    proxy_wasm::types::MetricType::Counter,
                    "cohort_floor_counter_total",
                )
                .unwrap_or(0);
            }
            self.grpc_cluster = config.strip_prefix("body+grpc:").map(str::to_owned);
            true
        }

        fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
            Some(Box::new(FloorHttp { root: self.clone() }))
        }

        fn get_type(&self) -> Option<ContextType> {
            Some(ContextType::HttpContext)
        }
    }

    struct FloorHttp {
        root: FloorRoot,
    }

    impl Context for FloorHttp {
        fn on_grpc_call_response(&mut self, _token: u32, status: u32, _size: usize) {
            self.set_http_request_header("x-floor-grpc-status", Some(&status.to_string()));
            let _ = hostcalls::resume_http_request();
        }
    }

    impl HttpContext for FloorHttp {
        fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
            if self.root.read_body && !end_of_stream {
                Action::Pause
            } else {
                Action::Continue
            }
        }

        fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
            if !self.root.read_body {
                return Action::Continue;
            }
            if !end_of_stream {
                return Action::Pause;
            }
            let length = self
                .get_http_request_body(0, body_size)
                .map_or(0, |body| body.len());
            self.set_http_request_header("x-floor-body-bytes", Some(&length.to_string()));
            let mut clock = 0;
            for _ in 0..self.root.clocks {
                clock ^= self
                    .get_current_time()
                    .elapsed()
                    .map_or(0, |d| d.as_nanos());
            }
            for i in 0..self.root.headers {
                let name = format!("x-floor-extra-{i}");
                self.set_http_request_header(&name, Some(&clock.to_string()));
            }
            let mut route_bytes = 0;
            for _ in 0..self.root.routes {
                route_bytes += self
                    .get_property(vec!["xds", "route_name"])
                    .map_or(0, |name| name.len());
            }
            for _ in 0..self.root.counters {
                let _ = hostcalls::increment_metric(self.root.counter, 1);
            }
            if route_bytes > usize::MAX / 2 {
                self.set_http_request_header("x-floor-route-bytes", Some(&route_bytes.to_string()));
            }
            let _ = hostcalls::call_foreign_function("clear_route_cache", Some(&[]));
            if let Some(cluster) = &self.root.grpc_cluster {
                let timeout = std::time::Duration::from_secs(1);
                let call = hostcalls::dispatch_grpc_call(
                    cluster,
                    "cohort.v1.Batcher",
                    "Status",
                    Vec::new(),
                    Some(&[]),
                    timeout,
                );
                if call.is_ok() {
                    return Action::Pause;
                }
            }
            Action::Continue
        }

        fn on_http_response_body(&mut self, body_size: usize, _end_of_stream: bool) -> Action {
            let mut read = 0;
            for _ in 0..self.root.responses {
                read += self
                    .get_http_response_body(0, body_size)
                    .map_or(0, |body| body.len());
            }
            if read > usize::MAX / 2 {
                self.set_http_response_header("x-floor-read", Some(&read.to_string()));
            }
            Action::Continue
        }
    }
}

#[cfg(target_arch = "wasm32")]
proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn proxy_wasm::traits::RootContext> {
        Box::new(floor::FloorRoot::default())
    });
}}
