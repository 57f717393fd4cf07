//! The model's own tokenizer and chat template, read from its folder as vLLM reads them.
//!
//! - `tokenizer.json`: the Hugging Face tokenizer (model, normalizer, pre-tokenizer,
//!   added tokens), run by the `tokenizers` crate.
//! - `tokenizer_config.json`: the special tokens a template names (`bos_token`,
//!   `eos_token`; a string or `{"content": …}`) and, when present, `chat_template` (a
//!   string, or a list of named templates of which `default` is used).
//! - `chat_template.jinja`: the template, where `tokenizer_config.json` has none (newer
//!   checkpoints keep it apart).
//!
//! Rendering follows transformers' `apply_chat_template`: Jinja with `trim_blocks` and
//! `lstrip_blocks`, the context `messages`, `tools` (when the request has them),
//! `add_generation_prompt = true`, the special tokens, and `raise_exception(message)`;
//! Python's string and dict methods come from `minijinja-contrib`'s pycompat.

use crate::{Api, PromptError};
use minijinja::{Environment, ErrorKind};
use serde_json::{Map, Value};
use std::path::Path;
use tokenizers::Tokenizer;

/// The template's name in the environment.
const TEMPLATE: &str = "chat";

/// A model's tokenizer and chat template.
pub struct ModelTokens {
    tokenizer: Tokenizer,
    templates: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl ModelTokens {
    /// Reads the model folder `dir` (see the module documentation for the files).
    pub fn load(dir: &Path) -> Result<ModelTokens, PromptError> {
        let tokenizer_path = dir.join("tokenizer.json");
        let tokenizer = Tokenizer::from_file(&tokenizer_path).map_err(|e| PromptError::Load {
            path: tokenizer_path.display().to_string(),
            reason: e.to_string(),
        })?;
        let config_path = dir.join("tokenizer_config.json");
        let config: Map<String, Value> = match std::fs::read(&config_path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| PromptError::Load {
                path: config_path.display().to_string(),
                reason: e.to_string(),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Map::new(),
            Err(e) => {
                return Err(PromptError::Load {
                    path: config_path.display().to_string(),
                    reason: e.to_string(),
                })
            }
        };
        let template = match chat_template_of(&config) {
            Some(template) => template,
            None => {
                let path = dir.join("chat_template.jinja");
                std::fs::read_to_string(&path).map_err(|e| PromptError::Load {
                    path: path.display().to_string(),
                    reason: format!("{e} (and tokenizer_config.json has no chat_template)"),
                })?
            }
        };
        Self::new(
            tokenizer,
            template,
            special(&config, "bos_token"),
            special(&config, "eos_token"),
        )
    }

    /// A tokenizer and template given directly.
    pub fn new(
        tokenizer: Tokenizer,
        template: String,
        bos_token: String,
        eos_token: String,
    ) -> Result<ModelTokens, PromptError> {
        let mut templates = Environment::new();
        templates.set_trim_blocks(true);
        templates.set_lstrip_blocks(true);
        minijinja_contrib::add_to_environment(&mut templates);
        templates.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        templates.add_function(
            "raise_exception",
            |message: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        templates
            .add_template_owned(TEMPLATE, template)
            .map_err(|e| PromptError::Load {
                path: "chat template".into(),
                reason: e.to_string(),
            })?;
        Ok(ModelTokens {
            tokenizer,
            templates,
            bos_token,
            eos_token,
        })
    }

    /// The chat template's rendering of a chat request's `messages` (and `tools`).
    pub fn render(&self, body: &Map<String, Value>) -> Result<String, PromptError> {
        let messages = body
            .get("messages")
            .filter(|m| m.as_array().is_some_and(|m| !m.is_empty()))
            .ok_or_else(|| PromptError::Body("`messages` must be a non-empty array".into()))?;
        let tools = body.get("tools").filter(|t| !t.is_null());
        let template = self
            .templates
            .get_template(TEMPLATE)
            .map_err(|e| PromptError::Template(e.to_string()))?;
        template
            .render(minijinja::context! {
                messages => minijinja::Value::from_serialize(messages),
                tools => tools.map(minijinja::Value::from_serialize),
                add_generation_prompt => true,
                bos_token => self.bos_token.as_str(),
                eos_token => self.eos_token.as_str(),
            })
            .map_err(|e| PromptError::Template(e.to_string()))
    }

    /// The prompt text for a request on `api`, and whether the tokenizer adds its
    /// special tokens: a chat request rendered by the template (which writes them), a
    /// completions `prompt` string as it is (with them).
    pub fn render_request(
        &self,
        api: Api,
        body: &Map<String, Value>,
    ) -> Result<(String, bool), PromptError> {
        match api {
            Api::Chat => Ok((self.render(body)?, false)),
            Api::Completions => match body.get("prompt") {
                Some(Value::String(prompt)) => Ok((prompt.clone(), true)),
                Some(Value::Array(parts)) if parts.len() == 1 && parts[0].is_string() => {
                    Ok((parts[0].as_str().unwrap_or_default().to_owned(), true))
                }
                _ => Err(PromptError::Body("`prompt` must be a string".into())),
            },
        }
    }

    /// The token ids of `text`.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, PromptError> {
        let encoding = self
            .tokenizer
            .encode_fast(text, add_special_tokens)
            .map_err(|e| PromptError::Tokenizer(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The token ids the engine prefills for a request on `api`.
    pub fn tokens(&self, api: Api, body: &Map<String, Value>) -> Result<Vec<u32>, PromptError> {
        let (text, add_special_tokens) = self.render_request(api, body)?;
        self.encode(&text, add_special_tokens)
    }
}

/// `tokenizer_config.json`'s `chat_template`: a string, or the `default` of a named list.
fn chat_template_of(config: &Map<String, Value>) -> Option<String> {
    match config.get("chat_template")? {
        Value::String(template) => Some(template.clone()),
        Value::Array(named) => named
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str())
            .map(str::to_owned),
        _ => None,
    }
}

/// A special token of `tokenizer_config.json`: a string or `{"content": …}`; empty when absent.
fn special(config: &Map<String, Value>, name: &str) -> String {
    match config.get(name) {
        Some(Value::String(token)) => token.clone(),
        Some(Value::Object(token)) => token
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        _ => String::new(),
    }
}
