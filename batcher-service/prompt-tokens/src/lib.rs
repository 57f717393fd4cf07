//! A request body → the token ids the engine will prefill → the keys of its blocks, so the
//! router can ask each replica's KV events residency (`cohort-kv-events`) how much of the
//! prompt that engine holds.
//!
//! The engine's cache is keyed by tokens, and the tokens are the model's: the chat
//! template renders the messages into one prompt string, and the tokenizer turns that into
//! ids. Cohort's own fingerprint (the canonical JSON's byte blocks) cannot stand in for
//! them: it sorts tool keys and drops `cache_control`, so it names the same prompts, not
//! the same tokens. Two ways to get the engine's tokens:
//!
//! - [`model::ModelTokens`]: the model's own files, as vLLM reads them: `tokenizer.json`
//!   (Hugging Face `tokenizers`), the chat template (`tokenizer_config.json`'s
//!   `chat_template`, else `chat_template.jinja`, rendered by minijinja with Python's
//!   string methods) and the special tokens it names. Chat requests are rendered with
//!   `add_generation_prompt` and encoded without adding special tokens (the template
//!   writes them), as vLLM's chat endpoint does; a completions `prompt` string is encoded
//!   with them, as vLLM's completions endpoint does.
//! - [`PromptTokenizer::EngineSim`]: `cohort engine-sim`'s fixed template and
//!   4-bytes-per-token tokenizer, for simulated replicas.
//!
//! [`Prompts::keys`] then cuts the ids into the engine's block size and chains the blocks'
//! keys exactly as the residency index keys the engine's stored blocks
//! (`cohort_kv_events::residency::prefix_keys`).
//!
//! Pure: loading reads the model's files once; a request touches no I/O. Every failure is a
//! typed [`PromptError`], so a body the engine would refuse (or that the template rejects)
//! gets no exact residency and is decided on the modelled one.

pub mod model;

use cohort_engine_sim::render;
use serde_json::Value;
use thiserror::Error;

pub use model::ModelTokens;

/// Which OpenAI API a body is for (the path's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/chat/completions`: `messages`, rendered by the chat template.
    Chat,
    /// `/v1/completions`: a `prompt` string, encoded as it is.
    Completions,
}

/// Why a body has no token ids.
#[derive(Debug, Error)]
pub enum PromptError {
    #[error("reading {path}: {reason}")]
    Load { path: String, reason: String },
    #[error("the body is not a JSON object")]
    NotObject,
    #[error("the body is not JSON: {0}")]
    NotJson(String),
    #[error("{0}")]
    Body(String),
    #[error("the chat template failed: {0}")]
    Template(String),
    #[error("the tokenizer failed: {0}")]
    Tokenizer(String),
}

/// How request bodies become the engine's token ids.
pub enum PromptTokenizer {
    /// The model's tokenizer and chat template.
    Model(Box<ModelTokens>),
    /// `cohort engine-sim`'s template and tokenizer.
    EngineSim,
}

impl PromptTokenizer {
    /// The prompt text the engine tokenizes for `body` on `api`, and whether the tokenizer
    /// adds its special tokens to it.
    pub fn render(&self, api: Api, body: &[u8]) -> Result<(String, bool), PromptError> {
        match self {
            PromptTokenizer::Model(model) => model.render_request(api, &object(body)?),
            PromptTokenizer::EngineSim => {
                let api = match api {
                    Api::Chat => render::Api::Chat,
                    Api::Completions => render::Api::Completions,
                };
                let request =
                    render::parse(api, body).map_err(|e| PromptError::Body(e.to_string()))?;
                Ok((request.prompt, false))
            }
        }
    }

    /// The token ids of a rendered prompt.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, PromptError> {
        match self {
            PromptTokenizer::Model(model) => model.encode(text, add_special_tokens),
            PromptTokenizer::EngineSim => Ok(cohort_engine_sim::tokenizer::tokenize(text)),
        }
    }

    /// The token ids the engine prefills for `body` on `api`.
    pub fn tokens(&self, api: Api, body: &[u8]) -> Result<Vec<u32>, PromptError> {
        let (text, add_special_tokens) = self.render(api, body)?;
        self.encode(&text, add_special_tokens)
    }
}

/// A prompt's block keys, and how many tokens it has in all (the last, partial block has
/// no key: engines cache full blocks only).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PromptKeys {
    pub keys: Vec<u64>,
    /// The prompt's tokens (estimated when it was cut: [`Prompts::new`]).
    pub tokens: usize,
    /// The engine's block size, tokens.
    pub block_size: usize,
    /// Whether `keys` run to the prompt's last full block (`false`: the prompt was longer
    /// than the bytes tokenized, and the keys cover its beginning).
    pub whole: bool,
}

impl PromptKeys {
    /// The share of the prompt's tokens in its first `blocks` blocks, 0.0 to 1.0.
    pub fn share_of(&self, blocks: usize) -> f64 {
        if self.tokens == 0 {
            return 0.0;
        }
        ((blocks * self.block_size) as f64 / self.tokens as f64).min(1.0)
    }
}

