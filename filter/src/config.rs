//! The filter's plugin configuration (the JSON in Envoy's `configuration` or Istio's
//! `pluginConfig`), with defaults for everything and validation.
//!
//! An invalid configuration is never fatal to traffic: the root context logs why and every
//! request passes through untouched (`x-cohort-bypass: invalid_config`).
//!
//! ```json
//! {
//!   "mode": "affinity",
//!   "body_limit_bytes": 1048576,
//!   "header_limit_bytes": 8192,
//!   "api_paths": ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"],
//!   "tenant_header": "x-cohort-tenant",
//!   "trust_tenant_header": false,
//!   "salt_secret": "",
//!   "batcher_clusters": [],
//!   "assign_deadline_ms": 25,
//!   "observe": true,
//!   "histogram_sample_every": 8,
//!   "headers": { "key": "x-cohort-key", "...": "..." },
//!   "rollout": { "share": 1.0, "key_header": "x-cohort-session" },
//!   "knobs": { "global": {}, "routes": [], "tenants": {} },
//!   "learned_cohorts": { "capacity": 128, "per_tenant": 32 },
//!   "response_stats": { "max_routes": 8 },
//!   "breaker": { "enabled": true, "window_s": 10, "max_error_rate": 0.005,
//!                "absolute_max_error_rate": 0.005, "...": "..." }
//! }
//! ```

use crate::breaker::BreakerConfig;
use crate::rollout::Rollout;
use cohort_fingerprint::knobs::policy::{KnobPolicy, KnobPolicyError};
use serde::Deserialize;
use thiserror::Error;

/// How the filter routes (docs/CONTRACT.md, "Modes").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// `x-cohort-key` for a consistent-hash DestinationRule; needs no batcher.
    #[default]
    Affinity,
    /// Ask the batcher for a shard (falls back to affinity on timeout or error).
    Assign,
    /// As assign, and mark the request `x-cohort-batch: <batcher shard index>` so a route
    /// sends it to that batcher's HTTP front, which co-batches its cohort (on Assign failure: affinity,
    /// unmarked, straight to an engine).
    Batch,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Affinity => "affinity",
            Mode::Assign => "assign",
            Mode::Batch => "batch",
        }
    }
}

use cohort_fingerprint::headers::HeaderNameError;
pub use cohort_fingerprint::headers::HeaderNames;

/// The whole plugin configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FilterConfig {
    pub mode: Mode,
    /// Largest body buffered and fingerprinted; larger bodies are bypassed, never rejected.
    /// Keep it well below the listener's `per_connection_buffer_limit_bytes` (one read can
    /// add megabytes; the configs use 8 MiB for the default 1 MiB).
    pub body_limit_bytes: usize,
    /// Largest total size of request headers (names + values) acted on.
    pub header_limit_bytes: usize,
    /// Request paths (query string ignored) the filter acts on; matched as suffixes so
    /// `/openai/v1/chat/completions` counts. Everything else passes untouched.
    pub api_paths: Vec<String>,
    /// Header carrying the tenant; salts every hash.
    pub tenant_header: String,
    /// Whether the tenant header is trusted as received (an earlier filter set it after
    /// authentication). If false, a client's value is removed and the tenant is the mTLS
    /// peer identity (`source.principal`), or none.
    pub trust_tenant_header: bool,
    /// Deployment secret mixed into every tenant salt.
    pub salt_secret: String,
    /// Envoy clusters of the batcher's gRPC API, one per batcher shard (a request's
    /// routing key picks its shard by jump hashing). Empty (the default): no batcher, so
    /// affinity mode only and no observations; assign and batch modes require one.
    pub batcher_clusters: Vec<String>,
    /// Deadline of an Assign call before falling back to affinity.
    pub assign_deadline_ms: u64,
    /// Whether to stream observations to the batcher (when `batcher_clusters` is set).
    pub observe: bool,
    /// One fingerprinted request in this many is timed and recorded in the histograms
    /// `cohort_fingerprint_us`, `cohort_sketch_us` and `cohort_body_bytes` (each worker's
    /// first request included); 1 records every request. Each sample costs four clock reads
    /// and three metric calls out of the wasm VM, several µs per request on a 2 KB body;
    /// counters count every request whatever this is.
    pub histogram_sample_every: u32,
    pub headers: HeaderNames,
    /// Which users and routes Cohort acts on; the rest is the hold-out ([`crate::rollout`]).
    pub rollout: Rollout,
    /// The automatic breaker ([`crate::breaker`]).
    pub breaker: BreakerConfig,
    /// Operator defaults and bounds of the client knobs, per route and per tenant
    /// ([`cohort_fingerprint::knobs::policy`]).
    pub knobs: KnobPolicy,
    /// Learned cohorts ([`cohort_fingerprint::learned`]): when set, bare prompts are grouped
    /// by a leader clustering of the traffic this Envoy sees, kept in its shared data,
    /// instead of by the codebook's cells alone. Unset (the default): codebook ids.
    pub learned_cohorts: Option<LearnedCohortsConfig>,
    /// The per-group response stats ([`crate::response_series`]).
    pub response_stats: ResponseStatsConfig,
}

