//! LLM API request bodies → [`CanonicalPrompt`].
//!
//! One module per API shape, each a small walk over the parsed JSON that feeds a
//! [`CanonicalBuilder`]. The shape comes from the request path when the caller knows it
//! (the filter does), otherwise from the body's fields (the CLI reads bare bodies).
//!
//! Parsers are lenient about what does not change the prompt (unknown fields are ignored,
//! unknown content parts are kept as opaque JSON) and strict about structure they rely on
//! (`messages` must be an array of objects): a structural error is a typed
//! [`FingerprintError`], which callers turn into a bypass.

mod anthropic_messages;
mod openai_chat;
mod openai_completions;
mod openai_responses;

use crate::canonical::{Api, BuilderOptions, CanonicalBuilder, CanonicalPrompt, Extent};
use crate::error::FingerprintError;
use crate::json::{Array, Object, Value};

/// Parses a request body into its canonical prompt.
///
/// `path` is the HTTP path (query string allowed) when known; it decides the shape.
/// Without it the shape is guessed from the body's fields.
pub fn parse_request(body: &[u8], path: Option<&str>) -> Result<CanonicalPrompt, FingerprintError> {
    parse_request_to(body, path, Extent::Whole)
}

/// [`parse_request`] writing only `extent` of the canonical prompt (every check and the
/// intent text are the same).
pub fn parse_request_to(
    body: &[u8],
    path: Option<&str>,
    extent: Extent,
) -> Result<CanonicalPrompt, FingerprintError> {
    let document = crate::json::parse(body).map_err(|e| FingerprintError::InvalidJson {
        message: e.to_string(),
    })?;
    let value = document.root();
    let Value::Object(object) = value else {
        return Err(FingerprintError::UnknownShape {
            detail: format!("top-level JSON is {}, not an object", value.kind()),
        });
    };
    let api = match path.and_then(api_from_path) {
        Some(api) => api,
        None => api_from_body(object)?,
    };
    let options = BuilderOptions {
        size_hint: body.len(),
        extent,
    };
    match api {
        Api::OpenAiChat => openai_chat::parse(object, options),
        Api::OpenAiCompletions => openai_completions::parse(object, options),
        Api::OpenAiResponses => openai_responses::parse(object, options),
        Api::AnthropicMessages => anthropic_messages::parse(object, options),
    }
}

/// The API shape served at `path`, if it is one of the LLM API paths.
pub fn api_from_path(path: &str) -> Option<Api> {
    let path = path.split(['?', '#']).next().unwrap_or(path);
    let path = path.trim_end_matches('/');
    if path.ends_with("/chat/completions") {
        Some(Api::OpenAiChat)
    } else if path.ends_with("/completions") {
        Some(Api::OpenAiCompletions)
    } else if path.ends_with("/responses") {
        Some(Api::OpenAiResponses)
    } else if path.ends_with("/messages") {
        Some(Api::AnthropicMessages)
    } else {
        None
    }
}

/// Top-level fields that make a JSON object an LLM API request body (see [`api_from_body`]).
pub const REQUEST_FIELDS: [&str; 4] = ["messages", "prompt", "input", "instructions"];

/// Guesses the shape of a body with no path: `messages` is chat unless something only
/// Anthropic has is present; `prompt` is completions; `input`/`instructions` is responses.
fn api_from_body(object: Object<'_>) -> Result<Api, FingerprintError> {
    if let Some(messages) = object.get("messages") {
        let anthropic = object.contains_key("system")
            || object.contains_key("anthropic_version")
            || messages
                .as_array()
                .is_some_and(|list| list.iter().any(has_anthropic_block));
        return Ok(if anthropic {
            Api::AnthropicMessages
        } else {
            Api::OpenAiChat
        });
    }
    if object.contains_key("prompt") {
        return Ok(Api::OpenAiCompletions);
    }
    if object.contains_key("input") || object.contains_key("instructions") {
        return Ok(Api::OpenAiResponses);
    }
    Err(FingerprintError::UnknownShape {
        detail: "no messages, prompt or input field".into(),
    })
}

fn has_anthropic_block(message: Value<'_>) -> bool {
    let Some(blocks) = message.get("content").and_then(Value::as_array) else {
        return false;
    };
    blocks.iter().any(|block| {
        matches!(
            block.get("type").and_then(Value::as_str),
            Some("tool_use" | "tool_result" | "document" | "thinking" | "redacted_thinking")
        ) || (block.get("type").and_then(Value::as_str) == Some("image")
            && block.get("source").is_some())
    })
}

/// The `model` field, or empty when absent (some engines serve one model and ignore it).
pub(crate) fn model_of<'d>(object: Object<'d>, api: Api) -> Result<&'d str, FingerprintError> {
    match object.get("model") {
        None | Some(Value::Null) => Ok(""),
        Some(Value::String(model)) => Ok(model),
        Some(other) => Err(FingerprintError::malformed(
            api.as_str(),
            format!("model is {}, not a string", other.kind()),
        )),
    }
}

/// The array under `field`, `None` when absent or null, an error when another type.
pub(crate) fn array_field<'d>(
    object: Object<'d>,
    field: &str,
    api: Api,
) -> Result<Option<Array<'d>>, FingerprintError> {
    match object.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => Ok(Some(items)),
        Some(other) => Err(FingerprintError::malformed(
            api.as_str(),
            format!("{field} is {}, not an array", other.kind()),
        )),
    }
}

/// Builder for `api` with the model already written.
pub(crate) fn builder_for(
    object: Object<'_>,
    api: Api,
    options: BuilderOptions,
) -> Result<CanonicalBuilder<'_>, FingerprintError> {
    Ok(CanonicalBuilder::new(api, model_of(object, api)?, options))
}

/// Text of a value that is a string or an array of `{type: "text", text}` blocks
/// (Anthropic `system`, tool results); `None` for other shapes.
pub(crate) fn text_or_text_blocks(value: Value<'_>) -> Option<String> {
    match value {
        Value::String(text) => Some(text.to_string()),
        Value::Array(blocks) => {
            let mut out = String::new();
            for block in blocks {
                let text = block.get("text").and_then(Value::as_str)?;
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(text);
            }
            Some(out)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_decides_the_shape() {
        assert_eq!(api_from_path("/v1/chat/completions"), Some(Api::OpenAiChat));
        assert_eq!(
            api_from_path("/v1/completions?x=1"),
            Some(Api::OpenAiCompletions)
        );
        assert_eq!(
            api_from_path("/openai/v1/responses/"),
            Some(Api::OpenAiResponses)
        );
        assert_eq!(api_from_path("/v1/messages"), Some(Api::AnthropicMessages));
        assert_eq!(api_from_path("/v1/embeddings"), None);
    }

    #[test]
    fn body_guesses_the_shape() {
        let guess = |body: &str| {
            let document = crate::json::parse(body.as_bytes()).unwrap();
            let Value::Object(o) = document.root() else {
                unreachable!()
            };
            api_from_body(o)
        };
        assert_eq!(guess(r#"{"messages":[]}"#), Ok(Api::OpenAiChat));
        assert_eq!(
            guess(r#"{"system":"s","messages":[]}"#),
            Ok(Api::AnthropicMessages)
        );
        assert_eq!(
            guess(
                r#"{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"a"}]}]}"#
            ),
            Ok(Api::AnthropicMessages)
        );
        assert_eq!(guess(r#"{"prompt":"x"}"#), Ok(Api::OpenAiCompletions));
        assert_eq!(guess(r#"{"input":"x"}"#), Ok(Api::OpenAiResponses));
        assert!(guess(r#"{"text":"x"}"#).is_err());
    }
}
