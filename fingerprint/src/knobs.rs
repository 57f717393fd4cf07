//! Client knobs from request headers, clamped, with a report of what was invalid.
//!
//! | header | accepted | default |
//! |---|---|---|
//! | `x-cohort-prefetch` | `high`, `medium`, `low`, `none` | `medium` |
//! | `x-cohort-batch-threshold` | 0.1–0.9 | 0.5 |
//! | `x-cohort-cache-ttl` | 300–3600 seconds (`600` or `600s`) | 600 |
//! | `x-cohort-semantic-mode` | `intent`, `topic`, `hybrid` | `intent` |
//!
//! Rule (docs/CONTRACT.md, "Failure rules"): a malformed value (not a number, NaN, an unknown
//! word) falls back to the default; a well-formed number outside its range is clamped to
//! the nearest bound. Either way the request proceeds and the knob is reported in
//! [`ParsedKnobs::invalid`] so the caller can count it. Values are matched after trimming
//! ASCII whitespace, case-insensitively.

/// Default header names.
pub mod header {
    pub const PREFETCH: &str = "x-cohort-prefetch";
    pub const BATCH_THRESHOLD: &str = "x-cohort-batch-threshold";
    pub const CACHE_TTL: &str = "x-cohort-cache-ttl";
    pub const SEMANTIC_MODE: &str = "x-cohort-semantic-mode";
    pub const ROUTING_KEY: &str = "x-cohort-routing-key";
    pub const ORIGINAL_QUERY: &str = "x-original-query";
    pub const SESSION: &str = "x-cohort-session";
}

pub mod policy;

use crate::sketch::SemanticMode;
use policy::KnobLimits;

/// How aggressively to warm predicted cohorts: the knob's values, and the knob policy's
/// `prefetch` and `max_prefetch` ([`policy`]; the one prefetch level type, which the
/// batcher's core maps to what each allows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Prefetch {
    High,
    #[default]
    Medium,
    Low,
    None,
}

impl Prefetch {
    /// `high`, `medium`, `low` or `none`, after trimming ASCII whitespace, in any case.
    pub fn parse(value: &str) -> Option<Prefetch> {
        match value.trim().to_ascii_lowercase().as_str() {
            "high" => Some(Prefetch::High),
            "medium" => Some(Prefetch::Medium),
            "low" => Some(Prefetch::Low),
            "none" => Some(Prefetch::None),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Prefetch::High => "high",
            Prefetch::Medium => "medium",
            Prefetch::Low => "low",
            Prefetch::None => "none",
        }
    }
}

pub const BATCH_THRESHOLD_RANGE: (f32, f32) = (0.1, 0.9);
pub const CACHE_TTL_RANGE_S: (u32, u32) = (300, 3600);

/// A batch threshold as the batcher uses it: clamped to [`BATCH_THRESHOLD_RANGE`], the
/// default for a value that is not a positive number (an observation without knobs).
pub fn batch_threshold(value: f32) -> f32 {
    if value.is_finite() && value > 0.0 {
        value.clamp(BATCH_THRESHOLD_RANGE.0, BATCH_THRESHOLD_RANGE.1)
    } else {
        Knobs::default().batch_threshold
    }
}

/// A cache TTL as the batcher uses it: clamped to [`CACHE_TTL_RANGE_S`]; 0 (a request
/// that carried no knobs) is the default, as for the header.
pub fn cache_ttl_s(value: u32) -> u32 {
    if value == 0 {
        Knobs::default().cache_ttl_s
    } else {
        value.clamp(CACHE_TTL_RANGE_S.0, CACHE_TTL_RANGE_S.1)
    }
}

/// Effective knob values for one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Knobs {
    pub prefetch: Prefetch,
    /// Minimum sketch similarity to join a cohort; higher is stricter.
    pub batch_threshold: f32,
    /// Seconds a cohort's prefix is considered resident on its replica.
    pub cache_ttl_s: u32,
    pub semantic_mode: SemanticMode,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            prefetch: Prefetch::Medium,
            batch_threshold: 0.5,
            cache_ttl_s: 600,
            semantic_mode: SemanticMode::Intent,
        }
    }
}

