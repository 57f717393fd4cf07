//! libFuzzer driver of `cohort_fuzz_targets::kv_events` (the checks live there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cohort_fuzz_targets::kv_events::kv_events(data));
