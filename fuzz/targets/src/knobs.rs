//! Knob headers: the input is header lines (`name:value`, split at the first `:`), with
//! arbitrary names, invalid UTF-8 (replaced, as a header map that only holds strings
//! would), and any value — NaN, infinities, huge numbers, signs, units, whitespace.
//!
//! Invariants: effective values always lie in their ranges (the threshold finite in
//! 0.1–0.9, the TTL in 300–3600 s); a knob is reported at most once, and only when its
//! header was sent; a clamped value sits on a bound; a value taken as valid reads back the
//! same from its own display; the filter reads exactly the same knobs from the same
//! headers.

use cohort_filter::config::FilterConfig;
use cohort_filter::decision::{inspect_headers, HeadersVerdict};
use cohort_fingerprint::knobs::{
    KnobName, KnobProblem, Knobs, RawKnobs, BATCH_THRESHOLD_RANGE, CACHE_TTL_RANGE_S,
};

const KNOBS: [KnobName; 4] = [
    KnobName::Prefetch,
    KnobName::BatchThreshold,
    KnobName::CacheTtl,
    KnobName::SemanticMode,
];

/// The fuzz target.
pub fn knobs(data: &[u8]) {
    let pairs: Vec<(String, String)> = data
        .split(|b| *b == b'\n')
        .filter_map(|line| {
            let colon = line.iter().position(|b| *b == b':')?;
            Some((
                String::from_utf8_lossy(&line[..colon]).into_owned(),
                String::from_utf8_lossy(&line[colon + 1..]).into_owned(),
            ))
        })
        .collect();
    let get = |name: &str| {
        pairs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let raw = RawKnobs::from_headers(get);
    let parsed = raw.parse();
    assert_eq!(parsed, raw.parse(), "deterministic");
    let knobs = parsed.knobs;
    let (low, high) = BATCH_THRESHOLD_RANGE;
    assert!(
        knobs.batch_threshold.is_finite() && (low..=high).contains(&knobs.batch_threshold),
        "threshold {} out of range",
        knobs.batch_threshold
    );
    let (ttl_low, ttl_high) = CACHE_TTL_RANGE_S;
    assert!((ttl_low..=ttl_high).contains(&knobs.cache_ttl_s));
    let defaults = Knobs::default();
    for knob in KNOBS {
        let reports: Vec<_> = parsed.invalid.iter().filter(|i| i.knob == knob).collect();
        assert!(
            reports.len() <= 1,
            "{knob:?} reported {} times",
            reports.len()
        );
        if get(knob.header()).is_none() {
            assert!(reports.is_empty(), "{knob:?} reported but not sent");
        }
        if let Some(report) = reports.first() {
            if report.problem == KnobProblem::Clamped {
                match knob {
                    KnobName::BatchThreshold => {
                        assert!(knobs.batch_threshold == low || knobs.batch_threshold == high)
                    }
                    KnobName::CacheTtl => {
                        assert!(knobs.cache_ttl_s == ttl_low || knobs.cache_ttl_s == ttl_high)
                    }
                    _ => panic!("{knob:?} is not numeric, yet clamped"),
                }
            }
        }
    }
    if parsed.invalid.is_empty() {
        let display_threshold = knobs.batch_threshold.to_string();
        let display_ttl = knobs.cache_ttl_s.to_string();
        let again = RawKnobs {
            prefetch: Some(knobs.prefetch.as_str()),
            batch_threshold: Some(&display_threshold),
            cache_ttl: Some(&display_ttl),
            semantic_mode: Some(knobs.semantic_mode.as_str()),
        }
        .parse();
        assert!(again.invalid.is_empty());
        assert_eq!(again.knobs, knobs, "a valid value reads back the same");
    } else {
        let malformed_threshold = parsed
            .invalid
            .iter()
            .any(|i| i.knob == KnobName::BatchThreshold && i.problem == KnobProblem::Malformed);
        if malformed_threshold {
            assert_eq!(knobs.batch_threshold, defaults.batch_threshold);
        }
    }

    let config = FilterConfig::default();
    let mut headers: Vec<(String, String)> = vec![
        (":method".into(), "POST".into()),
        (":path".into(), "/v1/chat/completions".into()),
    ];
    headers.extend(pairs.iter().cloned());
    match inspect_headers(&config, &headers, None) {
        HeadersVerdict::Buffer(plan) => {
            assert_eq!(plan.knobs, parsed, "the filter reads the same knobs")
        }
        HeadersVerdict::Bypass(_) => {}
        HeadersVerdict::Ignore => panic!("a POST to an API path was ignored"),
    }
}
