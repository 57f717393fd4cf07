//! What the filter does with one request, as pure functions of the configuration, the
//! request headers and the body. No proxy-wasm calls here: `http.rs` is the thin glue that
//! feeds these functions and applies their verdicts, and this module is tested natively.
//!
//! 1. [`spoofed_headers`]: on every request, the `x-cohort-*` headers only the filter may
//!    write (and the tenant header, unless trusted) are removed if a client sent them.
//! 2. [`inspect_headers`]: an LLM API request (POST to an API path) within the guards gets
//!    a [`RequestPlan`] and its body is buffered; anything else continues untouched or is
//!    bypassed with a reason.
//! 3. [`route_body`]: at the end of the body, the fingerprint becomes routing headers, or
//!    the request is bypassed with the core's reason.

use crate::breaker;
use crate::config::FilterConfig;
use crate::rollout::{self, BUCKETS, REQUEST_ID};
use cohort_fingerprint::knobs::policy::RouteOf;
use cohort_fingerprint::knobs::{ParsedKnobs, RawKnobs};
use cohort_fingerprint::learned::{self, LearnedCohorts, Placement};
use cohort_fingerprint::{
    fingerprint_with, Anchor, Fingerprint, IntentSketch, Request, SemanticMode, TenantSalt,
    SKETCH_VERSION,
};

/// Why a request passed through untouched (the `x-cohort-bypass` value).
pub type BypassReason = &'static str;

/// Reasons the filter adds to the core's (`cohort_fingerprint::error::BYPASS_REASONS`).
pub mod reason {
    pub const HEADERS_TOO_LARGE: &str = "headers_too_large";
    pub const BODY_TOO_LARGE: &str = "body_too_large";
    pub const CONTENT_ENCODED: &str = "content_encoded";
    pub const NO_BODY: &str = "no_body";
    pub const INVALID_CONFIG: &str = "invalid_config";
    pub const INTERNAL: &str = "internal_error";
    /// Not in the rollout's sampled share (left exactly as it came).
    pub const HOLDOUT: &str = "holdout";
    /// On a route Cohort is not enabled for (left exactly as it came).
    pub const ROUTE_DISABLED: &str = "route_disabled";
    /// The breaker is open (or half-open and this request is not a probe).
    pub const BREAKER_OPEN: &str = "breaker_open";
}

/// Every bypass reason, for counters defined up front.
pub fn all_bypass_reasons() -> Vec<BypassReason> {
    let mut reasons = vec![
        reason::HEADERS_TOO_LARGE,
        reason::CONTENT_ENCODED,
        reason::NO_BODY,
        reason::INVALID_CONFIG,
        reason::INTERNAL,
        reason::HOLDOUT,
        reason::ROUTE_DISABLED,
        reason::BREAKER_OPEN,
    ];
    for core in cohort_fingerprint::error::BYPASS_REASONS {
        if !reasons.contains(core) {
            reasons.push(core);
        }
    }
    reasons
}

/// Names of reserved headers present in `headers` (to remove before anything else).
pub fn spoofed_headers<'c>(config: &'c FilterConfig, headers: &[(String, String)]) -> Vec<&'c str> {
    let mut reserved: Vec<&str> = config.headers.reserved().to_vec();
    if !config.trust_tenant_header {
        reserved.push(&config.tenant_header);
    }
    reserved
        .into_iter()
        .filter(|name| headers.iter().any(|(n, _)| n == name))
        .collect()
}

/// What to remember between the headers and the end of the body.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestPlan {
    pub path: String,
    /// `:authority`: with the path, the route the knob policy matched.
    pub authority: String,
    pub knobs: ParsedKnobs,
    pub original_query: Option<String>,
    pub app_routing_key: Option<String>,
    pub tenant: Option<String>,
    pub session: Option<String>,
    /// Envoy's `x-request-id` (the batcher's audit key).
    pub request_id: Option<String>,
}

/// The verdict on request headers.
#[derive(Debug, Clone, PartialEq)]
pub enum HeadersVerdict {
    /// Not an LLM API request: continue untouched.
    Ignore,
    /// An LLM API request passed through untouched, for this reason.
    Bypass(BypassReason),
    /// Buffer the body, then call [`route_body`].
    Buffer(Box<RequestPlan>),
}

