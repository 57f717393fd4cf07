//! Request bodies → the simulator's view of a request: the rendered prompt text, how many
//! tokens to generate, streaming, and the cache salt.
//!
//! Rendering is a fixed, documented template rather than a model's chat template, so any
//! client can predict the prompt (and its tokens) exactly: chat `messages` render as
//! `"<role>\n<content>\n"` per message, concatenated (content is a string, null, or an array
//! of `{"type":"text","text":…}` parts); a completions `prompt` string is used as is.

use serde_json::{Map, Value};
use thiserror::Error;

/// Output tokens when the request names no limit (OpenAI's legacy completions default).
pub const DEFAULT_MAX_TOKENS: u64 = 16;

/// Which OpenAI API a body is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Chat,
    Completions,
}

/// What the simulator needs from a request body.
#[derive(Debug, Clone, PartialEq)]
pub struct SimRequest {
    pub api: Api,
    /// The rendered prompt.
    pub prompt: String,
    /// Output tokens to generate (`max_completion_tokens`, else `max_tokens`, else 16).
    pub max_tokens: u64,
    pub stream: bool,
    /// vLLM's `cache_salt`: seeds the block-hash chain so salted prefixes never match
    /// unsalted or differently salted ones.
    pub cache_salt: Option<String>,
}

/// Why a body is not a request the simulator can serve (answered with 400).
#[derive(Debug, Error, PartialEq)]
pub enum RequestError {
    #[error("body is not JSON: {0}")]
    NotJson(String),
    #[error("body is not a JSON object")]
    NotObject,
    #[error("`messages` must be a non-empty array")]
    BadMessages,
    #[error("messages[{0}]: {1}")]
    BadMessage(usize, &'static str),
    #[error("`prompt` must be a string (or an array of one string)")]
    BadPrompt,
    #[error("the body has neither `messages` nor `prompt`")]
    NoPrompt,
    #[error("`{0}` must be a positive integer")]
    BadMaxTokens(&'static str),
    #[error("`{0}` must be a {1}")]
    BadField(&'static str, &'static str),
}

/// Parses a body for `api`.
pub fn parse(api: Api, body: &[u8]) -> Result<SimRequest, RequestError> {
    let object = object(body)?;
    request(api, &object)
}

/// Parses a body of either API: `messages` makes it chat, else `prompt` completions (what
/// `/tokenize`, the render fallback and `bound` accept).
pub fn parse_any(body: &[u8]) -> Result<SimRequest, RequestError> {
    let object = object(body)?;
    let api = if object.contains_key("messages") {
        Api::Chat
    } else if object.contains_key("prompt") {
        Api::Completions
    } else {
        return Err(RequestError::NoPrompt);
    };
    request(api, &object)
}

fn object(body: &[u8]) -> Result<Map<String, Value>, RequestError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(RequestError::NotObject),
        Err(e) => Err(RequestError::NotJson(e.to_string())),
    }
}

fn request(api: Api, object: &Map<String, Value>) -> Result<SimRequest, RequestError> {
    let prompt = match api {
        Api::Chat => render_messages(object.get("messages").ok_or(RequestError::BadMessages)?)?,
        Api::Completions => completion_prompt(object.get("prompt").ok_or(RequestError::NoPrompt)?)?,
    };
    let max_tokens = match (
        object.get("max_completion_tokens"),
        object.get("max_tokens"),
    ) {
        (Some(v), _) if !v.is_null() => positive(v, "max_completion_tokens")?,
        (_, Some(v)) if !v.is_null() => positive(v, "max_tokens")?,
        _ => DEFAULT_MAX_TOKENS,
    };
    let stream = match object.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(RequestError::BadField("stream", "boolean")),
    };
    let cache_salt = match object.get("cache_salt") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(RequestError::BadField("cache_salt", "string")),
    };
    Ok(SimRequest {
        api,
        prompt,
        max_tokens,
        stream,
        cache_salt,
    })
}

fn positive(value: &Value, name: &'static str) -> Result<u64, RequestError> {
    value
        .as_u64()
        .filter(|&n| n > 0)
        .ok_or(RequestError::BadMaxTokens(name))
}

