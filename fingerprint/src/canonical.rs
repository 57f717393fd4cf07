//! The canonical prompt: one byte string per request, the same for every API shape.
//!
//! An engine's KV cache is keyed by the token sequence it prefills: model, system prompt,
//! tool definitions, then the conversation in order. Cohort cannot tokenise for every
//! engine, so it builds a deterministic byte string in that order and hashes blocks of it
//! (see [`crate::prefix`]). Two requests whose conversations share a beginning share a
//! beginning here too, so a longest-prefix match over block hashes tracks the engine's
//! prefix cache.
//!
//! Encoding, chosen so that no two different prompts produce the same bytes, so that
//! appending a turn only appends bytes, and so that two texts sharing a beginning share
//! that beginning here too (engines cache token prefixes *within* a message: a long
//! document or few-shot block followed by different questions in one user message, a
//! completions `prompt`, a conversation flattened into one text):
//! - a *segment* is `tag: u8`, its bytes with every `0x00` written as `0x00 0xFF`, then
//!   the terminator `0x00 0x00` (a length prefix would make two texts of different
//!   lengths differ from their first byte on);
//! - the stable prefix is the `MODEL` segment, then `SYSTEM` segments, then one `TOOLS`
//!   segment (the tool definitions as canonical JSON: keys sorted, `cache_control` marks
//!   left out);
//! - each turn is `TURN, role: u8` followed by its part segments (`TEXT`, `IMAGE`,
//!   `TOOL_CALL`, `TOOL_RESULT`, `DOCUMENT`, `TOKENS`, `OPAQUE`).
//!
//! While parsers feed turns in, the builder remembers the text of the last user turn that
//! had any text (tool results do not count): that is the *intent text* the sketch reads.

use crate::error::FingerprintError;
use crate::json::Value;

/// Ends a segment; a `0x00` inside one is written as `0x00 0xFF`, so this pair cannot occur
/// inside a segment.
const SEGMENT_END: [u8; 2] = [0x00, 0x00];

/// Appends `data` with every `0x00` written as `0x00 0xFF`.
fn push_escaped(out: &mut Vec<u8>, data: &[u8]) {
    // Text almost never holds a NUL; `contains` on bytes scans a word at a time, where the
    // split below tests each byte.
    if !data.contains(&0) {
        out.extend_from_slice(data);
        return;
    }
    let mut parts = data.split(|&b| b == 0);
    if let Some(first) = parts.next() {
        out.extend_from_slice(first);
    }
    for part in parts {
        out.extend_from_slice(&[0x00, 0xFF]);
        out.extend_from_slice(part);
    }
}

/// How much of the canonical prompt a builder writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Extent {
    /// Every segment: what the prefix block hashes are computed over.
    #[default]
    Whole,
    /// The stable prefix (model, system, tools) only. The turns are still walked, checked
    /// and read for the intent text, but not written: for a caller that wants no block
    /// hashes (the filter with no batcher to send them to), which saves copying, escaping
    /// and hashing the conversation.
    StablePrefix,
}

/// What a parser hands its builder: the body's size (the canonical prompt is about as
/// long) and the [`Extent`] to write.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BuilderOptions {
    pub size_hint: usize,
    pub extent: Extent,
}

/// The API shape a body was parsed as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Api {
    OpenAiChat,
    OpenAiCompletions,
    OpenAiResponses,
    AnthropicMessages,
}

impl Api {
    /// Stable name used in output records and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Api::OpenAiChat => "openai.chat_completions",
            Api::OpenAiCompletions => "openai.completions",
            Api::OpenAiResponses => "openai.responses",
            Api::AnthropicMessages => "anthropic.messages",
        }
    }
}

/// Who speaks in a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Role {
    User = 1,
    Assistant = 2,
    Tool = 3,
    /// A system or developer message after the conversation started.
    System = 4,
    /// Anything else a client sent; kept so it still shapes the prefix.
    Other = 5,
}

impl Role {
    /// Maps an API role name. Parsers send system/developer messages that lead the
    /// conversation to the stable prefix instead of a turn.
    pub fn from_name(name: &str) -> Role {
        match name {
            "user" => Role::User,
            "assistant" | "model" => Role::Assistant,
            "tool" | "function" => Role::Tool,
            "system" | "developer" => Role::System,
            _ => Role::Other,
        }
    }
}

/// Whether `text` is empty or all whitespace (as `str::trim` counts it); the common
/// answer, a text that starts with a visible ASCII character, without a scan.
#[inline]
fn is_blank(text: &str) -> bool {
    match text.as_bytes().first() {
        None => true,
        Some(b) if b.is_ascii_graphic() => false,
        Some(_) => text.trim().is_empty(),
    }
}

