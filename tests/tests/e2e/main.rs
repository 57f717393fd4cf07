//! Cohort's cross-component tests, one test binary with a module per subject (the crate's
//! dependencies link once). Each module starts what it needs through the harness in
//! `tests/src` (`cohort_tests`); names read `module::test`, e.g.
//! `cargo test -p cohort-tests --test e2e -- batcher_assign::`.
//!
//! Tests that take the whole machine (load at saturation, real engines, latency claims)
//! hold [`cohort_tests::one_at_a_time`] for their duration: with every module in one
//! process it serialises them all. Nothing here relies on per-process state of its own:
//! files and directories a test writes carry a free port or a unique tag in their names.

mod alerts;
mod assign_live_load;
mod assign_prefetch;
mod audit;
mod bad_inputs;
mod batch_front;
mod batch_knobs;
mod batch_llama;
mod batcher_assign;
mod batcher_image;
mod endpoint_picker;
mod engine_discovery;
mod engine_faults;
mod engines_llama;
mod envoy_filter;
mod exact_residency;
mod holdout_report;
mod inspector_ui;
mod istio_manifests;
mod knob_table;
mod kv_events;
mod mesh_rehearsal;
mod response_stats;
mod rollout_breaker;
mod shipped_breaker;
mod soak;
mod tenant_isolation;
mod wasm_parity;
