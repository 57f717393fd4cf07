//! The operator's side of the knobs: defaults and bounds per route and per tenant.
//!
//! A knob header is a client's request; what a client may ask is the operator's call. An
//! SRE who turns Cohort on for a support app wants that app's default threshold, no
//! prefetch for a batch-inference route, and a tenant that pays for warm-ups allowed
//! `high` while others are capped at `medium`. The filter and the batcher read the same
//! section (`knobs` in the filter's JSON, `[knobs]` in `cohort serve`'s TOML):
//!
//! ```json
//! "knobs": {
//!   "global":  {"prefetch": "low", "max_prefetch": "medium"},
//!   "routes":  [{"authority": "support.example.com", "path_prefix": "/v1/",
//!                "knobs": {"batch_threshold": 0.7, "batch_threshold_range": [0.6, 0.9]}}],
//!   "tenants": {"acme": {"max_prefetch": "high", "cache_ttl_s": 1800}}
//! }
//! ```
//!
//! **Resolution.** Start from the contract's defaults and ranges ([`Knobs::default`],
//! [`BATCH_THRESHOLD_RANGE`], [`CACHE_TTL_RANGE_S`]); apply `global`, then the first route
//! rule whose `authority` (case-insensitive, port ignored) and `path_prefix` both match
//! (an absent one matches anything), then the tenant's rule. Each field comes from the
//! most specific rule that sets it: tenant over route over global. A default outside the
//! resolved bounds is pulled inside them.
//!
//! **A client's header narrows, never widens.** A value inside the resolved bounds is
//! taken; a number outside them, a prefetch level above `max_prefetch`, or a semantic mode
//! not in `semantic_modes` is pulled to the nearest allowed value (the nearest bound, the
//! cap, the default mode) and reported as [`KnobProblem::Clamped`]; a malformed value takes
//! the resolved default and is reported as [`KnobProblem::Malformed`], as in
//! [`RawKnobs::parse`].
//!
//! [`KnobProblem::Clamped`]: super::KnobProblem::Clamped
//! [`KnobProblem::Malformed`]: super::KnobProblem::Malformed
//! [`RawKnobs::parse`]: super::RawKnobs::parse

use super::{Knobs, Prefetch, BATCH_THRESHOLD_RANGE, CACHE_TTL_RANGE_S};
use crate::sketch::SemanticMode;
use serde::Deserialize;
use std::collections::BTreeMap;
use thiserror::Error;

/// One rule: defaults and bounds, each optional (unset: inherited).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KnobRule {
    /// Prefetch level when the request has no `x-cohort-prefetch`.
    pub prefetch: Option<Prefetch>,
    /// The most aggressive level a client may ask for.
    pub max_prefetch: Option<Prefetch>,
    /// Threshold when the request has no `x-cohort-batch-threshold`.
    pub batch_threshold: Option<f32>,
    /// `[low, high]` a client's threshold is clamped to (inside 0.1–0.9).
    pub batch_threshold_range: Option<[f32; 2]>,
    /// Cache TTL when the request has no `x-cohort-cache-ttl`, seconds.
    pub cache_ttl_s: Option<u32>,
    /// `[low, high]` a client's TTL is clamped to (inside 300–3600 s).
    pub cache_ttl_range_s: Option<[u32; 2]>,
    /// Semantic mode when the request has no `x-cohort-semantic-mode`.
    pub semantic_mode: Option<SemanticMode>,
    /// The modes a client may choose (absent: all three).
    pub semantic_modes: Option<Vec<SemanticMode>>,
}

/// A rule for the requests of one route: host and path prefix.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouteRule {
    /// The request's `:authority` (`Host`), without port; absent: any host.
    pub authority: Option<String>,
    /// A prefix of the request path; absent: any path.
    pub path_prefix: Option<String>,
    pub knobs: KnobRule,
}

