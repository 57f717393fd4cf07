//! Staged rollout: which requests Cohort acts on, and which it leaves alone as the
//! hold-out (the control group the [`crate::breaker`] compares against).
//!
//! An SRE turns a traffic layer on for a share of users first. The share is sampled per
//! *user*, not per request, so one user's requests are all treated or all held out (a
//! conversation does not flip between routings): the bucket is a hash of the configured
//! key header (a user or session id), seeded by the tenant salt, so one tenant's ids fall
//! into buckets unrelated to another's. A request without that header falls back to its
//! `x-request-id` (sampled per request; Envoy gives every request one), and one with
//! neither is held out while the share is below 1.
//!
//! A held-out request is forwarded exactly as it arrived: no `x-cohort-*` header is
//! written upstream (the control group must look like traffic without Cohort). Its reason
//! (`holdout`) shows in the response's `x-cohort` header and in the bypass counters.
//!
//! Routes: `enabled_routes` (empty: all) and `disabled_routes` name Envoy routes
//! (`xds.route_name`), so a listener can carry Cohort on some routes only; a request on a
//! route that is not enabled passes untouched as `route_disabled`.
//!
//! ```json
//! "rollout": {"share": 0.05, "key_header": "x-user-id",
//!             "enabled_routes": [], "disabled_routes": ["legacy-chat"]}
//! ```

use cohort_fingerprint::TenantSalt;
use serde::Deserialize;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Buckets a key hashes into; a share is a number of them.
pub const BUCKETS: u32 = 10_000;

/// The header a request falls back to when it has no key header.
pub const REQUEST_ID: &str = "x-request-id";

/// Separates rollout buckets from the other hashes seeded by the same tenant salt.
const ROLLOUT_DOMAIN: u64 = 0x726f_6c6c_6f75_7421;

/// The `rollout` section of the plugin configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Rollout {
    /// Share of users Cohort acts on, 0 to 1 (1: everyone, no hold-out).
    pub share: f64,
    /// Header whose value identifies the user (or session) a request is sampled by;
    /// unset: the session header (`headers.session`, `x-cohort-session` by default).
    pub key_header: Option<String>,
    /// Envoy route names Cohort acts on; empty: every route.
    pub enabled_routes: Vec<String>,
    /// Envoy route names Cohort never acts on (wins over `enabled_routes`).
    pub disabled_routes: Vec<String>,
}

impl Default for Rollout {
    fn default() -> Self {
        Rollout {
            share: 1.0,
            key_header: None,
            enabled_routes: Vec::new(),
            disabled_routes: Vec::new(),
        }
    }
}

impl Rollout {
    /// Whether the configuration names routes at all (so the route name is worth asking).
    pub fn filters_routes(&self) -> bool {
        !self.enabled_routes.is_empty() || !self.disabled_routes.is_empty()
    }

    /// Whether Cohort acts on requests of route `name` (`None`: the host did not say).
    pub fn route_enabled(&self, name: Option<&str>) -> bool {
        let name = name.unwrap_or("");
        if self.disabled_routes.iter().any(|r| r == name) {
            return false;
        }
        self.enabled_routes.is_empty() || self.enabled_routes.iter().any(|r| r == name)
    }

    /// How many of the [`BUCKETS`] are treated.
    pub fn treated_buckets(&self) -> u32 {
        share_buckets(self.share)
    }
}

/// Users are split into this many units for the response stats (`crate::response_series`):
/// each unit is a fixed eighth of the users, in the treated group and in the hold-out alike.
pub const UNITS: u32 = 8;

/// The unit of a rollout bucket.
pub fn unit_of_bucket(bucket: u32) -> u8 {
    (bucket % UNITS) as u8
}

/// `share` (clamped to 0..=1) as a number of buckets.
pub fn share_buckets(share: f64) -> u32 {
    if share.is_nan() {
        return 0;
    }
    (share.clamp(0.0, 1.0) * f64::from(BUCKETS)).round() as u32
}