/// Request headers as text. Envoy hands header values over as bytes and a client may send
/// any byte above 0x7F in one; a value that is not UTF-8 is read lossily (each invalid
/// sequence becomes U+FFFD), so a knob sent that way is malformed (default, counted) and
/// nothing panics. Names are always ASCII tokens (Envoy's codecs reject anything else).
/// A UTF-8 value keeps its buffer (no copy).
pub fn headers_as_text<V: Into<Vec<u8>>>(headers: Vec<(String, V)>) -> Vec<(String, String)> {
    headers
        .into_iter()
        .map(|(name, value)| {
            let text = String::from_utf8(value.into())
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
            (name, text)
        })
        .collect()
}

fn first<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// True for a POST to one of the configured API paths (the requests the filter handles).
pub fn is_api_request(config: &FilterConfig, headers: &[(String, String)]) -> bool {
    first(headers, ":method") == Some("POST")
        && config.is_api_path(first(headers, ":path").unwrap_or(""))
}

/// Decides from the request headers. `peer_principal` is the mTLS identity of the
/// downstream (the tenant when the tenant header is not trusted).
pub fn inspect_headers(
    config: &FilterConfig,
    headers: &[(String, String)],
    peer_principal: Option<&str>,
) -> HeadersVerdict {
    if !is_api_request(config, headers) {
        return HeadersVerdict::Ignore;
    }
    let path = first(headers, ":path").unwrap_or("");
    let header_bytes: usize = headers.iter().map(|(n, v)| n.len() + v.len()).sum();
    if header_bytes > config.header_limit_bytes {
        return HeadersVerdict::Bypass(reason::HEADERS_TOO_LARGE);
    }
    if let Some(length) = first(headers, "content-length") {
        match length.trim().parse::<u64>() {
            Ok(0) => return HeadersVerdict::Bypass(reason::NO_BODY),
            Ok(n) if n > config.body_limit_bytes as u64 => {
                return HeadersVerdict::Bypass(reason::BODY_TOO_LARGE)
            }
            _ => {}
        }
    }
    if let Some(encoding) = first(headers, "content-encoding") {
        if !encoding.trim().eq_ignore_ascii_case("identity") {
            return HeadersVerdict::Bypass(reason::CONTENT_ENCODED);
        }
    }
    let names = &config.headers;
    let tenant = if config.trust_tenant_header {
        first(headers, &config.tenant_header)
    } else {
        peer_principal.filter(|p| !p.is_empty())
    };
    let authority = first(headers, ":authority").unwrap_or("");
    let route = RouteOf { authority, path };
    let knobs = RawKnobs {
        prefetch: first(headers, &names.prefetch),
        batch_threshold: first(headers, &names.batch_threshold),
        cache_ttl: first(headers, &names.cache_ttl),
        semantic_mode: first(headers, &names.semantic_mode),
    }
    .parse_within(&config.knobs.limits(route, tenant));
    HeadersVerdict::Buffer(Box::new(RequestPlan {
        path: path.to_owned(),
        authority: authority.to_owned(),
        knobs,
        original_query: first(headers, &names.original_query).map(str::to_owned),
        app_routing_key: first(headers, &names.routing_key).map(str::to_owned),
        tenant: tenant.map(str::to_owned),
        session: first(headers, &names.session).map(str::to_owned),
        request_id: first(headers, REQUEST_ID).map(str::to_owned),
    }))
}

/// What the rollout and the breaker say about a request Cohort would act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Cohort acts on it.
    Treat,
    /// Forwarded exactly as it came, nothing written upstream: the hold-out, or a route
    /// Cohort is not enabled on. The reason shows in the response header and counters.
    Untouched(BypassReason),
    /// Passed through with the bypass header, like any other bypass (the breaker).
    Bypass(BypassReason),
}

