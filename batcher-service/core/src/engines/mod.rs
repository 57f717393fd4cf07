//! Engine adapters: what differs between inference servers, as pure functions.
//!
//! The batch front speaks the OpenAI and Anthropic HTTP APIs to every engine; what differs
//! is small but matters for prefix reuse, and each difference lives in one adapter module
//! behind the [`Engine`] trait:
//! - how followers reuse their leader's prefix ([`Release`]): llama.cpp caches per slot,
//!   so a cohort is pinned to one slot (`id_slot`); vLLM and SGLang share a block cache;
//! - per-tenant cache isolation (vLLM's `cache_salt`);
//! - where health and Prometheus metrics are, and what the metrics are called (cached
//!   prompt tokens, KV-cache usage, queue depth);
//! - LoRA adapters: how to load and unload one at run time, if the engine can.
//!
//! Adapters never do I/O: they rewrite JSON bodies, name paths and parse text, so each is
//! tested on recorded engine output (`tests/fixtures/engines/`). The front in
//! `cohort-cli` does the HTTP.

pub mod anthropic;
pub mod llamacpp;
pub mod openai;
pub mod prometheus;
pub mod sglang;
pub mod tgi;
pub mod vllm;

pub use crate::batch::Release;
use cohort_fingerprint::canonical::Role;
use serde_json::{Map, Value};
use thiserror::Error;

/// The engines the front knows, by their configuration name (`engine = "vllm"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Deserialize)]
#[serde(try_from = "String")]
pub enum EngineKind {
    #[default]
    LlamaCpp,
    Vllm,
    Sglang,
    Tgi,
    OpenAi,
    Anthropic,
}

#[derive(Debug, Error, PartialEq, Eq)]
#[error("unknown engine {0:?} (expected llamacpp, vllm, sglang, tgi, openai or anthropic)")]
pub struct UnknownEngine(pub String);

impl TryFrom<String> for EngineKind {
    type Error = UnknownEngine;
    fn try_from(name: String) -> Result<EngineKind, UnknownEngine> {
        EngineKind::parse(&name)
    }
}

impl EngineKind {
    pub const ALL: [EngineKind; 6] = [
        EngineKind::LlamaCpp,
        EngineKind::Vllm,
        EngineKind::Sglang,
        EngineKind::Tgi,
        EngineKind::OpenAi,
        EngineKind::Anthropic,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::LlamaCpp => "llamacpp",
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
            EngineKind::Tgi => "tgi",
            EngineKind::OpenAi => "openai",
            EngineKind::Anthropic => "anthropic",
        }
    }

    pub fn parse(name: &str) -> Result<EngineKind, UnknownEngine> {
        EngineKind::ALL
            .into_iter()
            .find(|k| k.as_str() == name)
            .ok_or_else(|| UnknownEngine(name.to_owned()))
    }

    /// The adapter for this kind.
    pub fn adapter(self) -> &'static dyn Engine {
        match self {
            EngineKind::LlamaCpp => &llamacpp::LlamaCpp,
            EngineKind::Vllm => &vllm::Vllm,
            EngineKind::Sglang => &sglang::Sglang,
            EngineKind::Tgi => &tgi::Tgi,
            EngineKind::OpenAi => &openai::OpenAiCompatible,
            EngineKind::Anthropic => &anthropic::AnthropicCompatible,
        }
    }
}

/// The request APIs the front serves, by path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrontApi {
    ChatCompletions,
    Completions,
    Responses,
    Messages,
}

impl FrontApi {
    pub fn from_path(path: &str) -> Option<FrontApi> {
        match path {
            "/v1/chat/completions" => Some(FrontApi::ChatCompletions),
            "/v1/completions" => Some(FrontApi::Completions),
            "/v1/responses" => Some(FrontApi::Responses),
            "/v1/messages" => Some(FrontApi::Messages),
            _ => None,
        }
    }

    /// The front's API for a request shape the fingerprint recognised (its path read as
    /// the filter reads it: [`cohort_fingerprint::api::api_from_path`]).
    pub fn of(api: cohort_fingerprint::Api) -> FrontApi {
        use cohort_fingerprint::Api;
        match api {
            Api::OpenAiChat => FrontApi::ChatCompletions,
            Api::OpenAiCompletions => FrontApi::Completions,
            Api::OpenAiResponses => FrontApi::Responses,
            Api::AnthropicMessages => FrontApi::Messages,
        }
    }

    pub fn path(self) -> &'static str {
        match self {
            FrontApi::ChatCompletions => "/v1/chat/completions",
            FrontApi::Completions => "/v1/completions",
            FrontApi::Responses => "/v1/responses",
            FrontApi::Messages => "/v1/messages",
        }
    }

    /// The body field that bounds the output length.
    pub fn max_tokens_field(self) -> &'static str {
        match self {
            FrontApi::Responses => "max_output_tokens",
            _ => "max_tokens",
        }
    }
}

