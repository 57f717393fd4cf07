//! `cohort engine-sim`: an OpenAI-compatible LLM engine simulator, for benchmarks at a scale
//! the real engines on a 2-core box cannot reach (docs/BENCHMARKS.md).
//!
//! One process runs N independent replicas, each an HTTP server on its own port that answers
//! like vLLM (`/v1/chat/completions`, `/v1/completions`, `/metrics` with vLLM's names,
//! `/tokenize`, the render endpoints vllm-router calls, the info endpoints sglang-router probes).
//! What matters for routing benchmarks is simulated faithfully and nothing else is: the
//! output text is filler, but timing, prefix-cache hits and queueing follow the model below.
//!
//! # Model
//!
//! **Tokens** ([`tokenizer`]): one token per 4 bytes of the rendered prompt ([`render`]), so
//! every component (server, `bound`, the harness) counts the same tokens without a vocabulary.
//!
//! **Prefix KV cache** ([`cache`]): per replica, like vLLM's automatic prefix caching. A
//! prompt is cut into full blocks of `block_tokens` tokens; block i's hash chains block i−1's
//! (so a block matches only under the same whole prefix; an optional `cache_salt` seeds the
//! chain, as in vLLM). The cache is an LRU of `kv_blocks` block hashes. A request's cached
//! tokens are its longest run of leading blocks found in the cache, never the whole prompt
//! (at least one token is computed, block-aligned, as vLLM v1 does). After its prefill all its
//! full blocks are inserted or touched, tail first, so eviction takes a prefix's tail before
//! its head (vLLM frees blocks in reverse order for the same reason).
//!
//! **Cost** ([`cost`]; every duration × `time_scale`):
//! - prefill runs on one FIFO lane per replica: `prefill_ms = prefill_base_ms +
//!   prefill_ms_per_token × uncached (+ prefill_attention_ms × uncached × cached)`. Real
//!   continuous-batching engines interleave prefills with decodes, but the compute is shared,
//!   so the sum of prefill work per second is what bounds throughput; one lane is the simplest
//!   model that keeps that sum right and makes queueing behind long prompts visible;
//! - at most `slots` requests run at once (the others wait, FIFO, and show up in
//!   `vllm:num_requests_waiting`); a request holds its slot from its prefill to its last token;
//! - the first output token comes with the end of the prefill (TTFT = queue + prefill); each
//!   later token takes `decode_ms_per_token × (1 + decode_batch_slowdown × (running − 1))`,
//!   with `running` sampled per token.
//!
//! **KV cache events** ([`events`]; `--kv-events-port`): each replica can publish its cache's
//! stores, evictions and resets as vLLM's ZeroMQ KV events stream, replays included, so a
//! consumer of vLLM's stream can follow the simulated caches exactly.
//!
//! The constants come from a calibration file written by `cohort_tools/bench/engine_sim_calibrate.py`
//! against a real llama-server ([`calibration`]); the committed one is the default.
//!
//! The core (every module but [`server`]) is pure: no I/O, no clock; times are milliseconds
//! passed in by the caller. [`server`] is the thin axum layer around it.

pub mod bound;
pub mod cache;
pub mod calibration;
pub mod cost;
pub mod events;
pub mod metrics;
pub mod render;
pub mod replica;
pub mod server;
pub mod tokenizer;
