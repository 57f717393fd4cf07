//! libFuzzer driver of `cohort_fuzz_targets::response_usage` (the checks live there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cohort_fuzz_targets::response_usage::response_usage(data));
