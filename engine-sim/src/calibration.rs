//! Calibration files: the cost constants fitted against a real engine by
//! `cohort_tools/bench/engine_sim_calibrate.py`, with what was measured and how well the fit matches.
//! The simulator reads only `constants`; the rest (engine, flags, date, fit error, cases)
//! travels with the results so a simulated number is never reported without its calibration.
//! The committed measurement (`data/bench/engine_sim_calibration.json`) is compiled in as
//! the default.

use crate::cost::CostModel;
use serde_json::Value;
use thiserror::Error;

/// The committed calibration file's text.
pub const DEFAULT_CALIBRATION: &str = include_str!("../../data/bench/engine_sim_calibration.json");

#[derive(Debug, Error)]
pub enum CalibrationError {
    #[error("calibration is not JSON: {0}")]
    NotJson(#[from] serde_json::Error),
    #[error("calibration has no valid `constants` object: {0}")]
    BadConstants(String),
}

/// A parsed calibration: the constants and the whole document.
#[derive(Debug, Clone)]
pub struct Calibration {
    pub constants: CostModel,
    pub document: Value,
}

impl Calibration {
    pub fn parse(text: &str) -> Result<Calibration, CalibrationError> {
        let document: Value = serde_json::from_str(text)?;
        let constants = document
            .get("constants")
            .cloned()
            .ok_or_else(|| CalibrationError::BadConstants("missing".to_owned()))?;
        let constants: CostModel = serde_json::from_value(constants)
            .map_err(|e| CalibrationError::BadConstants(e.to_string()))?;
        if !constants.is_valid() {
            return Err(CalibrationError::BadConstants(
                "every constant must be finite and >= 0".to_owned(),
            ));
        }
        Ok(Calibration {
            constants,
            document,
        })
    }

    /// The committed measurement.
    pub fn measured_default() -> Calibration {
        Calibration::parse(DEFAULT_CALIBRATION).expect("the committed calibration parses")
    }

    /// The fit error block, if the file has one (for `/server_info` and the harness).
    pub fn fit_error(&self) -> Value {
        self.document
            .get("fit_error")
            .cloned()
            .unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_calibration_parses_and_is_positive() {
        let c = Calibration::measured_default();
        assert!(c.constants.prefill_ms_per_token > 0.0);
        assert!(c.constants.decode_ms_per_token > 0.0);
        assert!(c.fit_error().is_object());
    }

    #[test]
    fn bad_files_are_errors() {
        assert!(Calibration::parse("nope").is_err());
        assert!(Calibration::parse("{}").is_err());
        assert!(Calibration::parse(
            r#"{"constants":{"prefill_base_ms":-1,"prefill_ms_per_token":1,"decode_ms_per_token":1,"decode_batch_slowdown":0}}"#
        )
        .is_err());
    }
}