mod tag {
    pub const MODEL: u8 = 0x01;
    pub const SYSTEM: u8 = 0x02;
    pub const TOOLS: u8 = 0x03;
    pub const CONTEXT: u8 = 0x04;
    pub const TURN: u8 = 0x10;
    pub const TEXT: u8 = 0x20;
    pub const IMAGE: u8 = 0x21;
    pub const TOOL_CALL: u8 = 0x22;
    pub const TOOL_RESULT: u8 = 0x23;
    pub const DOCUMENT: u8 = 0x24;
    pub const TOKENS: u8 = 0x25;
    pub const OPAQUE: u8 = 0x26;
}

/// A request reduced to what shapes the engine's prompt.
#[derive(Debug, Clone)]
pub struct CanonicalPrompt {
    pub api: Api,
    pub model: String,
    bytes: Vec<u8>,
    stable_len: usize,
    has_stable_context: bool,
    intent: Option<String>,
}

impl CanonicalPrompt {
    /// The whole canonical byte string (the stable prefix alone when built with
    /// [`Extent::StablePrefix`]).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Model + system + tools: the part shared by every request of one application.
    pub fn stable_prefix(&self) -> &[u8] {
        &self.bytes[..self.stable_len]
    }

    /// True when the stable prefix holds a system prompt or tools, not just the model name.
    pub fn has_stable_context(&self) -> bool {
        self.has_stable_context
    }

    /// Text of the last user turn that had text, if any.
    pub fn last_user_text(&self) -> Option<&str> {
        self.intent.as_deref()
    }
}

/// Builds a [`CanonicalPrompt`]; the API parsers drive it with text borrowed from the
/// parsed body (`'d`).
pub(crate) struct CanonicalBuilder<'d> {
    api: Api,
    extent: Extent,
    model: String,
    bytes: Vec<u8>,
    stable_len: Option<usize>,
    has_stable_context: bool,
    turns: usize,
    in_user_turn: bool,
    /// The text parts of the user turn being built, and of the last finished one with
    /// text: borrowed from the body, two lists swapped at each user turn's end, and joined
    /// once in [`CanonicalBuilder::finish`] (a long conversation copies no turn's text).
    user_parts: Vec<&'d str>,
    intent_parts: Vec<&'d str>,
    has_intent: bool,
}

impl<'d> CanonicalBuilder<'d> {
    pub fn new(api: Api, model: &str, options: BuilderOptions) -> Self {
        let capacity = match options.extent {
            Extent::Whole => options.size_hint + 64,
            Extent::StablePrefix => options.size_hint.min(1024),
        };
        let mut builder = CanonicalBuilder {
            api,
            extent: options.extent,
            model: model.to_owned(),
            bytes: Vec::with_capacity(capacity),
            stable_len: None,
            has_stable_context: false,
            turns: 0,
            in_user_turn: false,
            user_parts: Vec::new(),
            intent_parts: Vec::new(),
            has_intent: false,
        };
        builder.segment(tag::MODEL, model.as_bytes());
        builder
    }

    /// False once the stable prefix is complete, when only that is written.
    fn writing(&self) -> bool {
        self.extent == Extent::Whole || self.stable_len.is_none()
    }

    fn segment(&mut self, tag: u8, data: &[u8]) {
        if !self.writing() {
            return;
        }
        self.bytes.push(tag);
        push_escaped(&mut self.bytes, data);
        self.bytes.extend_from_slice(&SEGMENT_END);
    }

    /// A segment holding `value` as canonical JSON (keys sorted, so key order does not
    /// matter), without `cache_control` marks: a caching hint is not prompt content.
    fn json_segment(&mut self, tag: u8, value: Value<'_>) {
        if !self.writing() {
            return;
        }
        self.bytes.push(tag);
        let start = self.bytes.len();
        value.write_canonical_without(Some("cache_control"), &mut self.bytes);
        // Canonical JSON escapes control characters, so this is a formality.
        if self.bytes[start..].contains(&0) {
            let raw = self.bytes.split_off(start);
            push_escaped(&mut self.bytes, &raw);
        }
        self.bytes.extend_from_slice(&SEGMENT_END);
    }

    /// System prompt text; only valid before the first turn.
    pub fn system(&mut self, text: &str) {
        debug_assert!(self.stable_len.is_none());
        self.has_stable_context = true;
        self.segment(tag::SYSTEM, text.as_bytes());
    }

    /// Tool definitions; only valid before the first turn.
    pub fn tools(&mut self, tools: Value<'_>) {
        debug_assert!(self.stable_len.is_none());
        if matches!(tools, Value::Array(items) if items.is_empty()) || tools.is_null() {
            return;
        }
        self.has_stable_context = true;
        self.json_segment(tag::TOOLS, tools);
    }

