//! A generic OpenAI-compatible server (a hosted API, a gateway, an engine without its own
//! adapter). Nothing engine-specific is sent; followers wait for the leader's prefill,
//! which helps any server with automatic prefix caching and costs little on others.
//! There is no standard metrics page; health is `GET /v1/models`.

use super::{Engine, EngineKind};

pub struct OpenAiCompatible;

impl Engine for OpenAiCompatible {
    fn kind(&self) -> EngineKind {
        EngineKind::OpenAi
    }

    fn health_path(&self) -> &'static str {
        "/v1/models"
    }

    fn metrics_path(&self) -> Option<&'static str> {
        None
    }
}