/// The `response_stats` section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResponseStatsConfig {
    /// Route names (per Envoy, the first ones its workers meet) that get series of their
    /// own, 0 to 64; later routes are counted under `other`. 0: no route is read, every
    /// request is counted under `other`. Each named route adds about 400 series
    /// (docs/METRICS.md).
    pub max_routes: usize,
}

impl Default for ResponseStatsConfig {
    fn default() -> Self {
        ResponseStatsConfig { max_routes: 8 }
    }
}

/// The `learned_cohorts` section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LearnedCohortsConfig {
    /// Leaders the table holds over all tenants (1 to 4,096; 52 bytes each).
    pub capacity: usize,
    /// Leaders of one tenant (and semantic mode, anchors and threshold), 1 to `capacity`:
    /// a tenant whose prompts rarely meet evicts only its own.
    pub per_tenant: usize,
}

impl LearnedCohortsConfig {
    /// The core's capacity.
    pub fn capacity(&self) -> cohort_fingerprint::learned::Capacity {
        cohort_fingerprint::learned::Capacity {
            total: self.capacity,
            per_scope: self.per_tenant,
        }
    }
}

impl Default for LearnedCohortsConfig {
    fn default() -> Self {
        LearnedCohortsConfig {
            capacity: cohort_fingerprint::learned::DEFAULT_CAPACITY,
            per_tenant: cohort_fingerprint::learned::DEFAULT_PER_SCOPE,
        }
    }
}

impl Default for FilterConfig {
    fn default() -> Self {
        FilterConfig {
            mode: Mode::Affinity,
            body_limit_bytes: 1024 * 1024,
            header_limit_bytes: 8 * 1024,
            api_paths: [
                "/v1/chat/completions",
                "/v1/completions",
                "/v1/responses",
                "/v1/messages",
            ]
            .map(String::from)
            .to_vec(),
            tenant_header: cohort_fingerprint::headers::TENANT.into(),
            trust_tenant_header: false,
            salt_secret: String::new(),
            batcher_clusters: Vec::new(),
            assign_deadline_ms: 25,
            observe: true,
            histogram_sample_every: 8,
            headers: HeaderNames::default(),
            rollout: Rollout::default(),
            breaker: BreakerConfig::default(),
            knobs: KnobPolicy::default(),
            learned_cohorts: None,
            response_stats: ResponseStatsConfig::default(),
        }
    }
}

