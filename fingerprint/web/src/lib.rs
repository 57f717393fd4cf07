//! The fingerprint core for browsers, through wasm-bindgen.
//!
//! The batcher's inspector page (`/ui`) loads this module to fingerprint a prompt in the
//! browser, with the very code the Envoy filter runs, and then asks the batcher for the
//! cohorts nearest to the sketch. One function: a `cohort fingerprint` input line in, the
//! record `cohort fingerprint` prints out (JSON), so the browser, the CLI, the filter and
//! the C-ABI module (`fingerprint/wasm`) all answer byte for byte the same.
//!
//! Built by `scripts/build-wasm` (`wasm32-unknown-unknown`, then `wasm-bindgen --target
//! web` into `target/ui/pkg/`).

use cohort_fingerprint::record::{fingerprint_line as record_of, LineDefaults};
use wasm_bindgen::prelude::*;

/// Fingerprints one input line (a request body, `{"text": …}`, or an envelope) and
/// returns its record as JSON.
#[wasm_bindgen]
pub fn fingerprint_line(line: &str) -> String {
    let record = record_of(line.as_bytes(), 1, &LineDefaults::default());
    serde_json::to_string(&record).unwrap_or_else(|e| format!(r#"{{"error":"{e}"}}"#))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_the_cli_record() {
        let line = r#"{"text":"how do I reset my card pin"}"#;
        let record: serde_json::Value = serde_json::from_str(&fingerprint_line(line)).unwrap();
        let native = record_of(line.as_bytes(), 1, &LineDefaults::default());
        assert_eq!(record, serde_json::to_value(native).unwrap());
        assert_eq!(record["sketch_i8"].as_array().unwrap().len(), 32);
    }
}
