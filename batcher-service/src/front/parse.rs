//! What the front reads of a request before admitting it (the headers by their configured
//! names, docs/CONTRACT.md): its cohort (the filter's `x-cohort-key`, or the front's own
//! fingerprint of the body, salted as the filter salts, when a client calls the front
//! directly), the replica hint (`x-cohort-shard`, else the cohort's jump hash), the
//! tenant and session that the predictor learns under, the prefetch level, the engine
//! cache salt, and the prompt's prefix blocks (which decide whether joining its cohort's
//! batch pays, [`cohort_batcher_core::batch::PromptShape`]).

use super::Front;
use axum::http::HeaderMap;
use cohort_batcher_core::batch::PromptShape;
use cohort_batcher_core::engines::{cache_salt, FrontApi};
use cohort_fingerprint::knobs::policy::RouteOf;
use cohort_fingerprint::knobs::{Prefetch, RawKnobs};
use cohort_fingerprint::shard::jump_hash;
use serde_json::{Map, Value};
use std::time::Instant;

/// What the front knows about one request after parsing.
pub(super) struct Parsed {
    pub api: FrontApi,
    pub body: Map<String, Value>,
    pub cohort: u64,
    pub hint: usize,
    /// The engine cache salt ([`cache_salt`]).
    pub salt: Option<String>,
    pub tenant_hash: u64,
    pub context: u64,
    pub level: Prefetch,
    pub received: Instant,
    /// Chained hashes of the canonical prompt's blocks; empty when the fingerprint cannot
    /// read the body (then it joins its batch whatever it shares, as the key says).
    pub blocks: Vec<u64>,
    /// Bytes of the canonical prompt.
    pub prompt_bytes: usize,
}

impl Parsed {
    pub fn shape(&self) -> PromptShape<'_> {
        PromptShape {
            blocks: &self.blocks,
            bytes: self.prompt_bytes,
        }
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

pub(super) fn hash(text: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(text.as_bytes())
}

/// The tenant's hash and the context the predictor learns a request's sequence in: its
/// session within its tenant, else the tenant.
pub(super) fn tenant_and_context(tenant: Option<&str>, session: Option<&str>) -> (u64, u64) {
    let tenant_hash = hash(tenant.unwrap_or(""));
    let context = session
        .map(|s| hash(s) ^ tenant_hash.rotate_left(1))
        .unwrap_or(tenant_hash);
    (tenant_hash, context)
}

impl Front {
    pub(super) fn parse(&self, api: FrontApi, headers: &HeaderMap, body: &[u8]) -> Option<Parsed> {
        let map: Map<String, Value> = serde_json::from_slice(body).ok()?;
        let names = &self.headers;
        let tenant = header(headers, &self.tenant_header).map(str::to_owned);
        // Salted as the filter salts (same secret), so a client calling the front directly
        // gets the keys the filter would have given it.
        let salt = cohort_fingerprint::TenantSalt::new(&self.secret, tenant.as_deref());
        let (cohort, blocks, prompt_bytes) =
            match header(headers, &names.key).and_then(|k| u64::from_str_radix(k, 16).ok()) {
                Some(key) => match cohort_fingerprint::api::parse_request(body, Some(api.path())) {
                    Ok(prompt) => (
                        key,
                        cohort_fingerprint::prefix::block_hashes(prompt.bytes(), salt.0),
                        prompt.bytes().len(),
                    ),
                    Err(_) => (key, Vec::new(), 0),
                },
                None => {
                    let request = cohort_fingerprint::Request {
                        path: Some(api.path()),
                        salt,
                        ..cohort_fingerprint::Request::new(body)
                    };
                    let fp = cohort_fingerprint::fingerprint(&request).ok()?;
                    (fp.routing_key.0, fp.prefix_blocks, fp.prompt_bytes)
                }
            };
        let hint = header(headers, &names.shard)
            .and_then(|name| self.engines.position(name))
            .unwrap_or_else(|| jump_hash(cohort, self.engines.len() as u32) as usize);
        let (tenant_hash, context) =
            tenant_and_context(tenant.as_deref(), header(headers, &names.session));
        // The filter wrote the level its policy allowed; a direct caller's is clamped here.
        let route = RouteOf {
            authority: header(headers, "host").unwrap_or(""),
            path: api.path(),
        };
        let level = RawKnobs {
            prefetch: header(headers, &names.prefetch),
            ..RawKnobs::default()
        }
        .parse_within(&self.knob_policy.limits(route, tenant.as_deref()))
        .knobs
        .prefetch;
        let client_salt = map.get("cache_salt").and_then(Value::as_str);
        let salt = cache_salt(&self.secret, tenant.as_deref(), client_salt);
        Some(Parsed {
            api,
            body: map,
            cohort,
            hint,
            salt,
            tenant_hash,
            context,
            level,
            received: Instant::now(),
            blocks,
            prompt_bytes,
        })
    }
}