/// The tokenizer, the engines' block size, and how much of a prompt is tokenized.
pub struct Prompts {
    tokenizer: PromptTokenizer,
    block_size: usize,
    max_prompt_bytes: usize,
}

impl Prompts {
    /// Prompts keyed in blocks of `block_size` tokens. A rendered prompt longer than
    /// `max_prompt_bytes` is tokenized up to that many bytes (a model's tokenizer costs
    /// about a microsecond per token, docs/KV-EVENTS.md): its keys cover that beginning,
    /// less the last block (the cut may have split a token), and its token count is
    /// estimated at the tokenized part's bytes per token.
    pub fn new(tokenizer: PromptTokenizer, block_size: u32, max_prompt_bytes: usize) -> Prompts {
        Prompts {
            tokenizer,
            block_size: block_size.max(1) as usize,
            max_prompt_bytes: max_prompt_bytes.max(1),
        }
    }

    /// The block keys of `body`'s prompt on `api`.
    pub fn keys(&self, api: Api, body: &[u8]) -> Result<PromptKeys, PromptError> {
        let (text, add_special_tokens) = self.tokenizer.render(api, body)?;
        let mut cut = text.len().min(self.max_prompt_bytes);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let tokens = self.tokenizer.encode(&text[..cut], add_special_tokens)?;
        let mut keys = cohort_kv_events::residency::prefix_keys(&tokens, self.block_size);
        let whole = cut == text.len();
        let total = if whole || cut == 0 {
            tokens.len()
        } else {
            keys.pop();
            (tokens.len() as f64 * text.len() as f64 / cut as f64).round() as usize
        };
        Ok(PromptKeys {
            keys,
            tokens: total,
            block_size: self.block_size,
            whole,
        })
    }
}

fn object(body: &[u8]) -> Result<serde_json::Map<String, Value>, PromptError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(PromptError::NotObject),
        Err(e) => Err(PromptError::NotJson(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_sim_keys_are_the_simulators_blocks() {
        let prompts = Prompts::new(PromptTokenizer::EngineSim, 4, 1 << 20);
        let body = br#"{"messages":[{"role":"system","content":"You are a helpful bank assistant."},{"role":"user","content":"hi"}]}"#;
        let keys = prompts.keys(Api::Chat, body).unwrap();
        let rendered = "system\nYou are a helpful bank assistant.\nuser\nhi\n";
        let ids = cohort_engine_sim::tokenizer::tokenize(rendered);
        assert_eq!(keys.tokens, ids.len());
        assert_eq!(
            keys.keys,
            cohort_kv_events::residency::prefix_keys(&ids, 4),
            "the same chain the residency index builds from the simulator's events"
        );
        assert_eq!(keys.keys.len(), ids.len() / 4);
        assert!(keys.whole);
        assert_eq!(
            keys.share_of(keys.keys.len()),
            (keys.keys.len() * 4) as f64 / ids.len() as f64
        );
        assert_eq!(keys.share_of(1000), 1.0);
    }

    #[test]
    fn bodies_the_engine_would_refuse_have_no_keys() {
        let prompts = Prompts::new(PromptTokenizer::EngineSim, 16, 1 << 20);
        for body in [
            &b"not json"[..],
            b"[1]",
            br#"{"messages": []}"#,
            br#"{"prompt": 3}"#,
        ] {
            assert!(
                prompts.keys(Api::Chat, body).is_err()
                    || prompts.keys(Api::Completions, body).is_err()
            );
        }
        assert!(matches!(
            Prompts::new(PromptTokenizer::EngineSim, 16, 1 << 20).keys(Api::Chat, b"{}"),
            Err(PromptError::Body(_))
        ));
        assert_eq!(PromptKeys::default().share_of(3), 0.0);
    }

    #[test]
    fn a_prompt_past_max_prompt_bytes_is_keyed_by_its_beginning() {
        // "user\n" + 4,000 bytes + "\n": 1,002 simulator tokens, 62 blocks of 16.
        let body =
            serde_json::json!({"messages": [{"role": "user", "content": "ab".repeat(2000)}]})
                .to_string();
        let whole = Prompts::new(PromptTokenizer::EngineSim, 16, 1 << 20)
            .keys(Api::Chat, body.as_bytes())
            .unwrap();
        assert_eq!(
            (whole.tokens, whole.keys.len(), whole.whole),
            (1002, 62, true)
        );
        // Cut at 1,000 bytes (250 tokens, 15 full blocks): 14 keys, the same as the whole
        // prompt's first 14, and the total estimated from the bytes.
        let cut = Prompts::new(PromptTokenizer::EngineSim, 16, 1_000)
            .keys(Api::Chat, body.as_bytes())
            .unwrap();
        assert_eq!(cut.keys[..], whole.keys[..14]);
        assert!(!cut.whole);
        assert_eq!(cut.tokens, 1002);
        // A cut inside a multi-byte character moves back to its start.
        let wide = serde_json::json!({"messages": [{"role": "user", "content": "é".repeat(100)}]})
            .to_string();
        let keys = Prompts::new(PromptTokenizer::EngineSim, 1, 8)
            .keys(Api::Chat, wide.as_bytes())
            .unwrap();
        assert!(!keys.whole && keys.tokens > 0);
    }
}
