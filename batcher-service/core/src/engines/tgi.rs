//! Hugging Face Text Generation Inference (`/v1/chat/completions`, `/v1/completions`).
//!
//! TGI 3 caches prefixes across requests once computed: followers wait for the leader's
//! prefill. Its metrics have no cached-token counter; the front reads the queue
//! (`tgi_queue_size`) and the running batch (`tgi_batch_current_size`), and prompt tokens
//! from the input-length histogram's sum (`tgi_request_input_length_sum`).
//! LoRA adapters are fixed at start (`LORA_ADAPTERS`).
//!
//! Tested against fixtures that follow TGI's published metric names, not a live server.

use super::{prometheus, Engine, EngineKind, EngineMetrics};

pub struct Tgi;

impl Engine for Tgi {
    fn kind(&self) -> EngineKind {
        EngineKind::Tgi
    }

    fn parse_metrics(&self, text: &str) -> EngineMetrics {
        EngineMetrics {
            prompt_tokens_total: prometheus::sum(text, "tgi_request_input_length_sum"),
            cached_tokens_total: None,
            kv_usage: None,
            running: prometheus::sum(text, "tgi_batch_current_size"),
            waiting: prometheus::sum(text, "tgi_queue_size"),
        }
    }
}
