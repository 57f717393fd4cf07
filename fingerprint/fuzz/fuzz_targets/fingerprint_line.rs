//! Arbitrary bytes as a `cohort fingerprint` input line (bodies, text lines, envelopes
//! with header knobs): must return a record, never panic.
#![no_main]

use cohort_fingerprint::record::{fingerprint_line, LineDefaults};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let record = fingerprint_line(data, 1, &LineDefaults::default());
    assert!(record.bypass.is_some() || record.sketch.is_some());
});
