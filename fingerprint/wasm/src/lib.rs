//! The fingerprint core as a plain wasm module.
//!
//! A host writes one `cohort fingerprint` input line into memory it got from
//! [`cohort_alloc`], calls [`cohort_fingerprint_line`], and reads back the output record
//! (JSON, as the CLI prints it) from the returned pointer and length, which it then
//! releases with [`cohort_free`]. The module imports nothing beyond what the Rust standard
//! library needs on its target.
//!
//! Its first user is the wasm parity test (`tests/`), which runs this module in a wasm
//! interpreter and checks that it answers byte for byte what the native build answers.

// The C ABI a wasm host calls: exported (`no_mangle`) functions over raw pointers.
#![allow(unsafe_code)]

use cohort_fingerprint::record::{fingerprint_line, LineDefaults};

/// Allocates `len` bytes for the host to write into.
#[no_mangle]
pub extern "C" fn cohort_alloc(len: usize) -> *mut u8 {
    let mut buffer = Vec::<u8>::with_capacity(len.max(1));
    let ptr = buffer.as_mut_ptr();
    std::mem::forget(buffer);
    ptr
}

/// Releases memory from [`cohort_alloc`] or [`cohort_fingerprint_line`].
///
/// # Safety
/// `ptr` and `len` must come from one of those calls and be released once.
#[no_mangle]
pub unsafe extern "C" fn cohort_free(ptr: *mut u8, len: usize) {
    drop(Vec::from_raw_parts(ptr, 0, len.max(1)));
}

/// Fingerprints one input line; returns `ptr << 32 | len` of the JSON record.
///
/// # Safety
/// `ptr..ptr+len` must be memory from [`cohort_alloc`] holding the line.
#[no_mangle]
pub unsafe extern "C" fn cohort_fingerprint_line(ptr: *const u8, len: usize) -> u64 {
    let input = std::slice::from_raw_parts(ptr, len);
    let output = record_json(input);
    let mut output = std::mem::ManuallyDrop::new(output.into_bytes());
    output.shrink_to_fit();
    let (out_ptr, out_len) = (output.as_mut_ptr(), output.len());
    // Zero-length outputs still own one byte (see cohort_alloc), so cohort_free works.
    if out_len == 0 {
        return 0;
    }
    ((out_ptr as usize as u64) << 32) | out_len as u64
}

/// The record for one line, as JSON; the same function the native CLI calls.
pub fn record_json(line: &[u8]) -> String {
    let record = fingerprint_line(line, 1, &LineDefaults::default());
    serde_json::to_string(&record).unwrap_or_default()
}
