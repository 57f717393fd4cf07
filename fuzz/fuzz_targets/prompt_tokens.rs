//! libFuzzer driver of `cohort_fuzz_targets::prompt_tokens` (the checks live there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cohort_fuzz_targets::prompt_tokens::prompt_tokens(data));