    fn end_stable_prefix(&mut self) {
        if self.stable_len.is_none() {
            self.stable_len = Some(self.bytes.len());
        }
    }

    /// Conversation state held by the server (e.g. `previous_response_id`): part of the
    /// prompt's identity, but not of the stable prefix.
    pub fn context(&mut self, text: &str) {
        self.end_stable_prefix();
        self.segment(tag::CONTEXT, text.as_bytes());
    }

    #[inline]
    fn close_turn(&mut self) {
        // The turn's parts joined by newlines are blank exactly when every part is.
        if self.in_user_turn && self.user_parts.iter().any(|part| !is_blank(part)) {
            std::mem::swap(&mut self.intent_parts, &mut self.user_parts);
            self.has_intent = true;
        }
        self.user_parts.clear();
        self.in_user_turn = false;
    }

    #[inline]
    pub fn begin_turn(&mut self, role: Role) {
        self.end_stable_prefix();
        self.close_turn();
        self.turns += 1;
        if self.writing() {
            self.bytes.push(tag::TURN);
            self.bytes.push(role as u8);
        }
        self.in_user_turn = role == Role::User;
    }

    #[inline]
    pub fn text(&mut self, text: &'d str) {
        self.segment(tag::TEXT, text.as_bytes());
        if self.in_user_turn {
            self.user_parts.push(text);
        }
    }

    /// Text inside a user turn that is not the user's own words (a tool result, thinking):
    /// part of the prompt, not of the intent.
    pub fn text_not_intent(&mut self, text: &str) {
        self.segment(tag::TEXT, text.as_bytes());
    }

    pub fn image(&mut self, reference: &str) {
        self.segment(tag::IMAGE, reference.as_bytes());
    }

    pub fn document(&mut self, value: Value<'_>) {
        self.json_segment(tag::DOCUMENT, value);
    }

    pub fn tool_call(&mut self, name: &str, arguments: Value<'_>) {
        if !self.writing() {
            return;
        }
        let mut data = Vec::with_capacity(name.len() + 64);
        data.extend_from_slice(name.as_bytes());
        data.push(0);
        match arguments {
            // OpenAI sends arguments as a JSON string; keep its exact text.
            Value::String(text) => data.extend_from_slice(text.as_bytes()),
            other => other.write_canonical(&mut data),
        }
        self.segment(tag::TOOL_CALL, &data);
    }

    /// Start of a tool result; its content follows as text/opaque parts.
    pub fn tool_result(&mut self, call_id: &str) {
        self.segment(tag::TOOL_RESULT, call_id.as_bytes());
    }

    pub fn tokens(&mut self, ids: &[u32]) {
        if !self.writing() {
            return;
        }
        let mut data = Vec::with_capacity(ids.len() * 4);
        for id in ids {
            data.extend_from_slice(&id.to_le_bytes());
        }
        self.segment(tag::TOKENS, &data);
    }

    /// A part we do not interpret; its canonical JSON still shapes the prefix.
    pub fn opaque(&mut self, value: Value<'_>) {
        self.json_segment(tag::OPAQUE, value);
    }