/// Who a dispatched request is, for the adapter's body rewrite.
#[derive(Debug, Clone, Copy, Default)]
pub struct Member<'a> {
    /// The engine cache salt for this request ([`cache_salt`]), if it has a tenant or
    /// asked for one.
    pub salt: Option<&'a str>,
    /// The slot the cohort is pinned to, for engines with [`Release::SameSlot`].
    pub slot: Option<usize>,
}

/// The engine prefix-cache salt of a request: 64 hex characters of
/// SHA-256(secret ‖ tenant ‖ the client's own salt), or `None` when the request has
/// neither a tenant nor a salt of its own (it then shares the cache, as without Cohort).
///
/// Keyed by the deployment secret, a salt cannot be guessed from a tenant's name, so one
/// tenant cannot probe another's cached prefixes by timing (vLLM asks for unguessable
/// salts); mixing in the client's salt keeps a client's own partitioning without letting
/// it reach into another tenant's. Hex only: vLLM refuses salts with `/`, `@`, `\`.
pub fn cache_salt(
    secret: &[u8],
    tenant: Option<&str>,
    client_salt: Option<&str>,
) -> Option<String> {
    use sha2::{Digest, Sha256};
    if tenant.is_none_or(str::is_empty) && client_salt.is_none_or(str::is_empty) {
        return None;
    }
    let mut hash = Sha256::new();
    for part in [
        secret,
        tenant.unwrap_or("").as_bytes(),
        client_salt.unwrap_or("").as_bytes(),
    ] {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part);
    }
    Some(hash.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// What the front reads from an engine's `/metrics`. Absent values are `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineMetrics {
    /// Prompt tokens processed, total (counter).
    pub prompt_tokens_total: Option<f64>,
    /// Prompt tokens served from the prefix cache, total (counter).
    pub cached_tokens_total: Option<f64>,
    /// KV-cache usage, 0–1.
    pub kv_usage: Option<f64>,
    /// Requests being processed.
    pub running: Option<f64>,
    /// Requests waiting for a slot.
    pub waiting: Option<f64>,
}

/// An HTTP call the front makes on the adapter's behalf (LoRA load or unload).
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub path: &'static str,
    pub body: Value,
}

/// A LoRA adapter as configured: the name requests use as `model`, and where it lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraAdapter {
    pub name: String,
    pub path: String,
}

/// One engine's differences. See the module documentation.
pub trait Engine: Send + Sync {
    fn kind(&self) -> EngineKind;

    /// How followers reuse their leader's prefix on this engine.
    fn release(&self) -> Release {
        Release::AfterLeaderPrefill
    }

    /// Rewrites a request body before it is sent (slot pinning, cache salt, ...). The
    /// default sends it unchanged.
    fn prepare(&self, _body: &mut Map<String, Value>, _member: &Member<'_>) {}

    /// The liveness path the front probes.
    fn health_path(&self) -> &'static str {
        "/health"
    }

    /// Where the engine's Prometheus metrics are, if it has them.
    fn metrics_path(&self) -> Option<&'static str> {
        Some("/metrics")
    }

    /// Reads the metrics the front uses from a Prometheus text page.
    fn parse_metrics(&self, _text: &str) -> EngineMetrics {
        EngineMetrics::default()
    }

    /// The call that loads `adapter`, if the engine loads adapters at run time.
    fn lora_load(&self, _adapter: &LoraAdapter) -> Option<Call> {
        None
    }

    /// The call that unloads `adapter`.
    fn lora_unload(&self, _adapter: &LoraAdapter) -> Option<Call> {
        None
    }
}

