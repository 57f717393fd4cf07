//! The header contract (docs/CONTRACT.md, "Headers"): the names of every header the
//! filter, the batch front and the batcher read or write. One type, configurable, read by
//! all three: the filter's `headers` and `tenant_header` (JSON) and `cohort serve`'s
//! `[headers]` and `tenant_header` (TOML) have the same keys, so an operator who renames a
//! header renames it the same way everywhere.

use crate::knobs::header as knob;
use serde::Deserialize;
use thiserror::Error;

/// The tenant header's default name.
pub const TENANT: &str = "x-cohort-tenant";

/// The endpoint header's default name (the Gateway API Inference Extension's).
pub const ENDPOINT: &str = "x-gateway-destination-endpoint";

/// Names of the headers Cohort reads and writes (the tenant header apart: it is a
/// top-level setting of each part, `tenant_header`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HeaderNames {
    /// The routing key (16 hex digits).
    pub key: String,
    pub prefix: String,
    pub fp: String,
    /// The version of the sketch in `fp` (sketches of different versions do not compare).
    pub fp_version: String,
    pub cluster: String,
    /// The replica the batcher chose (assign and batch mode).
    pub shard: String,
    /// Assign mode: the chosen replica's `ip:port`, which the engines' cluster routes on
    /// with Envoy's `override_host` policy (the Gateway API Inference Extension's name).
    pub endpoint: String,
    /// Batch mode: on a request, the index of the batcher shard whose HTTP front should
    /// take it (routes match it); on the front's answer, `role;replica=NAME`.
    pub batch: String,
    pub bypass: String,
    pub response: String,
    /// On a response: the knob headers the request set that had no effect in the mode it
    /// was routed in (`prefetch,cache-ttl`).
    pub ignored: String,
    pub prefetch: String,
    pub batch_threshold: String,
    pub cache_ttl: String,
    pub semantic_mode: String,
    pub routing_key: String,
    pub original_query: String,
    pub session: String,
}

impl Default for HeaderNames {
    fn default() -> Self {
        HeaderNames {
            key: "x-cohort-key".into(),
            prefix: "x-cohort-prefix".into(),
            fp: "x-cohort-fp".into(),
            fp_version: "x-cohort-fp-version".into(),
            cluster: "x-cohort-cluster".into(),
            shard: "x-cohort-shard".into(),
            endpoint: ENDPOINT.into(),
            batch: "x-cohort-batch".into(),
            bypass: "x-cohort-bypass".into(),
            response: "x-cohort".into(),
            ignored: "x-cohort-ignored".into(),
            prefetch: knob::PREFETCH.into(),
            batch_threshold: knob::BATCH_THRESHOLD.into(),
            cache_ttl: knob::CACHE_TTL.into(),
            semantic_mode: knob::SEMANTIC_MODE.into(),
            routing_key: knob::ROUTING_KEY.into(),
            original_query: knob::ORIGINAL_QUERY.into(),
            session: knob::SESSION.into(),
        }
    }
}

/// Why a set of header names was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum HeaderNameError {
    #[error("header name for {field} ({value:?}) must be a non-empty lowercase HTTP token")]
    Invalid { field: &'static str, value: String },
    #[error("header name {value:?} is configured for both {first} and {second}")]
    Duplicate {
        first: &'static str,
        second: &'static str,
        value: String,
    },
}

impl HeaderNames {
    /// Headers only the filter may write: a client's values are removed from every request.
    pub fn reserved(&self) -> [&str; 9] {
        [
            &self.key,
            &self.prefix,
            &self.fp,
            &self.fp_version,
            &self.cluster,
            &self.shard,
            &self.endpoint,
            &self.batch,
            &self.bypass,
        ]
    }

    /// Every name with its configuration key.
    pub fn all(&self) -> [(&'static str, &str); 18] {
        [
            ("key", &self.key),
            ("prefix", &self.prefix),
            ("fp", &self.fp),
            ("fp_version", &self.fp_version),
            ("cluster", &self.cluster),
            ("shard", &self.shard),
            ("endpoint", &self.endpoint),
            ("batch", &self.batch),
            ("bypass", &self.bypass),
            ("response", &self.response),
            ("ignored", &self.ignored),
            ("prefetch", &self.prefetch),
            ("batch_threshold", &self.batch_threshold),
            ("cache_ttl", &self.cache_ttl),
            ("semantic_mode", &self.semantic_mode),
            ("routing_key", &self.routing_key),
            ("original_query", &self.original_query),
            ("session", &self.session),
        ]
    }

    /// Every name, `tenant_header` included, is a lowercase HTTP token (Envoy stores
    /// names lowercase) and no two are the same: one name for two headers would make the
    /// filter overwrite, or strip as spoofed, a header it reads.
    pub fn validate(&self, tenant_header: &str) -> Result<(), HeaderNameError> {
        let mut names = self.all().to_vec();
        names.push(("tenant_header", tenant_header));
        for (i, &(field, value)) in names.iter().enumerate() {
            if !is_header_token(value) {
                return Err(HeaderNameError::Invalid {
                    field,
                    value: value.to_owned(),
                });
            }
            if let Some(&(first, _)) = names[..i].iter().find(|(_, v)| *v == value) {
                return Err(HeaderNameError::Duplicate {
                    first,
                    second: field,
                    value: value.to_owned(),
                });
            }
        }
        Ok(())
    }
}

/// Lowercase RFC 9110 token (how Envoy hands header names over).
pub fn is_header_token(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b"!#$%&'*+-.^_`|~".contains(&b)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_renames_are_checked() {
        assert_eq!(HeaderNames::default().validate(TENANT), Ok(()));
        let renamed = HeaderNames {
            session: "x-conversation".into(),
            ..HeaderNames::default()
        };
        assert_eq!(renamed.validate("x-org"), Ok(()));
        assert!(matches!(
            HeaderNames::default().validate("x-cohort-key"),
            Err(HeaderNameError::Duplicate {
                first: "key",
                second: "tenant_header",
                ..
            })
        ));
        assert!(matches!(
            HeaderNames::default().validate("X-Org"),
            Err(HeaderNameError::Invalid {
                field: "tenant_header",
                ..
            })
        ));
    }
}