/// Why a configuration was refused.
#[derive(Debug, Error, PartialEq)]
pub enum ConfigError {
    #[error("configuration is not valid JSON for the cohort filter: {0}")]
    Json(String),
    #[error("{field} must be between {min} and {max}, got {value}")]
    OutOfRange {
        field: &'static str,
        value: u64,
        min: u64,
        max: u64,
    },
    #[error(transparent)]
    Headers(#[from] HeaderNameError),
    #[error("api_paths must be non-empty, got {0:?}")]
    ApiPaths(Vec<String>),
    #[error("api_paths entry {0:?} can never match: it must start with '/', not end with '/', and contain no '?' or '#' (the query string and a trailing '/' are ignored when matching)")]
    ApiPath(String),
    #[error("batcher_clusters entries must be non-empty and distinct, got {0:?}")]
    BatcherClusters(Vec<String>),
    #[error("mode {0} needs at least one entry in batcher_clusters")]
    NoBatcher(&'static str),
    #[error(transparent)]
    BatcherTarget(#[from] crate::grpc_target::TargetTooLong),
    #[error("{field} must be between {min} and {max}, got {value}")]
    OutOfRangeF {
        field: &'static str,
        value: f64,
        min: f64,
        max: f64,
    },
    #[error(transparent)]
    Knobs(#[from] KnobPolicyError),
    #[error("rollout.key_header {0:?} must be a lowercase HTTP token that Cohort does not reserve for itself")]
    RolloutKeyHeader(String),
}

impl FilterConfig {
    /// Whether the operator set a knob policy (`knobs`).
    pub fn has_knob_policy(&self) -> bool {
        !self.knobs.is_empty()
    }

    /// Parses and validates; empty input means all defaults.
    pub fn parse(bytes: &[u8]) -> Result<FilterConfig, ConfigError> {
        let config: FilterConfig = if bytes.iter().all(u8::is_ascii_whitespace) {
            FilterConfig::default()
        } else {
            serde_json::from_slice(bytes).map_err(|e| ConfigError::Json(e.to_string()))?
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        range(
            "body_limit_bytes",
            self.body_limit_bytes as u64,
            1,
            64 << 20,
        )?;
        range(
            "header_limit_bytes",
            self.header_limit_bytes as u64,
            256,
            1 << 20,
        )?;
        range("assign_deadline_ms", self.assign_deadline_ms, 1, 10_000)?;
        range(
            "histogram_sample_every",
            u64::from(self.histogram_sample_every),
            1,
            10_000,
        )?;
        range(
            "response_stats.max_routes",
            self.response_stats.max_routes as u64,
            0,
            64,
        )?;
        if self.api_paths.is_empty() {
            return Err(ConfigError::ApiPaths(self.api_paths.clone()));
        }
        // `is_api_path` drops the query, the fragment and a trailing '/' before matching,
        // so a configured path with any of them would be accepted and never match.
        if let Some(path) = self
            .api_paths
            .iter()
            .find(|p| !p.starts_with('/') || p.ends_with('/') || p.contains(['?', '#']))
        {
            return Err(ConfigError::ApiPath(path.clone()));
        }
        let clusters = &self.batcher_clusters;
        if clusters
            .iter()
            .enumerate()
            .any(|(i, c)| c.is_empty() || clusters[..i].contains(c))
        {
            return Err(ConfigError::BatcherClusters(clusters.clone()));
        }
        if self.mode != Mode::Affinity && clusters.is_empty() {
            return Err(ConfigError::NoBatcher(self.mode.as_str()));
        }
        for cluster in clusters {
            crate::grpc_target::grpc_target(cluster)?;
        }
        self.headers.validate(&self.tenant_header)?;
        self.knobs.validate()?;
        if let Some(learned) = &self.learned_cohorts {
            range(
                "learned_cohorts.capacity",
                learned.capacity as u64,
                1,
                cohort_fingerprint::learned::MAX_CAPACITY as u64,
            )?;
            range(
                "learned_cohorts.per_tenant",
                learned.per_tenant as u64,
                1,
                learned.capacity as u64,
            )?;
        }
        self.validate_rollout()
    }

    fn validate_rollout(&self) -> Result<(), ConfigError> {
        range_f("rollout.share", self.rollout.share, 0.0, 1.0)?;
        if let Some(name) = &self.rollout.key_header {
            if !cohort_fingerprint::headers::is_header_token(name)
                || self.headers.reserved().contains(&name.as_str())
            {
                return Err(ConfigError::RolloutKeyHeader(name.clone()));
            }
        }
        let b = &self.breaker;
        range("breaker.window_s", b.window_s, 1, 3600)?;
        range("breaker.min_requests", b.min_requests, 1, 1_000_000)?;
        range_f("breaker.max_error_rate", b.max_error_rate, 0.0, 1.0)?;
        range_f(
            "breaker.max_latency_increase",
            b.max_latency_increase,
            0.0,
            1000.0,
        )?;
        range_f(
            "breaker.min_latency_delta_ms",
            b.min_latency_delta_ms,
            0.0,
            600_000.0,
        )?;
        range("breaker.cool_down_s", b.cool_down_s, 1, 86_400)?;
        range_f("breaker.probe_share", b.probe_share, 0.0001, 1.0)?;
        range("breaker.probe_s", b.probe_s, 1, 3600)?;
        range_f(
            "breaker.absolute_max_error_rate",
            b.absolute_max_error_rate,
            0.0,
            1.0,
        )?;
        range(
            "breaker.absolute_min_requests",
            b.absolute_min_requests,
            1,
            1_000_000,
        )?;
        range_f("breaker.evidence_z", b.evidence_z, 0.0, 10.0)
    }

    /// Whether the breaker judges: it is enabled, and it has a rule that can trip: the
    /// absolute rule, or the relative one with a hold-out to compare with (share below
    /// 1). Only then are outcomes recorded and folded; with neither, the filter spends
    /// nothing on it.
    pub fn breaker_judges(&self) -> bool {
        let holdout = self.rollout.treated_buckets() < crate::rollout::BUCKETS;
        self.breaker.enabled && (holdout || self.breaker.absolute_enabled)
    }

    /// The header a request's rollout bucket is taken from.
    pub fn rollout_key_header(&self) -> &str {
        self.rollout
            .key_header
            .as_deref()
            .unwrap_or(&self.headers.session)
    }

    /// True when `path` (query string ignored) is one of the LLM API paths.
    pub fn is_api_path(&self, path: &str) -> bool {
        let path = path.split(['?', '#']).next().unwrap_or(path);
        let path = path.strip_suffix('/').unwrap_or(path);
        self.api_paths
            .iter()
            .any(|suffix| path.ends_with(suffix.as_str()))
    }
}

fn range_f(field: &'static str, value: f64, min: f64, max: f64) -> Result<(), ConfigError> {
    // NaN fails the range test too.
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::OutOfRangeF {
            field,
            value,
            min,
            max,
        })
    }
}

fn range(field: &'static str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange {
            field,
            value,
            min,
            max,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_config_is_all_defaults() {
        assert_eq!(FilterConfig::parse(b"").unwrap(), FilterConfig::default());
        assert_eq!(FilterConfig::parse(b"{}").unwrap(), FilterConfig::default());
    }

    #[test]
    fn fields_override_defaults() {
        let config = FilterConfig::parse(
            br#"{"mode":"assign","batcher_clusters":["b0"],"body_limit_bytes":65536,"headers":{"key":"x-route-key"}}"#,
        )
        .unwrap();
        assert_eq!(config.mode, Mode::Assign);
        assert_eq!(config.body_limit_bytes, 65536);
        assert_eq!(config.headers.key, "x-route-key");
        assert_eq!(config.headers.fp, "x-cohort-fp");
    }

    #[test]
    fn invalid_configs_say_why() {
        let err = |json: &str| {
            FilterConfig::parse(json.as_bytes())
                .unwrap_err()
                .to_string()
        };
        assert!(err(r#"{"mode":"turbo"}"#).contains("unknown variant"));
        assert!(err(r#"{"body_limt_bytes":1}"#).contains("unknown field"));
        assert!(err(r#"{"body_limit_bytes":0}"#).contains("body_limit_bytes must be between"));
        assert!(err(r#"{"headers":{"key":"X-Key"}}"#).contains("header name for key"));
        assert!(err(r#"{"api_paths":[]}"#).contains("api_paths"));
        for never_matches in ["v1/chat", "/v1/chat/", "/", "/v1/chat?x=1", "/v1/chat#a"] {
            let config = format!(r#"{{"api_paths":["/v1/messages","{never_matches}"]}}"#);
            assert!(err(&config).contains("can never match"), "{never_matches}");
        }
        assert!(err(r#"{"headers":{"shard":"x-cohort-key"}}"#)
            .contains("configured for both key and shard"));
        assert!(err(r#"{"tenant_header":"x-cohort-session"}"#).contains("both"));
        assert!(err("not json").contains("not valid JSON"));
        assert!(err(r#"{"batcher_clusters":["a","a"]}"#).contains("distinct"));
        assert!(err(r#"{"mode":"assign","batcher_clusters":[]}"#).contains("needs at least one"));
        let long = format!(
            r#"{{"mode":"assign","batcher_clusters":["outbound|50051||b.{}.svc.cluster.local"]}}"#,
            "n".repeat(100)
        );
        assert!(err(&long).contains("too long"));
        assert!(err(r#"{"rollout":{"share":1.5}}"#).contains("rollout.share must be between"));
        assert!(err(r#"{"rollout":{"key_header":"X-User"}}"#).contains("key_header"));
        assert!(err(r#"{"rollout":{"key_header":"x-cohort-key"}}"#).contains("key_header"));
        assert!(err(r#"{"rollout":{"shares":1}}"#).contains("unknown field"));
        assert!(err(r#"{"breaker":{"window_s":0}}"#).contains("breaker.window_s"));
        assert!(err(r#"{"breaker":{"probe_share":0}}"#).contains("breaker.probe_share"));
        assert!(err(r#"{"breaker":{"max_error_rate":2}}"#).contains("max_error_rate"));
        assert!(err(r#"{"breaker":{"absolute_max_error_rate":-1}}"#)
            .contains("breaker.absolute_max_error_rate"));
        assert!(err(r#"{"breaker":{"absolute_min_requests":0}}"#)
            .contains("breaker.absolute_min_requests"));
        assert!(err(r#"{"breaker":{"evidence_z":11}}"#).contains("breaker.evidence_z"));
        assert!(err(r#"{"learned_cohorts":{"capacity":0}}"#).contains("learned_cohorts.capacity"));
        assert!(err(r#"{"learned_cohorts":{"size":8}}"#).contains("unknown field"));
        assert!(
            err(r#"{"learned_cohorts":{"capacity":16,"per_tenant":17}}"#)
                .contains("learned_cohorts.per_tenant")
        );
    }

    #[test]
    fn learned_cohorts_are_off_unless_configured() {
        assert_eq!(FilterConfig::default().learned_cohorts, None);
        let on = FilterConfig::parse(br#"{"learned_cohorts":{}}"#).unwrap();
        assert_eq!(on.learned_cohorts.unwrap().capacity, 128);
        let sized = FilterConfig::parse(br#"{"learned_cohorts":{"capacity":16,"per_tenant":4}}"#);
        let sized = sized.unwrap().learned_cohorts.unwrap().capacity();
        assert_eq!((sized.total, sized.per_scope), (16, 4));
    }

    #[test]
    fn the_rollout_key_defaults_to_the_session_header() {
        let config = FilterConfig::parse(br#"{"headers":{"session":"x-conv"}}"#).unwrap();
        assert_eq!(config.rollout_key_header(), "x-conv");
        let config =
            FilterConfig::parse(br#"{"rollout":{"share":0.05,"key_header":"x-user-id"}}"#).unwrap();
        assert_eq!(config.rollout_key_header(), "x-user-id");
        assert_eq!(config.rollout.treated_buckets(), 500);
        assert!(config.breaker_judges());
        // Without a hold-out the absolute rule still judges; with neither rule, or the
        // breaker off, nothing is judged.
        assert!(FilterConfig::default().breaker_judges());
        let neither = FilterConfig::parse(br#"{"breaker":{"absolute_enabled":false}}"#);
        assert!(!neither.unwrap().breaker_judges());
        let relative = br#"{"rollout":{"share":0.95},"breaker":{"absolute_enabled":false}}"#;
        assert!(FilterConfig::parse(relative).unwrap().breaker_judges());
        let off = FilterConfig::parse(br#"{"rollout":{"share":0.5},"breaker":{"enabled":false}}"#);
        assert!(!off.unwrap().breaker_judges());
    }

    #[test]
    fn api_paths_match_as_suffixes_without_query() {
        let config = FilterConfig::default();
        assert!(config.is_api_path("/v1/chat/completions"));
        assert!(config.is_api_path("/openai/v1/chat/completions?api-version=2"));
        assert!(config.is_api_path("/v1/messages/"));
        assert!(!config.is_api_path("/v1/models"));
        assert!(!config.is_api_path("/v1/embeddings"));
    }
}
