//! OpenAI completions (`POST /v1/completions`).
//!
//! `prompt` is a string, an array of strings (several prompts in one request), an array
//! of token ids, or an array of token-id arrays. Each prompt is one user turn; `suffix`
//! (fill-in-the-middle) is a trailing part. There is no system prompt or tools: the
//! stable prefix is the model alone.

use super::builder_for;
use crate::canonical::{Api, BuilderOptions, CanonicalBuilder, CanonicalPrompt, Role};
use crate::error::FingerprintError;
use crate::json::{Array, Object, Value};

const API: Api = Api::OpenAiCompletions;

pub(super) fn parse(
    object: Object<'_>,
    options: BuilderOptions,
) -> Result<CanonicalPrompt, FingerprintError> {
    let mut builder = builder_for(object, API, options)?;
    match object.get("prompt") {
        Some(Value::String(text)) => {
            if text.is_empty() {
                return Err(FingerprintError::EmptyPrompt { api: API.as_str() });
            }
            builder.begin_turn(Role::User);
            builder.text(text);
        }
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(FingerprintError::EmptyPrompt { api: API.as_str() });
        }
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => {
            builder.begin_turn(Role::User);
            builder.tokens(&token_ids(items)?);
        }
        Some(Value::Array(items)) => {
            for item in items {
                builder.begin_turn(Role::User);
                match item {
                    Value::String(text) => builder.text(text),
                    Value::Array(ids) => builder.tokens(&token_ids(ids)?),
                    other => return Err(bad_prompt(other)),
                }
            }
        }
        Some(other) => return Err(bad_prompt(other)),
        None => {
            return Err(FingerprintError::malformed(
                API.as_str(),
                "prompt is missing",
            ))
        }
    }
    suffix(&mut builder, object.get("suffix"));
    builder.finish()
}

fn suffix<'d>(builder: &mut CanonicalBuilder<'d>, suffix: Option<Value<'d>>) {
    if let Some(Value::String(text)) = suffix {
        builder.begin_turn(Role::Other);
        builder.text(text);
    }
}

fn token_ids(items: Array<'_>) -> Result<Vec<u32>, FingerprintError> {
    items
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| {
                    FingerprintError::malformed(API.as_str(), format!("token id {v} is not a u32"))
                })
        })
        .collect()
}

fn bad_prompt(value: Value<'_>) -> FingerprintError {
    FingerprintError::malformed(
        API.as_str(),
        format!("prompt is {}, not text or token ids", value.kind()),
    )
}
