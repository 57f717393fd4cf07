//! # cohort-filter — Cohort's proxy-wasm filter for Envoy
//!
//! Fingerprints every LLM API request passing through Envoy and writes the `x-cohort-*`
//! headers a VirtualService / DestinationRule (or Envoy routes and a ring-hash cluster)
//! route on. One small file per job, in the style of the proxy-wasm SDK examples:
//!
//! - [`config`]: the plugin configuration (JSON), defaults and validation;
//! - [`decision`]: what to do with a request, as pure functions (tested natively);
//! - [`batcher`]: the `cohort.v1` messages, shard choice, what an `Assign` answer becomes
//!   (headers, fallback, counter) and the observation outbox (pure);
//! - [`grpc_target`]: the target of the gRPC calls to a batcher shard (an Istio cluster
//!   name gets a valid authority);
//! - [`knob_effect`]: which client knob acts in which mode, and which a request set for
//!   nothing (`x-cohort-ignored`);
//! - [`rollout`]: the sampled share of users Cohort acts on, and the hold-out (pure);
//! - [`response_series`]: which series a response is counted in (its group: routed, held
//!   out or bypassed; its route and unit) and the stat names that carry them as tags (pure);
//! - [`usage`]: the cached prompt tokens an engine's response reports (pure);
//! - [`breaker`]: the automatic breaker that compares the two and switches Cohort off (pure);
//! - `stats`: the Envoy counters and histograms (`cohort_*`);
//! - `shared`: what the root context hands every HTTP context of its VM (configuration,
//!   stats, outbox, this worker's breaker outcomes), and the host clock in Unix ms;
//! - `root`: per-VM setup (configuration, stats), the `Observe` streams, and folding this
//!   worker's outcomes into the breaker all workers share;
//! - `http`: per-request glue between Envoy's callbacks, [`decision`] and [`batcher`]:
//!   buffering, dispatching `Assign` and writing what its answer became;
//! - `learned_table`: the learned cohorts' table in Envoy's shared data;
//! - `response_stats`: the per-group response stats' metrics and the shared route table.
//!
//! The proxy-wasm glue is compiled for wasm32 only; the pure modules build everywhere.

pub mod batcher;
pub mod breaker;
pub mod config;
pub mod decision;
pub mod grpc_target;
pub mod knob_effect;
pub mod response_series;
pub mod rollout;
pub mod usage;

#[cfg(target_arch = "wasm32")]
mod http;
#[cfg(target_arch = "wasm32")]
mod learned_table;
#[cfg(target_arch = "wasm32")]
mod response_stats;
#[cfg(target_arch = "wasm32")]
mod root;
#[cfg(target_arch = "wasm32")]
mod shared;
#[cfg(target_arch = "wasm32")]
mod stats;

#[cfg(target_arch = "wasm32")]
proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn proxy_wasm::traits::RootContext> {
        Box::new(root::CohortRoot::default())
    });
}}
