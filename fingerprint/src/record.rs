//! The JSONL record format of `cohort fingerprint` (and of the wasm build's export).
//!
//! Each input line is one of:
//! - a raw request body object (`{"model": …, "messages": […]}`), shape guessed from it;
//! - a text line: `{"text": "…"}` with optional `semantic_mode`, `tenant`, `routing_key`
//!   and `label` (copied to the output, handy for evaluation);
//! - an envelope, for logs that kept headers: `{"body": <object or string>, "path": …,
//!   "headers": {"x-cohort-semantic-mode": …, …}, "tenant": …, "label": …}`.
//!
//! Each output line is a [`Record`]: the fingerprint, or the bypass reason and error when
//! the line could not be fingerprinted. A bad line never stops the stream.

use crate::key::{Anchor, RoutingKey, TenantSalt};
use crate::knobs::{batch_threshold, header, InvalidKnob, Knobs, RawKnobs};
use crate::sketch::{SemanticMode, SKETCH_VERSION};
use crate::{fingerprint, Fingerprint, FingerprintError, IntentSketch, Request};
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// Settings that apply to every line unless the line overrides them.
#[derive(Debug, Clone, Default)]
pub struct LineDefaults {
    /// Deployment secret mixed into every tenant salt.
    pub salt_secret: Vec<u8>,
    pub tenant: Option<String>,
    pub semantic_mode: SemanticMode,
    pub max_body_bytes: Option<usize>,
}

/// One output line.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct Record {
    pub line: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stable_prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_blocks: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_bytes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub intent_text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sketch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sketch_i8: Option<Vec<i8>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sketch_version: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub semantic_mode: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cohort: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anchor: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routing_key: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub invalid_knobs: Vec<InvalidKnobRecord>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bypass: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// An invalid knob as reported in a record.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InvalidKnobRecord {
    pub knob: &'static str,
    pub problem: &'static str,
}

impl From<&InvalidKnob> for InvalidKnobRecord {
    fn from(invalid: &InvalidKnob) -> Self {
        InvalidKnobRecord {
            knob: invalid.knob.as_str(),
            problem: invalid.problem.as_str(),
        }
    }
}

/// Fingerprints one input line (1-based `number`).
pub fn fingerprint_line(line: &[u8], number: usize, defaults: &LineDefaults) -> Record {
    let mut record = Record {
        line: number,
        ..Record::default()
    };
    let object = match serde_json::from_slice::<Value>(line) {
        Ok(Value::Object(object)) => object,
        // Not an object: let the core say why (invalid JSON or unknown shape).
        _ => {
            let request = request_with_defaults(line, defaults, None);
            fill(&mut record, fingerprint(&request));
            return record;
        }
    };
    record.label = object.get("label").cloned();
    let tenant = object
        .get("tenant")
        .and_then(Value::as_str)
        .or(defaults.tenant.as_deref());
    let salt = TenantSalt::new(&defaults.salt_secret, tenant);

    if let Some(body) = object.get("body") {
        let headers = lowercase_headers(object.get("headers"));
        let get = |name: &str| headers.get(name).map(String::as_str);
        let parsed = RawKnobs::from_headers(get).parse();
        record.invalid_knobs = parsed.invalid.iter().map(Into::into).collect();
        let body_bytes = match body {
            Value::String(text) => text.clone().into_bytes(),
            other => other.to_string().into_bytes(),
        };
        let mut request = request_with_defaults(&body_bytes, defaults, tenant);
        request.path = object.get("path").and_then(Value::as_str);
        request.original_query = get(header::ORIGINAL_QUERY);
        request.app_routing_key = get(header::ROUTING_KEY);
        if get(header::SEMANTIC_MODE).is_some() {
            request.semantic_mode = parsed.knobs.semantic_mode;
        }
        request.batch_threshold = parsed.knobs.batch_threshold;
        fill(&mut record, fingerprint(&request));
        return record;
    }

    if let (Some(text), false) = (object.get("text").and_then(Value::as_str), is_body(&object)) {
        let mode = object
            .get("semantic_mode")
            .and_then(Value::as_str)
            .and_then(SemanticMode::parse)
            .unwrap_or(defaults.semantic_mode);
        let intent = IntentSketch::of_text(text, mode);
        let threshold = object
            .get("batch_threshold")
            .and_then(Value::as_f64)
            .map_or(Knobs::default().batch_threshold, |t| {
                batch_threshold(t as f32)
            });
        let code = intent.cohort(threshold);
        let anchor = Anchor::Cohort(code);
        let app_key = object.get("routing_key").and_then(Value::as_str);
        record.routing_key = Some(RoutingKey::new(salt, anchor, app_key).to_string());
        record.anchor = Some(anchor.as_str());
        fill_intent(&mut record, &intent, mode, salt.cohort(code));
        return record;
    }

    let request = request_with_defaults(line, defaults, tenant);
    fill(&mut record, fingerprint(&request));
    record
}

