//! Tenant salts, cohort ids and the routing key.
//!
//! The routing key is what a DestinationRule hashes (`x-cohort-key`, 16 hex digits):
//! `xxh3_64(anchor ‖ app key, seed = tenant salt)`. The *anchor* is the request's stable
//! prefix (model + system + tools) when it has a system prompt or tools — so an
//! application's requests share the replica that holds its system prompt in KV cache — and
//! otherwise its cohort code, the nearest centroid of the shipped codebook
//! ([`crate::sketch::codebook`]), so bare prompts of one intent meet on one replica. The app key (`x-cohort-routing-key`) lets an application split or
//! merge traffic further (e.g. by rule hash).
//!
//! Every hash is seeded by the tenant salt: one tenant can neither steer its requests onto
//! another tenant's key nor probe another tenant's prefix cache by replaying its prompts.

use std::fmt;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Per-tenant seed for every Cohort hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TenantSalt(pub u64);

impl Default for TenantSalt {
    /// No secret, no tenant: what the filter, the CLI and the core use by default.
    fn default() -> Self {
        TenantSalt::new(b"", None)
    }
}

impl TenantSalt {
    /// Salt for `tenant` under a deployment secret (the filter's config; empty is allowed).
    pub fn new(secret: &[u8], tenant: Option<&str>) -> TenantSalt {
        let base = xxh3_64(secret);
        TenantSalt(match tenant {
            Some(tenant) => xxh3_64_with_seed(tenant.as_bytes(), base),
            None => base,
        })
    }

    /// The tenant's cohort id for a cohort code ([`crate::IntentSketch::cohort`]): what
    /// `x-cohort-cluster` and the records show. Salted like every other hash, so two
    /// tenants sending the same prompt see different cohort ids and one cannot learn or
    /// target another's cohorts; within a tenant, equal codes keep equal ids.
    pub fn cohort(self, code: u32) -> u32 {
        xxh3_64_with_seed(&code.to_le_bytes(), self.0 ^ COHORT_DOMAIN) as u32
    }
}

/// Separates cohort ids from the other hashes seeded by the same salt.
const COHORT_DOMAIN: u64 = 0x636f_686f_7274_6964;

/// What a request's routing key is anchored on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Anchor {
    /// Hash of model + system + tools.
    StablePrefix(u64),
    /// Cohort code of the intent (codebook level and centroid).
    Cohort(u32),
}

impl Anchor {
    pub fn as_str(self) -> &'static str {
        match self {
            Anchor::StablePrefix(_) => "stable_prefix",
            Anchor::Cohort(_) => "cohort",
        }
    }
}

/// A 64-bit routing key, shown as 16 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RoutingKey(pub u64);

impl RoutingKey {
    pub fn new(salt: TenantSalt, anchor: Anchor, app_key: Option<&str>) -> RoutingKey {
        let mut input = Vec::with_capacity(9 + app_key.map_or(0, str::len));
        match anchor {
            Anchor::StablePrefix(hash) => {
                input.push(b'p');
                input.extend_from_slice(&hash.to_le_bytes());
            }
            Anchor::Cohort(code) => {
                input.push(b'c');
                input.extend_from_slice(&code.to_le_bytes());
            }
        }
        if let Some(app_key) = app_key {
            input.extend_from_slice(app_key.as_bytes());
        }
        RoutingKey(xxh3_64_with_seed(&input, salt.0))
    }
}

impl fmt::Display for RoutingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_get_different_keys_for_the_same_anchor() {
        let anchor = Anchor::StablePrefix(42);
        let a = RoutingKey::new(TenantSalt::new(b"", Some("a")), anchor, None);
        let b = RoutingKey::new(TenantSalt::new(b"", Some("b")), anchor, None);
        assert_ne!(a, b);
    }

    #[test]
    fn cohort_ids_are_salted_per_tenant() {
        let (a, b) = (
            TenantSalt::new(b"", Some("a")),
            TenantSalt::new(b"", Some("b")),
        );
        assert_ne!(a.cohort(0x1234_5678), b.cohort(0x1234_5678));
        assert_eq!(a.cohort(0x1234_5678), a.cohort(0x1234_5678));
        assert_ne!(a.cohort(0x1234_5678), a.cohort(0x1234_5679));
        assert_ne!(a.cohort(7), 7, "not the bare code");
    }

    #[test]
    fn app_key_and_anchor_kind_change_the_key() {
        let salt = TenantSalt::default();
        let base = RoutingKey::new(salt, Anchor::Cohort(7), None);
        assert_ne!(
            base,
            RoutingKey::new(salt, Anchor::Cohort(7), Some("rule-1"))
        );
        assert_ne!(base, RoutingKey::new(salt, Anchor::StablePrefix(7), None));
        assert_eq!(base, RoutingKey::new(salt, Anchor::Cohort(7), None));
        assert_eq!(base.to_string().len(), 16);
    }
}