/// Which knob was invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KnobName {
    Prefetch,
    BatchThreshold,
    CacheTtl,
    SemanticMode,
}

impl KnobName {
    pub fn header(self) -> &'static str {
        match self {
            KnobName::Prefetch => header::PREFETCH,
            KnobName::BatchThreshold => header::BATCH_THRESHOLD,
            KnobName::CacheTtl => header::CACHE_TTL,
            KnobName::SemanticMode => header::SEMANTIC_MODE,
        }
    }

    /// Short name for stats (`cohort_invalid_knob_<name>`).
    pub fn as_str(self) -> &'static str {
        match self {
            KnobName::Prefetch => "prefetch",
            KnobName::BatchThreshold => "batch_threshold",
            KnobName::CacheTtl => "cache_ttl",
            KnobName::SemanticMode => "semantic_mode",
        }
    }
}

/// What was wrong with a knob value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KnobProblem {
    /// Unparseable; the default was used.
    Malformed,
    /// A number outside the range; it was clamped.
    Clamped,
}

impl KnobProblem {
    pub fn as_str(self) -> &'static str {
        match self {
            KnobProblem::Malformed => "malformed",
            KnobProblem::Clamped => "clamped",
        }
    }
}

/// One invalid knob value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InvalidKnob {
    pub knob: KnobName,
    pub problem: KnobProblem,
}

/// Knobs as parsed, and what was invalid.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParsedKnobs {
    pub knobs: Knobs,
    pub invalid: Vec<InvalidKnob>,
}

/// Raw knob header values (absent headers are `None`).
#[derive(Debug, Clone, Copy, Default)]
pub struct RawKnobs<'a> {
    pub prefetch: Option<&'a str>,
    pub batch_threshold: Option<&'a str>,
    pub cache_ttl: Option<&'a str>,
    pub semantic_mode: Option<&'a str>,
}

impl<'a> RawKnobs<'a> {
    /// Reads the default header names through a lookup function (header maps differ by host).
    pub fn from_headers(get: impl Fn(&str) -> Option<&'a str>) -> Self {
        RawKnobs {
            prefetch: get(header::PREFETCH),
            batch_threshold: get(header::BATCH_THRESHOLD),
            cache_ttl: get(header::CACHE_TTL),
            semantic_mode: get(header::SEMANTIC_MODE),
        }
    }

    /// Parses and clamps every knob to the contract's ranges and defaults.
    pub fn parse(&self) -> ParsedKnobs {
        self.parse_within(&KnobLimits::default())
    }

    /// Parses every knob, clamped to `limits` (an operator's bounds, [`policy`]); an
    /// absent or malformed value takes the limits' default.
    pub fn parse_within(&self, limits: &KnobLimits) -> ParsedKnobs {
        let defaults = limits.defaults;
        let mut parsed = ParsedKnobs {
            knobs: defaults,
            invalid: Vec::new(),
        };
        let mut report = |knob, problem| parsed.invalid.push(InvalidKnob { knob, problem });

        if let Some(raw) = self.prefetch {
            match Prefetch::parse(raw) {
                Some(level) => {
                    let capped = limits.cap_prefetch(level);
                    if capped != level {
                        report(KnobName::Prefetch, KnobProblem::Clamped);
                    }
                    parsed.knobs.prefetch = capped;
                }
                None => report(KnobName::Prefetch, KnobProblem::Malformed),
            }
        }
        if let Some(raw) = self.batch_threshold {
            let (value, problem) = clamp_f32(raw, limits.batch_threshold, defaults.batch_threshold);
            parsed.knobs.batch_threshold = value;
            if let Some(problem) = problem {
                report(KnobName::BatchThreshold, problem);
            }
        }
        if let Some(raw) = self.cache_ttl {
            let (value, problem) = clamp_seconds(raw, limits.cache_ttl_s, defaults.cache_ttl_s);
            parsed.knobs.cache_ttl_s = value;
            if let Some(problem) = problem {
                report(KnobName::CacheTtl, problem);
            }
        }
        if let Some(raw) = self.semantic_mode {
            match SemanticMode::parse(&raw.trim().to_ascii_lowercase()) {
                Some(mode) if limits.allows_mode(mode) => parsed.knobs.semantic_mode = mode,
                Some(_) => report(KnobName::SemanticMode, KnobProblem::Clamped),
                None => report(KnobName::SemanticMode, KnobProblem::Malformed),
            }
        }
        parsed
    }
}