/// The bucket (0..[`BUCKETS`]) of a sampling key under a tenant's salt.
pub fn bucket(salt: TenantSalt, key: &str) -> u32 {
    (xxh3_64_with_seed(key.as_bytes(), salt.0 ^ ROLLOUT_DOMAIN) % u64::from(BUCKETS)) as u32
}

/// Where a request falls: its bucket, or `None` when it has no sampling key at all.
pub fn request_bucket(
    salt: TenantSalt,
    key: Option<&str>,
    request_id: Option<&str>,
) -> Option<u32> {
    key.filter(|k| !k.is_empty())
        .or(request_id.filter(|k| !k.is_empty()))
        .map(|k| bucket(salt, k))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_of_users_is_treated_and_each_user_stays_in_its_group() {
        let salt = TenantSalt::new(b"secret", Some("tenant-a"));
        let treated = share_buckets(0.05);
        assert_eq!(treated, 500);
        let in_group = |user: &str| bucket(salt, user) < treated;
        let n = (0..20_000)
            .filter(|i| in_group(&format!("user-{i}")))
            .count();
        // 5% of 20,000 is 1,000; a fair hash stays well within 1%.
        assert!((800..=1_200).contains(&n), "{n} of 20,000 treated");
        for i in 0..100 {
            let user = format!("user-{i}");
            assert_eq!(in_group(&user), in_group(&user));
        }
    }

    #[test]
    fn tenants_bucket_the_same_user_id_independently() {
        let a = TenantSalt::new(b"secret", Some("tenant-a"));
        let b = TenantSalt::new(b"secret", Some("tenant-b"));
        let differ = (0..1_000)
            .filter(|i| {
                let user = format!("user-{i}");
                bucket(a, &user) != bucket(b, &user)
            })
            .count();
        assert!(differ > 990, "{differ}");
    }

    #[test]
    fn the_request_id_is_the_fallback_key() {
        let salt = TenantSalt::default();
        assert_eq!(
            request_bucket(salt, None, Some("rid-1")),
            Some(bucket(salt, "rid-1"))
        );
        assert_eq!(
            request_bucket(salt, Some("u1"), Some("rid-1")),
            Some(bucket(salt, "u1"))
        );
        assert_eq!(
            request_bucket(salt, Some(""), Some("rid-1")),
            Some(bucket(salt, "rid-1"))
        );
        assert_eq!(request_bucket(salt, None, None), None);
    }

    #[test]
    fn shares_clamp_to_whole_buckets() {
        assert_eq!(share_buckets(1.0), BUCKETS);
        assert_eq!(share_buckets(2.0), BUCKETS);
        assert_eq!(share_buckets(0.0), 0);
        assert_eq!(share_buckets(-1.0), 0);
        assert_eq!(share_buckets(f64::NAN), 0);
        assert_eq!(share_buckets(0.00005), 1);
    }

    #[test]
    fn buckets_fall_into_units() {
        assert_eq!(unit_of_bucket(9_999), 7);
        assert_eq!(unit_of_bucket(8), 0);
        assert!((0..BUCKETS).all(|b| u32::from(unit_of_bucket(b)) < UNITS));
    }

    #[test]
    fn routes_enable_and_disable() {
        let all = Rollout::default();
        assert!(!all.filters_routes());
        assert!(all.route_enabled(Some("anything")) && all.route_enabled(None));
        let some = Rollout {
            enabled_routes: vec!["chat".into(), "legacy".into()],
            disabled_routes: vec!["legacy".into()],
            ..Rollout::default()
        };
        assert!(some.filters_routes());
        assert!(some.route_enabled(Some("chat")));
        assert!(!some.route_enabled(Some("legacy")), "disabled wins");
        assert!(!some.route_enabled(Some("other")));
        assert!(!some.route_enabled(None));
    }
}