/// The whole section.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KnobPolicy {
    pub global: KnobRule,
    /// First match wins.
    pub routes: Vec<RouteRule>,
    /// By tenant identity (the filter's tenant: trusted header or mTLS principal).
    pub tenants: BTreeMap<String, KnobRule>,
}

/// Why a knob policy was refused.
#[derive(Debug, Error, PartialEq)]
pub enum KnobPolicyError {
    #[error("knobs{place}.{field}: {detail}")]
    Invalid {
        place: String,
        field: &'static str,
        detail: String,
    },
}

/// What one request may use: the resolved defaults and bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KnobLimits {
    pub defaults: Knobs,
    pub max_prefetch: Prefetch,
    pub batch_threshold: (f32, f32),
    pub cache_ttl_s: (u32, u32),
    /// Allowed semantic modes, a bit per [`mode_bit`].
    pub semantic_modes: u8,
}

const ALL_MODES: u8 = 0b111;

fn mode_bit(mode: SemanticMode) -> u8 {
    match mode {
        SemanticMode::Intent => 1,
        SemanticMode::Topic => 2,
        SemanticMode::Hybrid => 4,
    }
}

/// Prefetch levels in order of aggressiveness.
fn prefetch_rank(level: Prefetch) -> u8 {
    match level {
        Prefetch::None => 0,
        Prefetch::Low => 1,
        Prefetch::Medium => 2,
        Prefetch::High => 3,
    }
}

impl Default for KnobLimits {
    /// The contract's defaults and ranges: what a request gets with no policy.
    fn default() -> Self {
        KnobLimits {
            defaults: Knobs::default(),
            max_prefetch: Prefetch::High,
            batch_threshold: BATCH_THRESHOLD_RANGE,
            cache_ttl_s: CACHE_TTL_RANGE_S,
            semantic_modes: ALL_MODES,
        }
    }
}

impl KnobLimits {
    fn overlay(&mut self, rule: &KnobRule) {
        if let Some(v) = rule.prefetch {
            self.defaults.prefetch = v;
        }
        if let Some(v) = rule.max_prefetch {
            self.max_prefetch = v;
        }
        if let Some(v) = rule.batch_threshold {
            self.defaults.batch_threshold = v;
        }
        if let Some([low, high]) = rule.batch_threshold_range {
            self.batch_threshold = (low, high);
        }
        if let Some(v) = rule.cache_ttl_s {
            self.defaults.cache_ttl_s = v;
        }
        if let Some([low, high]) = rule.cache_ttl_range_s {
            self.cache_ttl_s = (low, high);
        }
        if let Some(v) = rule.semantic_mode {
            self.defaults.semantic_mode = v;
        }
        if let Some(modes) = &rule.semantic_modes {
            self.semantic_modes = modes.iter().fold(0, |bits, m| bits | mode_bit(*m));
        }
    }

    /// Pulls the defaults inside the bounds (a route's default may fall outside a tenant's
    /// range).
    fn settle(mut self) -> Self {
        let mut d = self.defaults;
        d.prefetch = self.cap_prefetch(d.prefetch);
        d.batch_threshold = d
            .batch_threshold
            .clamp(self.batch_threshold.0, self.batch_threshold.1);
        d.cache_ttl_s = d.cache_ttl_s.clamp(self.cache_ttl_s.0, self.cache_ttl_s.1);
        if !self.allows_mode(d.semantic_mode) {
            d.semantic_mode = [
                SemanticMode::Intent,
                SemanticMode::Topic,
                SemanticMode::Hybrid,
            ]
            .into_iter()
            .find(|m| self.allows_mode(*m))
            .unwrap_or_default();
        }
        self.defaults = d;
        self
    }

    /// `level`, or the cap when it asks for more.
    pub fn cap_prefetch(&self, level: Prefetch) -> Prefetch {
        if prefetch_rank(level) > prefetch_rank(self.max_prefetch) {
            self.max_prefetch
        } else {
            level
        }
    }

