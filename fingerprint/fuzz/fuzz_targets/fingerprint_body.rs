//! Arbitrary bytes as a request body, on every API path: must return, never panic.
#![no_main]

use cohort_fingerprint::{fingerprint, Request, SemanticMode};
use libfuzzer_sys::fuzz_target;

const PATHS: [Option<&str>; 5] = [
    None,
    Some("/v1/chat/completions"),
    Some("/v1/completions"),
    Some("/v1/responses"),
    Some("/v1/messages"),
];

fuzz_target!(|data: &[u8]| {
    let selector = data.first().copied().unwrap_or(0);
    let mut request = Request::new(data);
    request.path = PATHS[usize::from(selector) % PATHS.len()];
    request.semantic_mode = match selector / 5 % 3 {
        0 => SemanticMode::Intent,
        1 => SemanticMode::Topic,
        _ => SemanticMode::Hybrid,
    };
    if let Ok(fp) = fingerprint(&request) {
        assert_eq!(fp.prefix_blocks.len(), fp.prompt_bytes.div_ceil(256));
    }
});
