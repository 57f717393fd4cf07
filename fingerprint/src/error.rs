//! Why a request could not be fingerprinted.
//!
//! Every failure of the core is one of these variants. Callers never see a panic:
//! the filter turns an error into a bypass (the request goes upstream untouched,
//! `x-cohort-bypass: <reason>`), the CLI writes it into the output record.
//! [`FingerprintError::bypass_reason`] is the stable, short name used in headers
//! and stat names; the `Display` text is for logs and humans.

use thiserror::Error;

/// A request body the core cannot (or should not) fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FingerprintError {
    /// The body is larger than the configured limit.
    #[error("body of {size} bytes is over the {limit}-byte limit")]
    BodyTooLarge { size: usize, limit: usize },

    /// The body is not valid JSON (also: invalid UTF-8, nesting deeper than 128 levels).
    #[error("body is not valid JSON: {message}")]
    InvalidJson { message: String },

    /// Valid JSON, but no LLM API shape we know (chat, completions, responses, messages).
    #[error("body is not a known LLM API request: {detail}")]
    UnknownShape { detail: String },

    /// A known shape whose fields have the wrong types (e.g. `messages` is a string).
    #[error("malformed {api} request: {detail}")]
    Malformed { api: &'static str, detail: String },

    /// A known shape with nothing to fingerprint (e.g. `messages: []`).
    #[error("{api} request has no prompt")]
    EmptyPrompt { api: &'static str },
}

impl FingerprintError {
    /// Stable machine-readable reason, used as the `x-cohort-bypass` value and in stat names.
    pub fn bypass_reason(&self) -> &'static str {
        match self {
            FingerprintError::BodyTooLarge { .. } => "body_too_large",
            FingerprintError::InvalidJson { .. } => "invalid_json",
            FingerprintError::UnknownShape { .. } => "unknown_shape",
            FingerprintError::Malformed { .. } => "malformed_request",
            FingerprintError::EmptyPrompt { .. } => "empty_prompt",
        }
    }

    pub(crate) fn malformed(api: &'static str, detail: impl Into<String>) -> Self {
        FingerprintError::Malformed {
            api,
            detail: detail.into(),
        }
    }
}

/// All bypass reasons the core can produce, for callers that pre-register counters.
pub const BYPASS_REASONS: &[&str] = &[
    "body_too_large",
    "invalid_json",
    "unknown_shape",
    "malformed_request",
    "empty_prompt",
];