/// Renders chat messages: `"<role>\n<content>\n"` each, concatenated.
pub fn render_messages(messages: &Value) -> Result<String, RequestError> {
    let messages = messages
        .as_array()
        .filter(|m| !m.is_empty())
        .ok_or(RequestError::BadMessages)?;
    let mut out = String::new();
    for (i, message) in messages.iter().enumerate() {
        let message = message
            .as_object()
            .ok_or(RequestError::BadMessage(i, "not an object"))?;
        let role = message
            .get("role")
            .and_then(Value::as_str)
            .ok_or(RequestError::BadMessage(i, "`role` must be a string"))?;
        out.push_str(role);
        out.push('\n');
        match message.get("content") {
            None | Some(Value::Null) => {}
            Some(Value::String(text)) => out.push_str(text),
            Some(Value::Array(parts)) => {
                for part in parts {
                    let text = part
                        .as_object()
                        .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
                        .and_then(|p| p.get("text"))
                        .and_then(Value::as_str)
                        .ok_or(RequestError::BadMessage(
                            i,
                            "content parts must be {\"type\":\"text\",\"text\":…}",
                        ))?;
                    out.push_str(text);
                }
            }
            Some(_) => {
                return Err(RequestError::BadMessage(
                    i,
                    "`content` must be a string or an array of text parts",
                ))
            }
        }
        out.push('\n');
    }
    Ok(out)
}

fn completion_prompt(prompt: &Value) -> Result<String, RequestError> {
    match prompt {
        Value::String(s) => Ok(s.clone()),
        Value::Array(items) if items.len() == 1 => items[0]
            .as_str()
            .map(str::to_owned)
            .ok_or(RequestError::BadPrompt),
        _ => Err(RequestError::BadPrompt),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_renders_role_and_content_lines() {
        let body = br#"{"messages":[{"role":"system","content":"Be brief."},
            {"role":"user","content":[{"type":"text","text":"Hi "},{"type":"text","text":"there"}]},
            {"role":"assistant","content":null}],"max_tokens":3,"stream":true}"#;
        let r = parse(Api::Chat, body).unwrap();
        assert_eq!(r.prompt, "system\nBe brief.\nuser\nHi there\nassistant\n\n");
        assert_eq!(r.max_tokens, 3);
        assert!(r.stream);
        assert_eq!(r.cache_salt, None);
    }

    #[test]
    fn completions_use_the_prompt_as_is_and_default_to_16_tokens() {
        let r = parse(Api::Completions, br#"{"prompt":"abc\n","cache_salt":"t1"}"#).unwrap();
        assert_eq!(r.prompt, "abc\n");
        assert_eq!(r.max_tokens, DEFAULT_MAX_TOKENS);
        assert!(!r.stream);
        assert_eq!(r.cache_salt.as_deref(), Some("t1"));
        let one = parse(Api::Completions, br#"{"prompt":["x"]}"#).unwrap();
        assert_eq!(one.prompt, "x");
    }

    #[test]
    fn max_completion_tokens_wins_over_max_tokens() {
        let r = parse(
            Api::Chat,
            br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":9,"max_completion_tokens":4}"#,
        )
        .unwrap();
        assert_eq!(r.max_tokens, 4);
    }

    #[test]
    fn parse_any_picks_the_api_from_the_fields() {
        assert_eq!(
            parse_any(br#"{"messages":[{"role":"user","content":"x"}]}"#)
                .unwrap()
                .api,
            Api::Chat
        );
        assert_eq!(
            parse_any(br#"{"prompt":"x"}"#).unwrap().api,
            Api::Completions
        );
        assert_eq!(parse_any(br#"{"model":"m"}"#), Err(RequestError::NoPrompt));
    }

    #[test]
    fn bad_bodies_are_errors_not_panics() {
        assert!(matches!(
            parse(Api::Chat, b"{nope"),
            Err(RequestError::NotJson(_))
        ));
        assert_eq!(parse(Api::Chat, b"[1]"), Err(RequestError::NotObject));
        assert_eq!(
            parse(Api::Chat, br#"{"messages":[]}"#),
            Err(RequestError::BadMessages)
        );
        assert!(matches!(
            parse(Api::Chat, br#"{"messages":[{"content":"x"}]}"#),
            Err(RequestError::BadMessage(0, _))
        ));
        assert!(matches!(
            parse(
                Api::Chat,
                br#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#
            ),
            Err(RequestError::BadMessage(0, _))
        ));
        assert_eq!(
            parse(Api::Completions, br#"{"prompt":[1,2]}"#),
            Err(RequestError::BadPrompt)
        );
        assert_eq!(
            parse(Api::Completions, br#"{"prompt":"x","max_tokens":0}"#),
            Err(RequestError::BadMaxTokens("max_tokens"))
        );
        assert_eq!(
            parse(Api::Completions, br#"{"prompt":"x","stream":"yes"}"#),
            Err(RequestError::BadField("stream", "boolean"))
        );
    }
}