    pub fn finish(mut self) -> Result<CanonicalPrompt, FingerprintError> {
        self.end_stable_prefix();
        self.close_turn();
        // A system prompt alone is a prompt (engines accept system-only chats).
        if self.turns == 0 && !self.has_stable_context {
            return Err(FingerprintError::EmptyPrompt {
                api: self.api.as_str(),
            });
        }
        Ok(CanonicalPrompt {
            api: self.api,
            model: self.model,
            stable_len: self.stable_len.unwrap_or(self.bytes.len()),
            bytes: self.bytes,
            has_stable_context: self.has_stable_context,
            intent: self.has_intent.then(|| self.intent_parts.join("\n")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WHOLE: BuilderOptions = BuilderOptions {
        size_hint: 0,
        extent: Extent::Whole,
    };

    #[test]
    fn the_stable_prefix_extent_writes_the_stable_prefix_and_reads_the_intent() {
        let build = |extent| {
            let mut b = CanonicalBuilder::new(
                Api::OpenAiChat,
                "m",
                BuilderOptions {
                    size_hint: 0,
                    extent,
                },
            );
            b.system("be brief");
            b.begin_turn(Role::User);
            b.text("hello");
            b.begin_turn(Role::Assistant);
            b.tool_call("search", Value::Null);
            b.tokens(&[1, 2]);
            b.begin_turn(Role::User);
            b.text("where is my card?");
            b.finish().unwrap()
        };
        let (whole, stable) = (build(Extent::Whole), build(Extent::StablePrefix));
        assert_eq!(stable.bytes(), whole.stable_prefix());
        assert_eq!(stable.stable_prefix(), whole.stable_prefix());
        assert!(whole.bytes().len() > whole.stable_prefix().len());
        assert_eq!(stable.last_user_text(), Some("where is my card?"));
        assert_eq!(stable.has_stable_context(), whole.has_stable_context());
        let empty = CanonicalBuilder::new(
            Api::OpenAiChat,
            "m",
            BuilderOptions {
                size_hint: 0,
                extent: Extent::StablePrefix,
            },
        );
        assert!(empty.finish().is_err(), "still no prompt without turns");
    }

    fn two_turns(second: &str) -> CanonicalPrompt {
        let mut b = CanonicalBuilder::new(Api::OpenAiChat, "m", WHOLE);
        b.system("be brief");
        b.begin_turn(Role::User);
        b.text("hello");
        b.begin_turn(Role::Assistant);
        b.text(second);
        b.finish().unwrap()
    }

    #[test]
    fn appending_a_turn_only_appends_bytes() {
        let mut b = CanonicalBuilder::new(Api::OpenAiChat, "m", WHOLE);
        b.system("be brief");
        b.begin_turn(Role::User);
        b.text("hello");
        let one = b.finish().unwrap();
        let two = two_turns("hi there");
        assert!(two.bytes().starts_with(one.bytes()));
        assert_eq!(one.stable_prefix(), two.stable_prefix());
    }

    #[test]
    fn texts_sharing_a_beginning_share_canonical_bytes_beyond_it() {
        let build = |text: &str| {
            let mut b = CanonicalBuilder::new(Api::OpenAiCompletions, "m", WHOLE);
            b.begin_turn(Role::User);
            b.text(text);
            b.finish().unwrap()
        };
        let shared = "a long shared document. ".repeat(40);
        let a = build(&format!("{shared}Q: short?"));
        let b = build(&format!(
            "{shared}Q: a much longer question than the first?"
        ));
        let common = a
            .bytes()
            .iter()
            .zip(b.bytes())
            .take_while(|(x, y)| x == y)
            .count();
        assert!(common > shared.len(), "{common} shared bytes");
    }

    #[test]
    fn zero_bytes_are_escaped_so_segments_stay_apart() {
        let mut a = CanonicalBuilder::new(Api::OpenAiChat, "m", WHOLE);
        a.begin_turn(Role::User);
        a.text("x\0\0y");
        let mut b = CanonicalBuilder::new(Api::OpenAiChat, "m", WHOLE);
        b.begin_turn(Role::User);
        b.text("x");
        b.text("y");
        assert_ne!(a.finish().unwrap().bytes(), b.finish().unwrap().bytes());
        let mut out = Vec::new();
        push_escaped(&mut out, &[0, 1, 0, 0]);
        assert_eq!(out, [0, 0xFF, 1, 0, 0xFF, 0, 0xFF]);
    }

    #[test]
    fn segment_boundaries_keep_parts_apart() {
        let a = two_turns("ab");
        let mut b = CanonicalBuilder::new(Api::OpenAiChat, "m", WHOLE);
        b.system("be brief");
        b.begin_turn(Role::User);
        b.text("hello");
        b.begin_turn(Role::Assistant);
        b.text("a");
        b.text("b");
        assert_ne!(a.bytes(), b.finish().unwrap().bytes());
    }

    #[test]
    fn is_blank_agrees_with_trim() {
        for text in [
            "",
            " ",
            "\n\t ",
            "x",
            " x",
            "\u{3000}",
            "\u{3000}x",
            "\u{a0}",
            "é",
            "\u{85}",
            "-",
        ] {
            assert_eq!(is_blank(text), text.trim().is_empty(), "{text:?}");
        }
    }

    #[test]
    fn intent_is_last_user_turn_with_text() {
        let mut b = CanonicalBuilder::new(Api::AnthropicMessages, "m", WHOLE);
        b.begin_turn(Role::User);
        b.text("find flights to paris");
        b.begin_turn(Role::Assistant);
        b.tool_call("search", Value::Null);
        b.begin_turn(Role::User);
        b.tool_result("t1");
        let p = b.finish().unwrap();
        assert_eq!(p.last_user_text(), Some("find flights to paris"));
        assert!(!p.has_stable_context());
    }

    #[test]
    fn no_turns_and_no_system_is_an_empty_prompt() {
        let b = CanonicalBuilder::new(Api::OpenAiChat, "m", WHOLE);
        assert_eq!(b.finish().unwrap_err().bypass_reason(), "empty_prompt");
    }
}
