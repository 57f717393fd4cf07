//! The fingerprint core's steps as a plain wasm module, for profiling inside V8.
//!
//! Envoy's V8 takes no flags from its user (proxy-wasm-cpp-host sets `liftoff = false` and
//! nothing else), so it can write no perf map and run no profiler, and native instruction
//! counts have misled this work before (docs/FILTER.md). This module runs the same Rust code,
//! compiled to wasm as the filter is, in node's V8: after a warm-up the code is TurboFan's,
//! as in Envoy, and `node --cpu-prof` samples it per wasm function. `profile.js` loads it,
//! times each step hot and with the caches flushed between calls (as inside Envoy, where a
//! request's fingerprint runs between much other work), and prints the profile.
//!
//! Each export loops one step `iterations` times over bytes the host wrote into memory from
//! [`cohort_profile_alloc`], and returns a checksum so nothing is optimised away.

// The C ABI a wasm host calls: exported functions over raw pointers.
#![allow(unsafe_code)]

use cohort_fingerprint::{api, json, prefix, IntentSketch, Request, SemanticMode};

/// The steps `cohort_profile_run` can loop, by number.
pub const STEPS: [&str; 6] = [
    "fingerprint",
    "parse",
    "json",
    "sketch",
    "blocks",
    "no-blocks",
];

/// Allocates `len` bytes for the host to write into (never freed: one per input).
#[no_mangle]
pub extern "C" fn cohort_profile_alloc(len: usize) -> *mut u8 {
    let mut buffer = Vec::<u8>::with_capacity(len.max(1));
    let ptr = buffer.as_mut_ptr();
    std::mem::forget(buffer);
    ptr
}

/// Runs step `step` (an index into [`STEPS`]) `iterations` times on `ptr..ptr+len`: a chat
/// completions body, or for `sketch` the intent text.
///
/// # Safety
/// `ptr..ptr+len` must be memory from [`cohort_profile_alloc`] that the host filled.
#[no_mangle]
pub unsafe extern "C" fn cohort_profile_run(
    step: u32,
    ptr: *const u8,
    len: usize,
    iterations: u32,
) -> u64 {
    // SAFETY (of this unsafe fn's body): the caller hands back memory from
    // `cohort_profile_alloc` with `len` bytes filled.
    let input = std::slice::from_raw_parts(ptr, len);
    (0..iterations)
        .map(|_| run_step(step, input))
        .fold(0, u64::wrapping_add)
}

/// What a step that failed on its input returns.
pub const FAILED: u64 = u64::MAX;

/// One step on `input`, reduced to a number ([`FAILED`] when the input was refused).
pub fn run_step(step: u32, input: &[u8]) -> u64 {
    const PATH: &str = "/v1/chat/completions";
    match step {
        0 => {
            let request = Request {
                path: Some(PATH),
                ..Request::new(input)
            };
            cohort_fingerprint::fingerprint(&request).map_or(FAILED, |fp| u64::from(fp.cohort))
        }
        1 => api::parse_request(input, Some(PATH))
            .map_or(FAILED, |prompt| prompt.bytes().len() as u64),
        2 => json::parse(input).map_or(FAILED, |document| document.root().kind().len() as u64),
        3 => {
            let text = std::str::from_utf8(input).unwrap_or_default();
            u64::from(IntentSketch::of_text(text, SemanticMode::default()).cohort(0.5))
        }
        4 => prefix::block_hashes(input, 1).len() as u64,
        // The fingerprint as the filter computes it with no batcher: no block chain.
        _ => {
            let request = Request {
                path: Some(PATH),
                block_hashes: false,
                ..Request::new(input)
            };
            cohort_fingerprint::fingerprint(&request).map_or(FAILED, |fp| u64::from(fp.cohort))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_runs_on_a_chat_body() {
        let body = br#"{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"where is my card?"}]}"#;
        for step in 0..STEPS.len() as u32 {
            assert_ne!(run_step(step, body), FAILED, "{}", STEPS[step as usize]);
        }
        assert_eq!(
            run_step(2, b"{"),
            FAILED,
            "an invalid body is the error value"
        );
    }
}