    pub fn allows_mode(&self, mode: SemanticMode) -> bool {
        self.semantic_modes & mode_bit(mode) != 0
    }

    /// Knob values that came from elsewhere (the filter's, on the wire), pulled inside
    /// these bounds.
    pub fn narrow(&self, knobs: Knobs) -> Knobs {
        Knobs {
            prefetch: self.cap_prefetch(knobs.prefetch),
            batch_threshold: knobs
                .batch_threshold
                .clamp(self.batch_threshold.0, self.batch_threshold.1),
            cache_ttl_s: knobs
                .cache_ttl_s
                .clamp(self.cache_ttl_s.0, self.cache_ttl_s.1),
            semantic_mode: if self.allows_mode(knobs.semantic_mode) {
                knobs.semantic_mode
            } else {
                self.defaults.semantic_mode
            },
        }
    }
}

/// A request's route as the policy matches it.
#[derive(Debug, Clone, Copy, Default)]
pub struct RouteOf<'a> {
    /// `:authority` or `Host`, port included or not.
    pub authority: &'a str,
    pub path: &'a str,
}

impl RouteRule {
    fn matches(&self, route: RouteOf<'_>) -> bool {
        let host = route
            .authority
            .rsplit_once(':')
            .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
            .map_or(route.authority, |(host, _)| host);
        self.authority
            .as_deref()
            .is_none_or(|a| a.eq_ignore_ascii_case(host))
            && self
                .path_prefix
                .as_deref()
                .is_none_or(|p| route.path.starts_with(p))
    }
}

impl KnobPolicy {
    /// True when nothing is configured (every request gets [`KnobLimits::default`]).
    pub fn is_empty(&self) -> bool {
        self == &KnobPolicy::default()
    }

    /// The defaults and bounds for a request on `route` of `tenant`.
    pub fn limits(&self, route: RouteOf<'_>, tenant: Option<&str>) -> KnobLimits {
        let mut limits = KnobLimits::default();
        limits.overlay(&self.global);
        if let Some(rule) = self.routes.iter().find(|r| r.matches(route)) {
            limits.overlay(&rule.knobs);
        }
        if let Some(rule) = tenant.and_then(|t| self.tenants.get(t)) {
            limits.overlay(rule);
        }
        limits.settle()
    }

    /// Every value inside the contract's ranges, every range ordered, every mode list
    /// non-empty.
    pub fn validate(&self) -> Result<(), KnobPolicyError> {
        let places = std::iter::once((String::new(), &self.global))
            .chain(
                self.routes
                    .iter()
                    .enumerate()
                    .map(|(i, r)| (format!(".routes[{i}].knobs"), &r.knobs)),
            )
            .chain(
                self.tenants
                    .iter()
                    .map(|(t, r)| (format!(".tenants.{t}"), r)),
            );
        for (place, rule) in places {
            rule.validate(&place)?;
        }
        Ok(())
    }
}

