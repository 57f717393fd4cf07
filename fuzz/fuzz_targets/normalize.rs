//! libFuzzer driver of `cohort_fuzz_targets::normalize` (the checks live there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cohort_fuzz_targets::normalize::normalize(data));
