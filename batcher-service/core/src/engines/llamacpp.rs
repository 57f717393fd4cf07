//! llama.cpp `llama-server`.
//!
//! Its prompt cache is per slot (`-np N` slots): a request reuses the prefix of whatever
//! the slot it lands on ran last, and two slots never share a prefix while one is still
//! computing it. Measured here with a 980-token shared system prompt and 2 slots: four
//! same-prefix requests sent together computed the prefix twice (TTFT 5.5–11.6 s); sent
//! to one slot they computed it once. So a cohort is pinned to one slot with the
//! server's `id_slot` field and the server queues its members behind the leader
//! ([`Release::SameSlot`]).
//!
//! Metrics (`--metrics`): `llamacpp:prompt_tokens_total`, `llamacpp:prompt_tokens_cached_total`,
//! `llamacpp:requests_processing`, `llamacpp:requests_deferred`, and, in builds that have
//! it, `llamacpp:kv_cache_usage_ratio`. LoRA adapters are fixed at start (`--lora`), so
//! none are loaded at run time.

use super::{prometheus, Engine, EngineKind, EngineMetrics, Member, Release};
use serde_json::{Map, Value};

pub struct LlamaCpp;

impl Engine for LlamaCpp {
    fn kind(&self) -> EngineKind {
        EngineKind::LlamaCpp
    }

    fn release(&self) -> Release {
        Release::SameSlot
    }

    fn prepare(&self, body: &mut Map<String, Value>, member: &Member<'_>) {
        if let Some(slot) = member.slot {
            body.insert("id_slot".to_owned(), Value::from(slot));
        }
    }

    fn parse_metrics(&self, text: &str) -> EngineMetrics {
        EngineMetrics {
            prompt_tokens_total: prometheus::sum(text, "llamacpp:prompt_tokens_total"),
            cached_tokens_total: prometheus::sum(text, "llamacpp:prompt_tokens_cached_total"),
            kv_usage: prometheus::sum(text, "llamacpp:kv_cache_usage_ratio"),
            running: prometheus::sum(text, "llamacpp:requests_processing"),
            waiting: prometheus::sum(text, "llamacpp:requests_deferred"),
        }
    }
}
