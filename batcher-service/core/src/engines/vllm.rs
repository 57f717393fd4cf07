//! vLLM (OpenAI-compatible server, `--enable-prefix-caching`).
//!
//! Its automatic prefix cache is shared by all requests, in whole blocks, once a block is
//! computed: followers sent after the leader's first token find the prefix cached
//! ([`Release::AfterLeaderPrefill`]). Each request carries `cache_salt` =
//! [`super::cache_salt`] (keyed by the deployment secret, the tenant and the client's own
//! salt), so one tenant's cached blocks never serve another's (vLLM mixes the salt into the
//! first block's hash). Measured on a live vLLM: same prompt, salts a, b, a → cached 0, 0,
//! 512 tokens (`tests/fixtures/engines/vllm/cache-salt.json`).
//!
//! Metrics: `vllm:prompt_tokens_total`, `vllm:prompt_tokens_cached_total` (with
//! `--enable-prompt-tokens-details`), `vllm:kv_cache_usage_perc` (V1; `vllm:gpu_cache_usage_perc`
//! before), `vllm:num_requests_running`, `vllm:num_requests_waiting`.
//! LoRA (with `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`): `POST /v1/load_lora_adapter`
//! `{"lora_name", "lora_path"}` and `POST /v1/unload_lora_adapter` `{"lora_name"}`.

use super::{prometheus, Call, Engine, EngineKind, EngineMetrics, LoraAdapter, Member};
use serde_json::{json, Map, Value};

pub struct Vllm;

impl Engine for Vllm {
    fn kind(&self) -> EngineKind {
        EngineKind::Vllm
    }

    fn prepare(&self, body: &mut Map<String, Value>, member: &Member<'_>) {
        if let Some(salt) = member.salt {
            body.insert("cache_salt".to_owned(), Value::from(salt));
        }
    }

    fn parse_metrics(&self, text: &str) -> EngineMetrics {
        EngineMetrics {
            prompt_tokens_total: prometheus::sum(text, "vllm:prompt_tokens_total"),
            cached_tokens_total: prometheus::sum(text, "vllm:prompt_tokens_cached_total"),
            kv_usage: prometheus::first(
                text,
                &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
            ),
            running: prometheus::sum(text, "vllm:num_requests_running"),
            waiting: prometheus::sum(text, "vllm:num_requests_waiting"),
        }
    }

    fn lora_load(&self, adapter: &LoraAdapter) -> Option<Call> {
        Some(Call {
            path: "/v1/load_lora_adapter",
            body: json!({"lora_name": adapter.name, "lora_path": adapter.path}),
        })
    }

    fn lora_unload(&self, adapter: &LoraAdapter) -> Option<Call> {
        Some(Call {
            path: "/v1/unload_lora_adapter",
            body: json!({"lora_name": adapter.name}),
        })
    }
}
