//! libFuzzer driver of `cohort_fuzz_targets::filter_config` (the checks live there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cohort_fuzz_targets::filter_config::filter_config(data));
