//! OpenAI chat completions (`POST /v1/chat/completions`).
//!
//! `messages` in order; leading `system`/`developer` messages form the system prompt;
//! content is a string or an array of parts (`text`, `image_url`, `input_audio`, `file`,
//! others kept opaque); assistant `tool_calls` (and legacy `function_call`) and `tool`
//! results are part of the conversation. `tools` (and legacy `functions`) join the stable
//! prefix.

use super::{array_field, builder_for};
use crate::canonical::{Api, BuilderOptions, CanonicalBuilder, CanonicalPrompt, Role};
use crate::error::FingerprintError;
use crate::json::{Object, Value};

const API: Api = Api::OpenAiChat;

pub(super) fn parse(
    object: Object<'_>,
    options: BuilderOptions,
) -> Result<CanonicalPrompt, FingerprintError> {
    let mut builder = builder_for(object, API, options)?;
    let messages = array_field(object, "messages", API)?
        .ok_or_else(|| FingerprintError::malformed(API.as_str(), "messages is missing"))?;
    let leading_system = messages
        .iter()
        .take_while(|m| {
            Role::from_name(m.get("role").and_then(Value::as_str).unwrap_or("")) == Role::System
        })
        .count();
    for message in messages.iter().take(leading_system) {
        builder.system(&content_text(message.get("content"))?);
    }
    for field in ["tools", "functions"] {
        if let Some(tools) = object.get(field) {
            builder.tools(tools);
        }
    }

    for message in messages.iter().skip(leading_system) {
        let Some(fields) = message.as_object() else {
            return Err(FingerprintError::malformed(
                API.as_str(),
                format!("a message is {}, not an object", message.kind()),
            ));
        };
        const ROLE: usize = 0;
        const CONTENT: usize = 1;
        const TOOL_CALLS: usize = 2;
        const FUNCTION_CALL: usize = 3;
        const TOOL_CALL_ID: usize = 4;
        const NAME: usize = 5;
        let picked = fields.pick([
            "role",
            "content",
            "tool_calls",
            "function_call",
            "tool_call_id",
            "name",
        ]);
        let role = Role::from_name(picked.str(ROLE).unwrap_or(""));
        builder.begin_turn(role);
        if role == Role::Tool {
            let id = picked.get(TOOL_CALL_ID).or(picked.get(NAME));
            builder.tool_result(id.and_then(Value::as_str).unwrap_or(""));
        }
        content(&mut builder, picked.get(CONTENT))?;
        if let Some(calls) = picked.get(TOOL_CALLS).and_then(Value::as_array) {
            for call in calls {
                let function = call.get("function").unwrap_or(call);
                let name = function.get("name").and_then(Value::as_str).unwrap_or("");
                builder.tool_call(name, function.get("arguments").unwrap_or(Value::Null));
            }
        }
        if let Some(call) = picked.get(FUNCTION_CALL) {
            let name = call.get("name").and_then(Value::as_str).unwrap_or("");
            builder.tool_call(name, call.get("arguments").unwrap_or(Value::Null));
        }
    }
    builder.finish()
}

/// Feeds a message's `content` (string, parts array or null) to the builder.
fn content<'d>(
    builder: &mut CanonicalBuilder<'d>,
    content: Option<Value<'d>>,
) -> Result<(), FingerprintError> {
    match content {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(text)) => {
            builder.text(text);
            Ok(())
        }
        Some(Value::Array(parts)) => {
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("text") | Some("input_text") => {
                        builder.text(part.get("text").and_then(Value::as_str).unwrap_or(""))
                    }
                    Some("image_url") => {
                        let image = part.get("image_url");
                        let url = image
                            .and_then(|i| i.get("url").or(Some(i)))
                            .and_then(Value::as_str)
                            .unwrap_or("");
                        builder.image(url);
                    }
                    _ => builder.opaque(part),
                }
            }
            Ok(())
        }
        Some(other) => Err(FingerprintError::malformed(
            API.as_str(),
            format!("message content is {}", other.kind()),
        )),
    }
}

/// Text of a system message's content (string or text parts).
fn content_text(content: Option<Value<'_>>) -> Result<String, FingerprintError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(value) => super::text_or_text_blocks(value).ok_or_else(|| {
            FingerprintError::malformed(API.as_str(), "system message content is not text")
        }),
    }
}