/// Decides, for an LLM API request with its `plan`, whether Cohort acts on it: the route
/// (`route_name`, Envoy's `xds.route_name`), the rollout's sampled share (by the stable
/// bucket of the user key, salted per tenant), then the breaker's state.
pub fn admit(
    config: &FilterConfig,
    plan: &RequestPlan,
    headers: &[(String, String)],
    route_name: Option<&str>,
    breaker: breaker::State,
) -> Admission {
    let rollout = &config.rollout;
    if rollout.filters_routes() && !rollout.route_enabled(route_name) {
        return Admission::Untouched(reason::ROUTE_DISABLED);
    }
    let treated = rollout.treated_buckets();
    let bucket = if treated < BUCKETS || breaker == breaker::State::HalfOpen {
        request_bucket(config, plan, headers)
    } else {
        None
    };
    if treated < BUCKETS && bucket.is_none_or(|b| b >= treated) {
        return Admission::Untouched(reason::HOLDOUT);
    }
    match breaker {
        breaker::State::Closed => Admission::Treat,
        breaker::State::Open => Admission::Bypass(reason::BREAKER_OPEN),
        breaker::State::HalfOpen => {
            // Probes: the first `probe_share` of the treated buckets, so the same users
            // probe for the whole half-open period.
            let probes = rollout::share_buckets(rollout.share * config.breaker.probe_share);
            if bucket.is_some_and(|b| b < probes) {
                Admission::Treat
            } else {
                Admission::Bypass(reason::BREAKER_OPEN)
            }
        }
    }
}

/// The rollout bucket of a request: of its user (the key header), else of its request id.
fn request_bucket(
    config: &FilterConfig,
    plan: &RequestPlan,
    headers: &[(String, String)],
) -> Option<u32> {
    let salt = TenantSalt::new(config.salt_secret.as_bytes(), plan.tenant.as_deref());
    rollout::request_bucket(
        salt,
        first(headers, config.rollout_key_header()),
        first(headers, REQUEST_ID),
    )
}

/// The unit a request's response is counted in (`crate::response_series`): its user's
/// rollout bucket modulo the units, while a hold-out exists (share below 1); `None`
/// otherwise, or for a request with neither a user key nor a request id.
pub fn stats_unit(
    config: &FilterConfig,
    plan: &RequestPlan,
    headers: &[(String, String)],
) -> Option<u8> {
    if config.rollout.treated_buckets() >= BUCKETS {
        return None;
    }
    request_bucket(config, plan, headers).map(rollout::unit_of_bucket)
}

/// Headers to write for a fingerprinted request, and the fingerprint itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    pub headers: Vec<(String, String)>,
    pub cluster: String,
    pub fingerprint: Fingerprint,
    /// Where learned cohorts placed the request (`learned_cohorts` configured, and the
    /// request had intent words).
    pub learned: Option<Placement>,
}

/// Where the learned cohorts' table lives ([`cohort_fingerprint::learned`]): Envoy's shared
/// data in the filter, memory in tests.
pub trait LearnedTable {
    /// Runs `place` on the current table and keeps the table it leaves when the placement
    /// says it changed. The placement, or None when the table could not be read; its
    /// `changed` is false when the change could not be kept (the request still takes the
    /// code it was placed with).
    fn update(
        &mut self,
        place: &mut dyn FnMut(&mut LearnedCohorts) -> Option<Placement>,
    ) -> Option<Placement>;
}

impl LearnedTable for LearnedCohorts {
    fn update(
        &mut self,
        place: &mut dyn FnMut(&mut LearnedCohorts) -> Option<Placement>,
    ) -> Option<Placement> {
        place(self)
    }
}

/// Fingerprints the whole body and derives the routing headers (learned cohorts, if
/// configured, from a table of this request alone).
pub fn route_body(
    config: &FilterConfig,
    plan: &RequestPlan,
    body: &[u8],
) -> Result<Routing, BypassReason> {
    route_body_with(
        config,
        plan,
        body,
        IntentSketch::of_text,
        &mut LearnedCohorts::default(),
    )
}

