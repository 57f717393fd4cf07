//! Anthropic messages (`POST /v1/messages`).
//!
//! `system` (a string or text blocks) and `tools` form the stable prefix. `messages`
//! alternate `user`/`assistant`; content is a string or blocks: `text`, `image` (base64
//! or URL source), `document`, `tool_use`, `tool_result` (its content a string or
//! blocks), `thinking`; other blocks are kept opaque. `cache_control` marks do not
//! change the prompt and are left out (see `canonical`).

use super::{array_field, builder_for};
use crate::canonical::{Api, BuilderOptions, CanonicalBuilder, CanonicalPrompt, Role};
use crate::error::FingerprintError;
use crate::json::{Object, Value};

const API: Api = Api::AnthropicMessages;

pub(super) fn parse(
    object: Object<'_>,
    options: BuilderOptions,
) -> Result<CanonicalPrompt, FingerprintError> {
    let mut builder = builder_for(object, API, options)?;
    match object.get("system") {
        None | Some(Value::Null) => {}
        Some(system) => {
            let text = super::text_or_text_blocks(system).ok_or_else(|| {
                FingerprintError::malformed(API.as_str(), "system is not text or text blocks")
            })?;
            builder.system(&text);
        }
    }
    if let Some(tools) = object.get("tools") {
        builder.tools(tools);
    }

    let messages = array_field(object, "messages", API)?
        .ok_or_else(|| FingerprintError::malformed(API.as_str(), "messages is missing"))?;
    for message in messages {
        let Some(fields) = message.as_object() else {
            return Err(FingerprintError::malformed(
                API.as_str(),
                format!("a message is {}, not an object", message.kind()),
            ));
        };
        let picked = fields.pick(["role", "content"]);
        builder.begin_turn(Role::from_name(picked.str(0).unwrap_or("")));
        match picked.get(1) {
            None | Some(Value::Null) => {}
            Some(Value::String(text)) => builder.text(text),
            Some(Value::Array(blocks)) => {
                for block in blocks {
                    content_block(&mut builder, block);
                }
            }
            Some(other) => {
                return Err(FingerprintError::malformed(
                    API.as_str(),
                    format!("message content is {}", other.kind()),
                ))
            }
        }
    }
    builder.finish()
}

fn content_block<'d>(builder: &mut CanonicalBuilder<'d>, block: Value<'d>) {
    match block.get("type").and_then(Value::as_str) {
        Some("text") => builder.text(block.get("text").and_then(Value::as_str).unwrap_or("")),
        Some("image") => {
            let source = block.get("source");
            let reference = source
                .and_then(|s| {
                    s.get("data")
                        .or_else(|| s.get("url"))
                        .or_else(|| s.get("file_id"))
                })
                .and_then(Value::as_str)
                .unwrap_or("");
            builder.image(reference);
        }
        Some("document") => builder.document(block),
        Some("tool_use") => {
            let name = block.get("name").and_then(Value::as_str).unwrap_or("");
            builder.tool_call(name, block.get("input").unwrap_or(Value::Null));
        }
        Some("tool_result") => {
            let id = block
                .get("tool_use_id")
                .and_then(Value::as_str)
                .unwrap_or("");
            builder.tool_result(id);
            match block.get("content") {
                Some(Value::String(text)) => builder.text_not_intent(text),
                Some(Value::Array(parts)) => {
                    for part in parts {
                        match part.get("text").and_then(Value::as_str) {
                            Some(text) => builder.text_not_intent(text),
                            None => builder.opaque(part),
                        }
                    }
                }
                _ => {}
            }
        }
        Some("thinking") => {
            builder.text_not_intent(block.get("thinking").and_then(Value::as_str).unwrap_or(""))
        }
        _ => builder.opaque(block),
    }
}
