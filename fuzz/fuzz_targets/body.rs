//! libFuzzer driver of `cohort_fuzz_targets::body` (the checks live there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cohort_fuzz_targets::body::body(data));