impl KnobRule {
    fn validate(&self, place: &str) -> Result<(), KnobPolicyError> {
        let fail = |field, detail: String| {
            Err(KnobPolicyError::Invalid {
                place: if place.is_empty() {
                    ".global".into()
                } else {
                    place.into()
                },
                field,
                detail,
            })
        };
        let (tl, th) = BATCH_THRESHOLD_RANGE;
        let in_threshold = |v: f32| v.is_finite() && (tl..=th).contains(&v);
        if let Some(v) = self.batch_threshold.filter(|v| !in_threshold(*v)) {
            return fail("batch_threshold", format!("{v} is outside {tl}–{th}"));
        }
        if let Some([low, high]) = self.batch_threshold_range {
            if !(in_threshold(low) && in_threshold(high) && low <= high) {
                return fail(
                    "batch_threshold_range",
                    format!("[{low}, {high}] must be ordered and inside {tl}–{th}"),
                );
            }
        }
        let (cl, ch) = CACHE_TTL_RANGE_S;
        if let Some(v) = self.cache_ttl_s.filter(|v| !(cl..=ch).contains(v)) {
            return fail("cache_ttl_s", format!("{v} is outside {cl}–{ch}"));
        }
        if let Some([low, high]) = self.cache_ttl_range_s {
            if !((cl..=ch).contains(&low) && (cl..=ch).contains(&high) && low <= high) {
                return fail(
                    "cache_ttl_range_s",
                    format!("[{low}, {high}] must be ordered and inside {cl}–{ch}"),
                );
            }
        }
        if self.semantic_modes.as_ref().is_some_and(Vec::is_empty) {
            return fail("semantic_modes", "allows no mode".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::knobs::{KnobProblem, RawKnobs};

    fn policy(json: &str) -> KnobPolicy {
        let policy: KnobPolicy = serde_json::from_str(json).unwrap();
        policy.validate().unwrap();
        policy
    }

    const SUPPORT: RouteOf<'static> = RouteOf {
        authority: "Support.example.com:8443",
        path: "/v1/chat/completions",
    };

    #[test]
    fn no_policy_is_the_contract() {
        let limits = KnobPolicy::default().limits(SUPPORT, Some("acme"));
        assert_eq!(limits, KnobLimits::default());
        assert_eq!(
            RawKnobs::default().parse_within(&limits),
            RawKnobs::default().parse()
        );
    }

    #[test]
    fn the_tenant_overrides_the_route_which_overrides_global() {
        let p = policy(
            r#"{"global": {"prefetch": "low", "batch_threshold": 0.3},
                "routes": [{"authority": "other.example.com", "knobs": {"batch_threshold": 0.4}},
                           {"authority": "support.example.com", "path_prefix": "/v1/",
                            "knobs": {"batch_threshold": 0.7, "prefetch": "none"}},
                           {"knobs": {"batch_threshold": 0.2}}],
                "tenants": {"acme": {"prefetch": "high"}}}"#,
        );
        let support = p.limits(SUPPORT, None);
        assert_eq!(
            support.defaults.batch_threshold, 0.7,
            "first matching route"
        );
        assert_eq!(support.defaults.prefetch, Prefetch::None);
        let acme = p.limits(SUPPORT, Some("acme"));
        assert_eq!(acme.defaults.prefetch, Prefetch::High, "tenant over route");
        assert_eq!(
            acme.defaults.batch_threshold, 0.7,
            "unset by the tenant: the route's"
        );
        let elsewhere = RouteOf {
            authority: "chat.example.com",
            path: "/v1/chat/completions",
        };
        assert_eq!(p.limits(elsewhere, None).defaults.batch_threshold, 0.2);
        assert_eq!(p.limits(elsewhere, None).defaults.prefetch, Prefetch::Low);
        let wrong_path = RouteOf {
            authority: "support.example.com",
            path: "/openai/v1/chat/completions",
        };
        assert_eq!(p.limits(wrong_path, None).defaults.batch_threshold, 0.2);
    }

    #[test]
    fn a_client_header_narrows_within_the_bounds_and_never_widens() {
        let p = policy(
            r#"{"global": {"max_prefetch": "medium", "batch_threshold_range": [0.5, 0.8],
                           "cache_ttl_range_s": [600, 1200], "semantic_modes": ["intent", "hybrid"]}}"#,
        );
        let limits = p.limits(SUPPORT, None);
        let ask = |prefetch, threshold, ttl, mode| {
            RawKnobs {
                prefetch: Some(prefetch),
                batch_threshold: Some(threshold),
                cache_ttl: Some(ttl),
                semantic_mode: Some(mode),
            }
            .parse_within(&limits)
        };
        let inside = ask("low", "0.6", "900", "hybrid");
        assert!(inside.invalid.is_empty());
        assert_eq!(
            (
                inside.knobs.prefetch,
                inside.knobs.batch_threshold,
                inside.knobs.cache_ttl_s,
                inside.knobs.semantic_mode
            ),
            (Prefetch::Low, 0.6, 900, SemanticMode::Hybrid)
        );
        let outside = ask("HIGH", "0.9", "300", "topic");
        assert_eq!(outside.knobs.prefetch, Prefetch::Medium);
        assert_eq!(outside.knobs.batch_threshold, 0.8);
        assert_eq!(outside.knobs.cache_ttl_s, 600);
        assert_eq!(outside.knobs.semantic_mode, SemanticMode::Intent);
        assert_eq!(outside.invalid.len(), 4);
        assert!(outside
            .invalid
            .iter()
            .all(|i| i.problem == KnobProblem::Clamped));
        // Malformed: the resolved default, which the bounds pulled inside (0.5 stays).
        let malformed = ask("turbo", "x", "soon", "vibes");
        assert_eq!(malformed.knobs, limits.defaults);
        assert_eq!(
            malformed.knobs.cache_ttl_s, 600,
            "600 is inside [600, 1200]"
        );
        assert!(malformed
            .invalid
            .iter()
            .all(|i| i.problem == KnobProblem::Malformed));
    }

    #[test]
    fn a_default_outside_a_more_specific_range_is_pulled_inside() {
        let p = policy(
            r#"{"global": {"batch_threshold": 0.3, "prefetch": "high", "semantic_mode": "topic"},
                "tenants": {"t": {"batch_threshold_range": [0.5, 0.9], "max_prefetch": "low",
                                  "semantic_modes": ["hybrid"]}}}"#,
        );
        let d = p.limits(SUPPORT, Some("t")).defaults;
        assert_eq!(d.batch_threshold, 0.5);
        assert_eq!(d.prefetch, Prefetch::Low);
        assert_eq!(d.semantic_mode, SemanticMode::Hybrid);
    }

    #[test]
    fn values_from_the_wire_are_narrowed() {
        let p = policy(
            r#"{"tenants": {"t": {"max_prefetch": "none", "cache_ttl_range_s": [300, 900]}}}"#,
        );
        let limits = p.limits(SUPPORT, Some("t"));
        let wide = Knobs {
            prefetch: Prefetch::High,
            cache_ttl_s: 3600,
            ..Knobs::default()
        };
        let narrowed = limits.narrow(wide);
        assert_eq!(narrowed.prefetch, Prefetch::None);
        assert_eq!(narrowed.cache_ttl_s, 900);
        assert_eq!(narrowed.batch_threshold, 0.5);
    }

    #[test]
    fn bad_policies_are_refused_with_their_place() {
        for (json, field) in [
            (
                r#"{"global": {"batch_threshold": 0.95}}"#,
                "batch_threshold",
            ),
            (
                r#"{"routes": [{"knobs": {"batch_threshold_range": [0.8, 0.2]}}]}"#,
                "batch_threshold_range",
            ),
            (r#"{"tenants": {"a": {"cache_ttl_s": 10}}}"#, "cache_ttl_s"),
            (
                r#"{"global": {"cache_ttl_range_s": [300, 7200]}}"#,
                "cache_ttl_range_s",
            ),
            (r#"{"global": {"semantic_modes": []}}"#, "semantic_modes"),
        ] {
            let p: KnobPolicy = serde_json::from_str(json).unwrap();
            match p.validate() {
                Err(KnobPolicyError::Invalid { field: f, .. }) => assert_eq!(f, field, "{json}"),
                Ok(()) => panic!("accepted {json}"),
            }
        }
        assert!(serde_json::from_str::<KnobPolicy>(r#"{"global": {"prefech": "low"}}"#).is_err());
        let err = serde_json::from_str::<KnobPolicy>(r#"{"tenants": {"a": {"cache_ttl_s": 10}}}"#)
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(
            err.to_string().starts_with("knobs.tenants.a.cache_ttl_s"),
            "{err}"
        );
    }
}
