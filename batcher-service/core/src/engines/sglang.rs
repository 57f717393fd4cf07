//! SGLang (`sglang.launch_server`, OpenAI-compatible routes).
//!
//! RadixAttention shares prefixes between all running requests once computed: followers
//! wait for the leader's prefill ([`Release::AfterLeaderPrefill`]).
//! Metrics (`--enable-metrics`): `sglang:prompt_tokens_total`, `sglang:cached_tokens_total`,
//! `sglang:token_usage` (KV pool usage, 0–1), `sglang:num_running_reqs`,
//! `sglang:num_queue_reqs`. LoRA (`--enable-lora`): `POST /load_lora_adapter`
//! `{"lora_name", "lora_path"}`, `POST /unload_lora_adapter` `{"lora_name"}`.
//!
//! Tested against fixtures that follow SGLang's published metric names and API shapes,
//! not a live server (it does not run on this project's CPU-only CI machines).

use super::{prometheus, Call, Engine, EngineKind, EngineMetrics, LoraAdapter};
use serde_json::json;

pub struct Sglang;

impl Engine for Sglang {
    fn kind(&self) -> EngineKind {
        EngineKind::Sglang
    }

    fn parse_metrics(&self, text: &str) -> EngineMetrics {
        EngineMetrics {
            prompt_tokens_total: prometheus::sum(text, "sglang:prompt_tokens_total"),
            cached_tokens_total: prometheus::sum(text, "sglang:cached_tokens_total"),
            kv_usage: prometheus::sum(text, "sglang:token_usage"),
            running: prometheus::sum(text, "sglang:num_running_reqs"),
            waiting: prometheus::sum(text, "sglang:num_queue_reqs"),
        }
    }

    fn lora_load(&self, adapter: &LoraAdapter) -> Option<Call> {
        Some(Call {
            path: "/load_lora_adapter",
            body: json!({"lora_name": adapter.name, "lora_path": adapter.path}),
        })
    }

    fn lora_unload(&self, adapter: &LoraAdapter) -> Option<Call> {
        Some(Call {
            path: "/unload_lora_adapter",
            body: json!({"lora_name": adapter.name}),
        })
    }
}
