//! An Anthropic-compatible server (`POST /v1/messages`). Bodies go unchanged: prompt
//! caching there is asked for by the client's own `cache_control` blocks, which the front
//! never rewrites. Followers wait for the leader's prefill so they find its cache entry.
//! No metrics page; health is `GET /v1/models`.

use super::{Engine, EngineKind};

pub struct AnthropicCompatible;

impl Engine for AnthropicCompatible {
    fn kind(&self) -> EngineKind {
        EngineKind::Anthropic
    }

    fn health_path(&self) -> &'static str {
        "/v1/models"
    }

    fn metrics_path(&self) -> Option<&'static str> {
        None
    }
}