fn clamp_f32(raw: &str, (low, high): (f32, f32), default: f32) -> (f32, Option<KnobProblem>) {
    match raw.trim().parse::<f32>() {
        Ok(v) if v.is_nan() => (default, Some(KnobProblem::Malformed)),
        Ok(v) if v < low => (low, Some(KnobProblem::Clamped)),
        Ok(v) if v > high => (high, Some(KnobProblem::Clamped)),
        Ok(v) => (v, None),
        Err(_) => (default, Some(KnobProblem::Malformed)),
    }
}

fn clamp_seconds(raw: &str, (low, high): (u32, u32), default: u32) -> (u32, Option<KnobProblem>) {
    let trimmed = raw.trim();
    let digits = trimmed.strip_suffix('s').unwrap_or(trimmed);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        // Allow a leading minus only to classify it as out of range, not malformed.
        return match digits.strip_prefix('-') {
            Some(rest) if !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()) => {
                (low, Some(KnobProblem::Clamped))
            }
            _ => (default, Some(KnobProblem::Malformed)),
        };
    }
    // Digits only: anything too long for u64 is certainly above the range.
    let value = digits.parse::<u64>().unwrap_or(u64::MAX);
    if value < u64::from(low) {
        (low, Some(KnobProblem::Clamped))
    } else if value > u64::from(high) {
        (high, Some(KnobProblem::Clamped))
    } else {
        (value as u32, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(prefetch: &str, threshold: &str, ttl: &str, mode: &str) -> ParsedKnobs {
        RawKnobs {
            prefetch: Some(prefetch),
            batch_threshold: Some(threshold),
            cache_ttl: Some(ttl),
            semantic_mode: Some(mode),
        }
        .parse()
    }

    #[test]
    fn valid_values_are_taken() {
        let p = parse(" High ", "0.7", "900s", "TOPIC");
        assert!(p.invalid.is_empty());
        assert_eq!(p.knobs.prefetch, Prefetch::High);
        assert_eq!(p.knobs.batch_threshold, 0.7);
        assert_eq!(p.knobs.cache_ttl_s, 900);
        assert_eq!(p.knobs.semantic_mode, SemanticMode::Topic);
    }

    #[test]
    fn out_of_range_numbers_are_clamped_and_reported() {
        let p = parse("low", "7", "-5", "hybrid");
        assert_eq!(p.knobs.batch_threshold, 0.9);
        assert_eq!(p.knobs.cache_ttl_s, 300);
        assert_eq!(
            p.invalid,
            [
                InvalidKnob {
                    knob: KnobName::BatchThreshold,
                    problem: KnobProblem::Clamped
                },
                InvalidKnob {
                    knob: KnobName::CacheTtl,
                    problem: KnobProblem::Clamped
                },
            ]
        );
        let huge = parse("low", "-inf", "99999999999999999999999", "intent");
        assert_eq!(huge.knobs.batch_threshold, 0.1);
        assert_eq!(huge.knobs.cache_ttl_s, 3600);
    }

    #[test]
    fn malformed_values_use_defaults_and_are_reported() {
        let p = parse("turbo", "NaN", "ten minutes", "vibes");
        assert_eq!(p.knobs, Knobs::default());
        assert_eq!(p.invalid.len(), 4);
        assert!(p
            .invalid
            .iter()
            .all(|i| i.problem == KnobProblem::Malformed));
    }

    #[test]
    fn absent_headers_are_defaults_without_reports() {
        let p = RawKnobs::default().parse();
        assert_eq!(p, ParsedKnobs::default());
    }
}