/// A warm-up request from an exemplar body of a cohort: one output token, no streaming, and
/// only the part of the prompt the cohort shares where the API shows it. Sending it makes
/// the engine compute and cache the cohort's prefix, and no more.
///
/// - Chat completions with leading `system`/`developer` messages: those messages (and the
///   tools, which stay) and one empty user turn; the exemplar's own conversation, which the
///   next request of the cohort does not share, is not computed.
/// - Responses with `instructions`: the instructions (and tools) and an empty `input`.
/// - Anything else (no system prompt: a cohort grouped by intent; completions' bare
///   `prompt`; Anthropic messages, whose API refuses an empty turn): the whole exemplar,
///   as the shared part cannot be told from the rest.
pub fn warmup_body(api: FrontApi, exemplar: &Map<String, Value>) -> Map<String, Value> {
    let mut body = exemplar.clone();
    match api {
        FrontApi::ChatCompletions => {
            if let Some(Value::Array(messages)) = body.get_mut("messages") {
                // The fingerprint's own reading of a role, so the warm-up keeps exactly
                // the messages the cohort's stable prefix was hashed from.
                let system = messages
                    .iter()
                    .take_while(|m| {
                        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
                        Role::from_name(role) == Role::System
                    })
                    .count();
                if system > 0 && system < messages.len() {
                    messages.truncate(system);
                    messages.push(serde_json::json!({"role": "user", "content": ""}));
                }
            }
        }
        FrontApi::Responses => {
            if body.get("instructions").is_some_and(Value::is_string) {
                body.insert("input".to_owned(), Value::from(""));
                body.remove("previous_response_id");
            }
        }
        FrontApi::Completions | FrontApi::Messages => {}
    }
    for field in [
        "max_tokens",
        "max_completion_tokens",
        "max_output_tokens",
        "n",
        "best_of",
    ] {
        body.remove(field);
    }
    body.insert(api.max_tokens_field().to_owned(), Value::from(1));
    body.insert("stream".to_owned(), Value::Bool(false));
    body.remove("stream_options");
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for kind in EngineKind::ALL {
            assert_eq!(EngineKind::parse(kind.as_str()), Ok(kind));
            assert_eq!(kind.adapter().kind(), kind);
        }
        assert!(EngineKind::parse("triton")
            .unwrap_err()
            .to_string()
            .contains("triton"));
    }

    #[test]
    fn cache_salts_are_keyed_per_tenant_and_hex() {
        let a = cache_salt(b"secret", Some("org/team-a"), None).unwrap();
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(
            Some(&a),
            cache_salt(b"secret", Some("org/team-b"), None).as_ref()
        );
        assert_ne!(
            Some(&a),
            cache_salt(b"other", Some("org/team-a"), None).as_ref()
        );
        assert_ne!(
            Some(&a),
            cache_salt(b"secret", Some("org/team-a"), Some("x")).as_ref()
        );
        // Length-prefixed parts: moving bytes between tenant and client salt changes it.
        assert_ne!(
            cache_salt(b"s", Some("ab"), Some("c")),
            cache_salt(b"s", Some("a"), Some("bc"))
        );
        assert_eq!(cache_salt(b"secret", None, None), None);
        assert_eq!(cache_salt(b"secret", Some(""), Some("")), None);
        assert!(cache_salt(b"secret", None, Some("mine")).is_some());
    }

    #[test]
    fn paths_map_to_apis() {
        for api in [
            FrontApi::ChatCompletions,
            FrontApi::Completions,
            FrontApi::Responses,
            FrontApi::Messages,
        ] {
            assert_eq!(FrontApi::from_path(api.path()), Some(api));
        }
        assert_eq!(FrontApi::from_path("/v1/embeddings"), None);
    }

    #[test]
    fn a_warmup_asks_for_one_token_without_streaming() {
        let exemplar: Map<String, Value> = serde_json::from_str(
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":200,"stream":true,"stream_options":{"include_usage":true},"n":3}"#,
        )
        .unwrap();
        let body = warmup_body(FrontApi::ChatCompletions, &exemplar);
        assert_eq!(body["max_tokens"], 1);
        assert_eq!(body["stream"], false);
        assert!(!body.contains_key("stream_options") && !body.contains_key("n"));
        assert_eq!(body["messages"], exemplar["messages"]);
        let body = warmup_body(FrontApi::Responses, &exemplar);
        assert_eq!(body["max_output_tokens"], 1);
        assert!(!body.contains_key("max_tokens"));
    }

    #[test]
    fn a_warmup_computes_the_shared_prefix_not_the_exemplars_conversation() {
        let chat: Map<String, Value> = serde_json::from_str(
            r#"{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[
                {"role":"system","content":"You are the bank's assistant."},
                {"role":"developer","content":"Cite the policy."},
                {"role":"user","content":"My card was declined."},
                {"role":"assistant","content":"Which card?"},
                {"role":"user","content":"The debit card."}]}"#,
        )
        .unwrap();
        let body = warmup_body(FrontApi::ChatCompletions, &chat);
        assert_eq!(
            body["messages"],
            serde_json::json!([
                {"role":"system","content":"You are the bank's assistant."},
                {"role":"developer","content":"Cite the policy."},
                {"role":"user","content":""}
            ])
        );
        assert_eq!(body["tools"], chat["tools"], "tools are part of the prefix");
        // No system prompt: the cohort is an intent, nothing marks a shared part.
        let bare: Map<String, Value> = serde_json::from_str(
            r#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}"#,
        )
        .unwrap();
        assert_eq!(
            warmup_body(FrontApi::ChatCompletions, &bare)["messages"],
            bare["messages"]
        );
        let responses: Map<String, Value> = serde_json::from_str(
            r#"{"model":"m","instructions":"Be brief.","input":[{"role":"user","content":"long"}],"previous_response_id":"r1"}"#,
        )
        .unwrap();
        let body = warmup_body(FrontApi::Responses, &responses);
        assert_eq!(body["instructions"], "Be brief.");
        assert_eq!(body["input"], "");
        assert!(!body.contains_key("previous_response_id"));
        let messages: Map<String, Value> = serde_json::from_str(
            r#"{"model":"m","system":"Be brief.","messages":[{"role":"user","content":"hi"}]}"#,
        )
        .unwrap();
        assert_eq!(
            warmup_body(FrontApi::Messages, &messages)["messages"],
            messages["messages"]
        );
    }
}
