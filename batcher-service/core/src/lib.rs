//! The batcher's pure core: everything that decides, nothing that does I/O.
//!
//! - [`store`]: the fingerprint store (`Store` trait; sharded CPU store with TTL and LRU).
//! - [`cohorts`]: online clustering of sketches into cohorts.
//! - [`neighbours`]: each cohort's recent members, so a decision finds where similar requests went.
//! - [`policy`]: prefix-aware, load-bounded choice of an engine replica.
//! - [`batch`]: co-batching (which requests share a dispatch, and when each goes).
//! - [`engines`]: engine adapters (llama.cpp, vLLM, SGLang, TGI, OpenAI, Anthropic).
//! - [`predict`]: which cohorts come next (for prefetch warm-ups).
//!
//! The gRPC server, the HTTP endpoints and the CLI live in the `cohort-cli` crate and
//! stay thin over this one, so every decision here is tested directly with injected time.
//! Beside it, `cohort-score` measures the batch-friendliness of prompts (`cohort score`,
//! `cohort lint`) and `cohort-replay` replays traces through the policy.

pub mod batch;
pub mod cohorts;
pub mod engines;
pub mod neighbours;
pub mod policy;
pub mod predict;
pub mod store;