fn is_body(object: &Map<String, Value>) -> bool {
    crate::api::REQUEST_FIELDS
        .iter()
        .any(|field| object.contains_key(*field))
}

fn request_with_defaults<'a>(
    body: &'a [u8],
    defaults: &LineDefaults,
    tenant: Option<&str>,
) -> Request<'a> {
    let mut request = Request::new(body);
    request.salt = TenantSalt::new(&defaults.salt_secret, tenant.or(defaults.tenant.as_deref()));
    request.semantic_mode = defaults.semantic_mode;
    if let Some(limit) = defaults.max_body_bytes {
        request.max_body_bytes = limit;
    }
    request
}

fn lowercase_headers(headers: Option<&Value>) -> BTreeMap<String, String> {
    let Some(Value::Object(headers)) = headers else {
        return BTreeMap::new();
    };
    headers
        .iter()
        .filter_map(|(name, value)| Some((name.to_ascii_lowercase(), value.as_str()?.to_owned())))
        .collect()
}

fn fill(record: &mut Record, result: Result<Fingerprint, FingerprintError>) {
    match result {
        Ok(fp) => {
            record.api = Some(fp.api.as_str());
            record.model = Some(fp.model);
            record.stable_prefix = Some(format!("{:016x}", fp.stable_prefix));
            record.prefix_blocks = Some(
                fp.prefix_blocks
                    .iter()
                    .map(|h| format!("{h:016x}"))
                    .collect(),
            );
            record.prompt_bytes = Some(fp.prompt_bytes);
            record.anchor = Some(fp.anchor.as_str());
            record.routing_key = Some(fp.routing_key.to_string());
            fill_intent(record, &fp.intent, fp.semantic_mode, fp.cohort);
        }
        Err(error) => {
            record.bypass = Some(error.bypass_reason());
            record.error = Some(error.to_string());
        }
    }
}

fn fill_intent(record: &mut Record, intent: &IntentSketch, mode: SemanticMode, cohort: u32) {
    record.intent_text = Some(intent.masked_text());
    record.sketch = Some(intent.sketch.to_base64url());
    record.sketch_i8 = Some(intent.sketch.0.to_vec());
    record.sketch_version = Some(SKETCH_VERSION);
    record.semantic_mode = Some(mode.as_str());
    record.cohort = Some(format!("{cohort:08x}"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_body_text_and_envelope_lines() {
        let d = LineDefaults::default();
        let raw = fingerprint_line(
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
            1,
            &d,
        );
        assert_eq!(raw.api, Some("openai.chat_completions"));
        assert!(raw.bypass.is_none());

        let text = fingerprint_line(br#"{"text":"cancel my order 42","label":"cancel"}"#, 2, &d);
        assert_eq!(text.intent_text.as_deref(), Some("cancel my order <num>"));
        assert_eq!(text.label, Some(Value::from("cancel")));
        assert!(text.api.is_none());

        let envelope = fingerprint_line(
            br#"{"path":"/v1/completions","headers":{"X-Cohort-Semantic-Mode":"topic","x-cohort-batch-threshold":"2"},"body":{"prompt":"x"}}"#,
            3,
            &d,
        );
        assert_eq!(envelope.api, Some("openai.completions"));
        assert_eq!(envelope.semantic_mode, Some("topic"));
        assert_eq!(
            envelope.invalid_knobs,
            [InvalidKnobRecord {
                knob: "batch_threshold",
                problem: "clamped"
            }]
        );
    }

    #[test]
    fn bad_lines_become_bypass_records() {
        let d = LineDefaults::default();
        let bad = fingerprint_line(b"{not json", 4, &d);
        assert_eq!(bad.bypass, Some("invalid_json"));
        let array = fingerprint_line(b"[1,2]", 5, &d);
        assert_eq!(array.bypass, Some("unknown_shape"));
        let unknown = fingerprint_line(br#"{"foo":1}"#, 6, &d);
        assert_eq!(unknown.bypass, Some("unknown_shape"));
    }
}
