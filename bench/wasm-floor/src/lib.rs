//! # cohort-wasm-floor — the least a proxy-wasm filter can do, for `bench/filter_overhead.py`
//!
//! The filter-overhead benchmark compares Envoy + buffer filter with Envoy + the Cohort
//! filter. Part of what it measures is not Cohort's work but the price of being a wasm
//! filter at all: Envoy creates a context in the VM for every request and calls into V8 on
//! every stream event. This module pays only that price, so the benchmark can show how
//! much of the gap any proxy-wasm filter would leave, and how much is the fingerprint.
//!
//! Its plugin configuration picks one of two behaviours:
//! - `noop`: answer `Continue` to every callback (run behind Envoy's buffer filter, like
//!   the baseline): the cost of a wasm HTTP context and its callbacks;
//! - `body` (any other value): what any filter that routes on the body must do, in the
//!   fewest hostcalls — pause on the request headers, let Envoy buffer the body, read it
//!   once complete, write one request header and clear the route cache, continue.
//!
//! It is not part of the product; `scripts/build-wasm` builds it next to the filter.

#[cfg(target_arch = "wasm32")]
mod floor {
    use proxy_wasm::hostcalls;
    use proxy_wasm::traits::{Context, HttpContext, RootContext};
    use proxy_wasm::types::{Action, ContextType};

    #[derive(Default)]
    pub struct FloorRoot {
        read_body: bool,
    }

    impl Context for FloorRoot {}

    impl RootContext for FloorRoot {
        fn on_configure(&mut self, _size: usize) -> bool {
            self.read_body = self.get_plugin_configuration().as_deref() != Some(b"noop");
            true
        }

        fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
            Some(Box::new(FloorHttp {
                read_body: self.read_body,
            }))
        }

        fn get_type(&self) -> Option<ContextType> {
            Some(ContextType::HttpContext)
        }
    }

    struct FloorHttp {
        read_body: bool,
    }

    impl Context for FloorHttp {}

    impl HttpContext for FloorHttp {
        fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
            if self.read_body && !end_of_stream {
                Action::Pause
            } else {
                Action::Continue
            }
        }

        fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
            if !self.read_body {
                return Action::Continue;
            }
            if !end_of_stream {
                return Action::Pause;
            }
            let length = self
                .get_http_request_body(0, body_size)
                .map_or(0, |body| body.len());
            self.set_http_request_header("x-floor-body-bytes", Some(&length.to_string()));
            let _ = hostcalls::call_foreign_function("clear_route_cache", Some(&[]));
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