/// [`route_body`] with the intent step supplied by the caller (see
/// [`cohort_fingerprint::fingerprint_with`]): the filter times it; and with the table of
/// learned cohorts the filter keeps (used only when `learned_cohorts` is configured).
pub fn route_body_with(
    config: &FilterConfig,
    plan: &RequestPlan,
    body: &[u8],
    intent_sketch: impl FnOnce(&str, SemanticMode) -> IntentSketch,
    learned_table: &mut dyn LearnedTable,
) -> Result<Routing, BypassReason> {
    let salt = TenantSalt::new(config.salt_secret.as_bytes(), plan.tenant.as_deref());
    let threshold = plan.knobs.knobs.batch_threshold;
    let request = Request {
        body,
        path: Some(&plan.path),
        original_query: plan.original_query.as_deref(),
        app_routing_key: plan.app_routing_key.as_deref(),
        salt,
        semantic_mode: plan.knobs.knobs.semantic_mode,
        max_body_bytes: config.body_limit_bytes,
        // The block chain only travels to a batcher (shard choice, Observe, Assign); with
        // none configured, the conversation is neither written out nor hashed.
        block_hashes: !config.batcher_clusters.is_empty(),
        batch_threshold: threshold,
    };
    let mut fp = fingerprint_with(&request, intent_sketch).map_err(|e| e.bypass_reason())?;
    // Only bare prompts: a system prompt or tools anchor the key, and such requests would
    // take room in the table for an id nothing routes on.
    let learned = config
        .learned_cohorts
        .filter(|_| !fp.has_stable_context)
        .and_then(|learned| {
            let scope = learned::scope(salt, &fp.intent, threshold);
            // A bare prompt is anchored on its codebook code: a new leader's code, already
            // computed.
            let own_code = match fp.anchor {
                Anchor::Cohort(code) => code,
                Anchor::StablePrefix(_) => fp.intent.cohort(threshold),
            };
            learned_table.update(&mut |table| {
                table.place(
                    scope,
                    &fp.intent.sketch,
                    threshold,
                    learned.capacity(),
                    || own_code,
                )
            })
        });
    if let Some(placed) = learned {
        fp.regroup(placed.code, salt, plan.app_routing_key.as_deref());
    }
    let names = &config.headers;
    let cluster = format!("{:08x}", fp.cohort);
    Ok(Routing {
        headers: vec![
            (names.key.clone(), fp.routing_key.to_string()),
            (names.prefix.clone(), format!("{:016x}", fp.stable_prefix)),
            (names.fp.clone(), fp.intent.sketch.to_base64url()),
            (names.fp_version.clone(), SKETCH_VERSION.to_string()),
            (names.cluster.clone(), cluster.clone()),
        ],
        cluster,
        fingerprint: fp,
        learned,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut all = vec![
            (":method".to_owned(), "POST".to_owned()),
            (":path".to_owned(), "/v1/chat/completions".to_owned()),
        ];
        all.extend(pairs.iter().map(|(n, v)| (n.to_string(), v.to_string())));
        all
    }

    fn plan(verdict: HeadersVerdict) -> RequestPlan {
        match verdict {
            HeadersVerdict::Buffer(plan) => *plan,
            other => panic!("expected Buffer, got {other:?}"),
        }
    }

    #[test]
    fn only_posts_to_api_paths_are_buffered() {
        let config = FilterConfig::default();
        let mut get = headers(&[]);
        get[0].1 = "GET".into();
        assert_eq!(inspect_headers(&config, &get, None), HeadersVerdict::Ignore);
        let mut models = headers(&[]);
        models[1].1 = "/v1/models".into();
        assert_eq!(
            inspect_headers(&config, &models, None),
            HeadersVerdict::Ignore
        );
        assert!(matches!(
            inspect_headers(&config, &headers(&[]), None),
            HeadersVerdict::Buffer(_)
        ));
    }

    #[test]
    fn guards_bypass_with_reasons() {
        let config = FilterConfig::default();
        let big = "x".repeat(9000);
        let cases = [
            (vec![("x-big", big.as_str())], reason::HEADERS_TOO_LARGE),
            (vec![("content-length", "2000000")], reason::BODY_TOO_LARGE),
            (vec![("content-length", "0")], reason::NO_BODY),
            (vec![("content-encoding", "gzip")], reason::CONTENT_ENCODED),
        ];
        for (extra, expected) in cases {
            assert_eq!(
                inspect_headers(&config, &headers(&extra), None),
                HeadersVerdict::Bypass(expected)
            );
        }
    }

    #[test]
    fn knobs_and_context_headers_are_read() {
        let config = FilterConfig::default();
        let plan = plan(inspect_headers(
            &config,
            &headers(&[
                ("x-cohort-semantic-mode", "topic"),
                ("x-cohort-batch-threshold", "NaN"),
                ("x-original-query", "cancel my order"),
                ("x-cohort-routing-key", "rule-7"),
                ("x-cohort-session", "s1"),
            ]),
            None,
        ));
        assert_eq!(plan.knobs.knobs.semantic_mode.as_str(), "topic");
        assert_eq!(plan.knobs.invalid.len(), 1);
        assert_eq!(plan.original_query.as_deref(), Some("cancel my order"));
        assert_eq!(plan.app_routing_key.as_deref(), Some("rule-7"));
        assert_eq!(plan.session.as_deref(), Some("s1"));
    }

    #[test]
    fn tenant_comes_from_the_mesh_unless_the_header_is_trusted() {
        let spoofing = headers(&[("x-cohort-tenant", "victim")]);
        let untrusted = FilterConfig::default();
        assert_eq!(
            plan(inspect_headers(&untrusted, &spoofing, Some("spiffe://a")))
                .tenant
                .as_deref(),
            Some("spiffe://a")
        );
        assert_eq!(spoofed_headers(&untrusted, &spoofing), ["x-cohort-tenant"]);
        let trusted = FilterConfig {
            trust_tenant_header: true,
            ..FilterConfig::default()
        };
        assert_eq!(
            plan(inspect_headers(&trusted, &spoofing, None))
                .tenant
                .as_deref(),
            Some("victim")
        );
        assert!(spoofed_headers(&trusted, &spoofing).is_empty());
    }

    #[test]
    fn reserved_headers_are_reported_for_removal() {
        let config = FilterConfig::default();
        let sent = headers(&[
            ("x-cohort-key", "ffff"),
            ("x-cohort-shard", "3"),
            ("x-other", "1"),
        ]);
        assert_eq!(
            spoofed_headers(&config, &sent),
            ["x-cohort-key", "x-cohort-shard"]
        );
    }

    #[test]
    fn a_body_becomes_routing_headers_or_a_reason() {
        let config = FilterConfig::default();
        let plan = plan(inspect_headers(&config, &headers(&[]), None));
        let body = br#"{"model":"m","messages":[{"role":"user","content":"refund order 12"}]}"#;
        let routing = route_body(&config, &plan, body).unwrap();
        let names: Vec<&str> = routing.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "x-cohort-key",
                "x-cohort-prefix",
                "x-cohort-fp",
                "x-cohort-fp-version",
                "x-cohort-cluster"
            ]
        );
        assert_eq!(routing.headers[0].1.len(), 16);
        assert_eq!(routing.headers[2].1.len(), 43);
        assert_eq!(routing.headers[3].1, "2");
        assert_eq!(route_body(&config, &plan, b"{oops"), Err("invalid_json"));
    }

    #[test]
    fn the_block_chain_is_computed_only_for_a_batcher() {
        let body = br#"{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"refund order 12"}]}"#;
        let alone = FilterConfig::default();
        let plan = plan(inspect_headers(&alone, &headers(&[]), None));
        let without = route_body(&alone, &plan, body).unwrap();
        assert!(without.fingerprint.prefix_blocks.is_empty());
        let with_batcher = FilterConfig {
            batcher_clusters: vec!["cohort-batcher".into()],
            ..FilterConfig::default()
        };
        let with = route_body(&with_batcher, &plan, body).unwrap();
        assert!(!with.fingerprint.prefix_blocks.is_empty());
        assert!(with.fingerprint.prompt_bytes > 0);
        // The routing headers do not depend on it.
        assert_eq!(with.headers, without.headers);
    }

    #[test]
    fn a_knob_that_is_not_utf8_is_malformed_not_a_panic() {
        let config = FilterConfig::default();
        let mut raw: Vec<(String, Vec<u8>)> = headers(&[])
            .into_iter()
            .map(|(n, v)| (n, v.into_bytes()))
            .collect();
        raw.push(("x-cohort-semantic-mode".into(), vec![0xFF, 0xFE, b'x']));
        raw.push(("x-cohort-prefetch".into(), b"high".to_vec()));
        let text = headers_as_text(raw);
        assert_eq!(text[2].1, "\u{FFFD}\u{FFFD}x");
        let plan = plan(inspect_headers(&config, &text, None));
        assert_eq!(plan.knobs.invalid.len(), 1);
        assert_eq!(plan.knobs.invalid[0].knob.as_str(), "semantic_mode");
        assert_eq!(plan.knobs.knobs.prefetch.as_str(), "high");
    }

    #[test]
    fn the_rollout_holds_out_users_and_the_breaker_bypasses_or_probes() {
        use crate::breaker::State;
        let config = FilterConfig::parse(
            br#"{"rollout":{"share":0.25,"key_header":"x-user-id"},"breaker":{"probe_share":0.5}}"#,
        )
        .unwrap();
        let verdicts = |state: State| {
            let mut counts = std::collections::BTreeMap::new();
            for i in 0..4_000 {
                let user = format!("user-{i}");
                let sent = headers(&[
                    ("x-user-id", user.as_str()),
                    ("x-request-id", "same-for-all"),
                ]);
                let plan = plan(inspect_headers(&config, &sent, None));
                let verdict = admit(&config, &plan, &sent, None, state);
                // The same user always gets the same verdict.
                assert_eq!(verdict, admit(&config, &plan, &sent, None, state));
                *counts.entry(format!("{verdict:?}")).or_insert(0) += 1;
            }
            counts
        };
        let closed = verdicts(State::Closed);
        let treated = closed["Treat"];
        assert!((900..=1_100).contains(&treated), "{closed:?}");
        assert_eq!(closed[r#"Untouched("holdout")"#], 4_000 - treated);
        let open = verdicts(State::Open);
        assert_eq!(open[r#"Bypass("breaker_open")"#], treated, "{open:?}");
        let half = verdicts(State::HalfOpen);
        let probes = half["Treat"];
        assert!((400..=600).contains(&probes), "{half:?}");
        assert_eq!(half[r#"Bypass("breaker_open")"#], treated - probes);
        assert_eq!(half[r#"Untouched("holdout")"#], 4_000 - treated);
        // Without the key header the request id is the key; with neither, held out.
        let by_id = headers(&[("x-request-id", "r-1")]);
        let p = plan(inspect_headers(&config, &by_id, None));
        let salt = TenantSalt::new(b"", None);
        let expected = if rollout::bucket(salt, "r-1") < 2_500 {
            Admission::Treat
        } else {
            Admission::Untouched(reason::HOLDOUT)
        };
        assert_eq!(admit(&config, &p, &by_id, None, State::Closed), expected);
        let keyless = headers(&[]);
        let p = plan(inspect_headers(&config, &keyless, None));
        assert_eq!(
            admit(&config, &p, &keyless, None, State::Closed),
            Admission::Untouched(reason::HOLDOUT)
        );
        // Everyone is treated at share 1, key or not.
        let all = FilterConfig::default();
        assert_eq!(
            admit(&all, &p, &keyless, None, State::Closed),
            Admission::Treat
        );
    }

    #[test]
    fn users_fall_into_units_in_both_groups_while_a_holdout_exists() {
        let config =
            FilterConfig::parse(br#"{"rollout":{"share":0.5,"key_header":"x-user-id"}}"#).unwrap();
        let mut per_unit = [[0u32; 2]; rollout::UNITS as usize];
        for i in 0..4_000 {
            let user = format!("user-{i}");
            let sent = headers(&[("x-user-id", user.as_str())]);
            let plan = plan(inspect_headers(&config, &sent, None));
            let unit = stats_unit(&config, &plan, &sent).expect("a user has a unit");
            // A user keeps its unit.
            assert_eq!(stats_unit(&config, &plan, &sent), Some(unit));
            let closed = crate::breaker::State::Closed;
            let treated = admit(&config, &plan, &sent, None, closed) == Admission::Treat;
            per_unit[usize::from(unit)][usize::from(treated)] += 1;
        }
        // Every unit holds about an eighth of each group (250 of 2,000).
        for [held, treated] in per_unit {
            assert!((170..=330).contains(&held), "{per_unit:?}");
            assert!((170..=330).contains(&treated), "{per_unit:?}");
        }
        // No hold-out (share 1), or no key at all: no unit.
        let all = FilterConfig::default();
        let sent = headers(&[("x-user-id", "u1"), ("x-request-id", "r1")]);
        let p = plan(inspect_headers(&all, &sent, None));
        assert_eq!(stats_unit(&all, &p, &sent), None);
        let keyless = headers(&[]);
        let p = plan(inspect_headers(&config, &keyless, None));
        assert_eq!(stats_unit(&config, &p, &keyless), None);
    }

    #[test]
    fn routes_can_be_turned_off() {
        let config = FilterConfig::parse(br#"{"rollout":{"disabled_routes":["legacy"]}}"#).unwrap();
        let sent = headers(&[]);
        let p = plan(inspect_headers(&config, &sent, None));
        let state = crate::breaker::State::Closed;
        assert_eq!(
            admit(&config, &p, &sent, Some("legacy"), state),
            Admission::Untouched(reason::ROUTE_DISABLED)
        );
        assert_eq!(
            admit(&config, &p, &sent, Some("chat"), state),
            Admission::Treat
        );
    }

    #[test]
    fn tenants_get_different_keys() {
        let config = FilterConfig::default();
        let body = br#"{"model":"m","messages":[{"role":"user","content":"refund order 12"}]}"#;
        let key = |tenant: Option<&str>| {
            let plan = plan(inspect_headers(&config, &headers(&[]), tenant));
            route_body(&config, &plan, body).unwrap().headers[0]
                .1
                .clone()
        };
        assert_ne!(key(Some("spiffe://a")), key(Some("spiffe://b")));
    }

    #[test]
    fn tenants_get_different_cohort_ids_for_the_same_prompt() {
        let config = FilterConfig::default();
        let body = br#"{"model":"m","messages":[{"role":"user","content":"refund order 12"}]}"#;
        let routing = |tenant: Option<&str>| {
            let plan = plan(inspect_headers(&config, &headers(&[]), tenant));
            route_body(&config, &plan, body).unwrap()
        };
        let (a, b) = (routing(Some("spiffe://a")), routing(Some("spiffe://b")));
        assert_eq!(a.fingerprint.intent, b.fingerprint.intent, "same sketch");
        assert_ne!(a.cluster, b.cluster);
        assert_eq!(routing(Some("spiffe://a")).cluster, a.cluster);
    }

    #[test]
    fn learned_cohorts_key_paraphrases_alike_where_the_codebook_splits_them() {
        // Cosines measured with `cohort fingerprint`: 0.68 and 0.83 to the first, in three
        // different codebook cells at the default threshold.
        let texts = [
            "where is my new card",
            "my card has not arrived yet",
            "when will my card get here",
        ];
        let body = |text: &str, system: Option<&str>| {
            let mut messages = vec![];
            if let Some(system) = system {
                messages.push(serde_json::json!({"role": "system", "content": system}));
            }
            messages.push(serde_json::json!({"role": "user", "content": text}));
            serde_json::to_vec(&serde_json::json!({"model": "m", "messages": messages})).unwrap()
        };
        let route = |config: &FilterConfig, table: &mut LearnedCohorts, text: &str, system| {
            let plan = plan(inspect_headers(config, &headers(&[]), None));
            route_body_with(
                config,
                &plan,
                &body(text, system),
                IntentSketch::of_text,
                table,
            )
            .unwrap()
        };
        let codebook = FilterConfig::default();
        let learned = FilterConfig {
            learned_cohorts: Some(Default::default()),
            ..FilterConfig::default()
        };
        let mut table = LearnedCohorts::default();
        let by_codebook: Vec<Routing> = texts
            .iter()
            .map(|t| route(&codebook, &mut table, t, None))
            .collect();
        assert!(table.is_empty(), "the table is used only when configured");
        assert!(by_codebook.iter().all(|r| r.learned.is_none()));
        assert_ne!(by_codebook[0].headers[0], by_codebook[1].headers[0]);
        assert_ne!(by_codebook[0].headers[0], by_codebook[2].headers[0]);

        let by_learned: Vec<Routing> = texts
            .iter()
            .map(|t| route(&learned, &mut table, t, None))
            .collect();
        assert!(by_learned[0].learned.unwrap().started);
        for r in &by_learned[1..] {
            assert!(!r.learned.unwrap().started);
            assert_eq!(r.headers[0], by_learned[0].headers[0], "one routing key");
            assert_eq!(r.cluster, by_learned[0].cluster, "one cohort id");
        }
        // The leader's code is its first member's codebook code: same key as without.
        assert_eq!(by_learned[0].headers, by_codebook[0].headers);
        // Another intent starts a cohort of its own.
        let other = route(
            &learned,
            &mut table,
            "translate this sentence into french",
            None,
        );
        assert!(other.learned.unwrap().started);
        assert_ne!(other.headers[0], by_learned[0].headers[0]);
        // A request with a system prompt is keyed by it and left out of the table.
        let system = Some("You are the bank's support assistant.");
        let before = table.clone();
        let anchored = route(&learned, &mut table, texts[1], system);
        let plain = route(&codebook, &mut LearnedCohorts::default(), texts[1], system);
        assert_eq!(anchored.headers, plain.headers);
        assert!(anchored.learned.is_none());
        assert_eq!(table, before);
    }
}
