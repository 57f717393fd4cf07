//! The cost model: how long a prefill and each decoded token take (see the crate docs for
//! why one prefill lane per replica and a linear batch slowdown). Pure arithmetic on
//! milliseconds; the server turns them into sleeps.

use serde::{Deserialize, Serialize};

/// The fitted constants (milliseconds), as written in a calibration file's `constants`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    /// Fixed cost of a prefill (scheduling, the first forward pass's overhead).
    pub prefill_base_ms: f64,
    /// Per uncached prompt token (simulator tokens, 4 bytes each).
    pub prefill_ms_per_token: f64,
    /// Attention over the cached prefix: per uncached × cached token pair (0 unless the
    /// calibration measured it).
    #[serde(default)]
    pub prefill_attention_ms: f64,
    /// One output token with nothing else running.
    pub decode_ms_per_token: f64,
    /// Relative slowdown of a decode step per other running request.
    pub decode_batch_slowdown: f64,
}

impl CostModel {
    /// Every duration multiplied by `scale` (the simulator's `--time-scale`).
    pub fn scaled(self, scale: f64) -> CostModel {
        CostModel {
            prefill_base_ms: self.prefill_base_ms * scale,
            prefill_ms_per_token: self.prefill_ms_per_token * scale,
            prefill_attention_ms: self.prefill_attention_ms * scale,
            decode_ms_per_token: self.decode_ms_per_token * scale,
            decode_batch_slowdown: self.decode_batch_slowdown,
        }
    }

    /// A prefill of `uncached` tokens after `cached` cached ones.
    pub fn prefill_ms(&self, uncached: usize, cached: usize) -> f64 {
        self.prefill_base_ms
            + self.prefill_ms_per_token * uncached as f64
            + self.prefill_attention_ms * uncached as f64 * cached as f64
    }

    /// One decode step while `running` requests (this one included) hold slots.
    pub fn decode_token_ms(&self, running: usize) -> f64 {
        let others = running.saturating_sub(1) as f64;
        self.decode_ms_per_token * (1.0 + self.decode_batch_slowdown * others)
    }

    /// Whether every constant is finite and non-negative.
    pub fn is_valid(&self) -> bool {
        [
            self.prefill_base_ms,
            self.prefill_ms_per_token,
            self.prefill_attention_ms,
            self.decode_ms_per_token,
            self.decode_batch_slowdown,
        ]
        .iter()
        .all(|v| v.is_finite() && *v >= 0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODEL: CostModel = CostModel {
        prefill_base_ms: 10.0,
        prefill_ms_per_token: 0.5,
        prefill_attention_ms: 0.001,
        decode_ms_per_token: 4.0,
        decode_batch_slowdown: 0.25,
    };

    #[test]
    fn prefill_is_base_plus_per_token_plus_attention() {
        assert_eq!(MODEL.prefill_ms(0, 0), 10.0);
        assert_eq!(MODEL.prefill_ms(100, 0), 60.0);
        assert!((MODEL.prefill_ms(100, 1000) - 160.0).abs() < 1e-9);
    }

    #[test]
    fn decode_slows_linearly_with_other_running_requests() {
        assert_eq!(MODEL.decode_token_ms(0), 4.0);
        assert_eq!(MODEL.decode_token_ms(1), 4.0);
        assert_eq!(MODEL.decode_token_ms(3), 6.0);
    }

    #[test]
    fn time_scale_scales_durations_not_the_slowdown() {
        let s = MODEL.scaled(0.5);
        assert_eq!(s.prefill_ms(100, 0), 30.0);
        assert_eq!(s.decode_token_ms(3), 3.0);
        assert_eq!(s.decode_batch_slowdown, 0.25);
        assert!(s.is_valid());
        assert!(!MODEL.scaled(f64::NAN).is_valid());
    }
}
