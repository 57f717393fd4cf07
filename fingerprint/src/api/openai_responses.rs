//! OpenAI responses (`POST /v1/responses`).
//!
//! `instructions` and leading `system`/`developer` input messages form the system prompt;
//! `tools` join the stable prefix; `previous_response_id` names server-held conversation
//! state and is part of the prompt's identity. `input` is a string (one user turn) or a
//! list of items: messages (with or without `type: "message"`; content a string or
//! `input_text`/`output_text`/`input_image`/`input_file` parts), `function_call` and
//! `function_call_output`; other item types are kept opaque.

use super::{array_field, builder_for};
use crate::canonical::{Api, BuilderOptions, CanonicalBuilder, CanonicalPrompt, Role};
use crate::error::FingerprintError;
use crate::json::{Array, Object, Value};

const API: Api = Api::OpenAiResponses;

pub(super) fn parse(
    object: Object<'_>,
    options: BuilderOptions,
) -> Result<CanonicalPrompt, FingerprintError> {
    let mut builder = builder_for(object, API, options)?;
    match object.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => builder.system(text),
        Some(other) => {
            return Err(FingerprintError::malformed(
                API.as_str(),
                format!("instructions is {}, not a string", other.kind()),
            ))
        }
    }

    let (input_text, items) = match object.get("input") {
        Some(Value::String(text)) => (Some(text), None),
        _ => (None, array_field(object, "input", API)?),
    };
    let items = || items.into_iter().flat_map(Array::iter);

    let leading_system = items().take_while(|&item| is_system_message(item)).count();
    for item in items().take(leading_system) {
        let text = item
            .get("content")
            .and_then(super::text_or_text_blocks)
            .unwrap_or_default();
        builder.system(&text);
    }
    if let Some(tools) = object.get("tools") {
        builder.tools(tools);
    }
    previous_response(&mut builder, object);
    if let Some(text) = input_text {
        builder.begin_turn(Role::User);
        builder.text(text);
    }

    for item in items().skip(leading_system) {
        if !item.is_object() {
            return Err(FingerprintError::malformed(
                API.as_str(),
                format!("an input item is {}, not an object", item.kind()),
            ));
        }
        match item.get("type").and_then(Value::as_str) {
            Some("message") | None => {
                let role = item.get("role").and_then(Value::as_str).unwrap_or("");
                builder.begin_turn(Role::from_name(role));
                content(&mut builder, item.get("content"))?;
            }
            Some("function_call") => {
                builder.begin_turn(Role::Assistant);
                let name = item.get("name").and_then(Value::as_str).unwrap_or("");
                builder.tool_call(name, item.get("arguments").unwrap_or(Value::Null));
            }
            Some("function_call_output") => {
                builder.begin_turn(Role::Tool);
                let id = item.get("call_id").and_then(Value::as_str).unwrap_or("");
                builder.tool_result(id);
                match item.get("output") {
                    Some(Value::String(text)) => builder.text(text),
                    Some(other) => builder.opaque(other),
                    None => {}
                }
            }
            Some(_) => {
                builder.begin_turn(Role::Other);
                builder.opaque(item);
            }
        }
    }
    builder.finish()
}

fn is_system_message(item: Value<'_>) -> bool {
    matches!(
        item.get("type").and_then(Value::as_str),
        None | Some("message")
    ) && matches!(
        item.get("role").and_then(Value::as_str),
        Some("system" | "developer")
    )
}

fn previous_response(builder: &mut CanonicalBuilder, object: Object<'_>) {
    if let Some(Value::String(id)) = object.get("previous_response_id") {
        builder.context(id);
    }
}

fn content<'d>(
    builder: &mut CanonicalBuilder<'d>,
    content: Option<Value<'d>>,
) -> Result<(), FingerprintError> {
    match content {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => builder.text(text),
        Some(Value::Array(parts)) => {
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => {
                        builder.text(part.get("text").and_then(Value::as_str).unwrap_or(""))
                    }
                    Some("input_image") => {
                        let reference = part
                            .get("image_url")
                            .or_else(|| part.get("file_id"))
                            .and_then(Value::as_str)
                            .unwrap_or("");
                        builder.image(reference);
                    }
                    _ => builder.opaque(part),
                }
            }
        }
        Some(other) => {
            return Err(FingerprintError::malformed(
                API.as_str(),
                format!("message content is {}", other.kind()),
            ))
        }
    }
    Ok(())
}
