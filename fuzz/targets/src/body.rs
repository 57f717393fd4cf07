//! A request body, as the filter and `cohort serve`'s front see it, on every API path and
//! semantic mode (the first byte picks them).
//!
//! Invariants: the core is deterministic; a failure is a known bypass reason; a
//! fingerprint is self-consistent (one block hash per started 256-byte block, the anchor
//! follows the stable context, the routing key is the salted hash of the anchor, the cohort
//! is the sketch's signature, the sketch is quantised); the filter's decision functions
//! agree with the core, and every header the filter would write is visible ASCII; two
//! tenants never share a routing key.

use crate::check::{assert_hex, assert_sketch, assert_visible_ascii, split_first, MODES};
use cohort_filter::config::FilterConfig;
use cohort_filter::decision::{inspect_headers, route_body, HeadersVerdict};
use cohort_fingerprint::error::BYPASS_REASONS;
use cohort_fingerprint::mask::MAX_TOKENS;
use cohort_fingerprint::normalize::is_invisible;
use cohort_fingerprint::prefix::BLOCK_BYTES;
use cohort_fingerprint::sketch::codebook::NO_INTENT;
use cohort_fingerprint::{
    fingerprint, Anchor, Fingerprint, Knobs, Request, RoutingKey, TenantSalt,
};

const PATHS: [Option<&str>; 7] = [
    None,
    Some("/v1/chat/completions"),
    Some("/v1/completions"),
    Some("/v1/responses"),
    Some("/v1/messages"),
    Some("/openai/v1/chat/completions?api-version=2"),
    Some("/v1/embeddings"),
];

/// The fuzz target.
pub fn body(data: &[u8]) {
    let (selector, body) = split_first(data);
    let path = PATHS[selector % PATHS.len()];
    let mode = MODES[selector / PATHS.len() % MODES.len()];
    let tenant = TenantSalt::new(b"", Some("tenant-a"));
    let request = Request {
        path,
        semantic_mode: mode,
        salt: tenant,
        ..Request::new(body)
    };
    let result = fingerprint(&request);
    assert_eq!(result, fingerprint(&request), "the core is deterministic");
    let without_blocks = fingerprint(&Request {
        block_hashes: false,
        ..request
    });
    let expected = result.clone().map(|fp| Fingerprint {
        prefix_blocks: Vec::new(),
        prompt_bytes: 0,
        ..fp
    });
    assert_eq!(
        without_blocks, expected,
        "skipping the block chain changes nothing else"
    );
    match &result {
        Ok(fp) => assert_fingerprint(fp, tenant),
        Err(error) => assert!(
            BYPASS_REASONS.contains(&error.bypass_reason()),
            "unknown bypass reason {}",
            error.bypass_reason()
        ),
    }
    if let Ok(fp) = &result {
        let other = fingerprint(&Request {
            salt: TenantSalt::new(b"", Some("tenant-b")),
            ..request
        })
        .expect("the tenant does not decide whether a body parses");
        assert_ne!(fp.routing_key, other.routing_key, "tenants share a key");
        assert_eq!(
            fp.intent, other.intent,
            "the sketch does not depend on the tenant"
        );
    }
    through_the_filter(body, path, mode, &result);
}

fn assert_fingerprint(fp: &Fingerprint, salt: TenantSalt) {
    assert_eq!(
        fp.prefix_blocks.len(),
        fp.prompt_bytes.div_ceil(BLOCK_BYTES)
    );
    assert_sketch(&fp.intent.sketch);
    let code = fp.intent.cohort(Knobs::default().batch_threshold);
    assert_eq!(
        code == NO_INTENT,
        fp.intent.sketch.0.iter().all(|&v| v == 0)
    );
    assert!(fp.intent.tokens.len() <= MAX_TOKENS);
    let expected_anchor = if fp.has_stable_context {
        Anchor::StablePrefix(fp.stable_prefix)
    } else {
        Anchor::Cohort(code)
    };
    assert_eq!(fp.anchor, expected_anchor);
    assert_eq!(fp.routing_key, RoutingKey::new(salt, fp.anchor, None));
    assert_hex("routing key", &fp.routing_key.to_string(), 16);
    let masked = fp.intent.masked_text();
    assert!(
        !masked
            .chars()
            .any(|c| is_invisible(c) || (c.is_control() && c != '\n')),
        "invisible or control character in masked text {masked:?}"
    );
}

/// The filter's path for the same body: headers, then body, as `http.rs` calls them.
fn through_the_filter(
    body: &[u8],
    core_path: Option<&str>,
    mode: cohort_fingerprint::SemanticMode,
    core: &Result<Fingerprint, cohort_fingerprint::FingerprintError>,
) {
    let config = FilterConfig::default();
    let path = core_path.unwrap_or("/v1/chat/completions");
    // With the same API path the filter must agree with the core exactly; with a query
    // string, a prefix or no path the core may guess the shape differently.
    let same = core_path.is_some_and(|p| PATHS[1..5].contains(&Some(p)));
    let headers: Vec<(String, String)> = [
        (":method", "POST"),
        (":path", path),
        ("content-length", &body.len().to_string()),
        ("x-cohort-semantic-mode", mode.as_str()),
    ]
    .iter()
    .map(|(n, v)| (n.to_string(), v.to_string()))
    .collect();
    let plan = match inspect_headers(&config, &headers, Some("tenant-a")) {
        HeadersVerdict::Buffer(plan) => plan,
        HeadersVerdict::Ignore => {
            assert!(!config.is_api_path(path));
            return;
        }
        HeadersVerdict::Bypass(_) => return,
    };
    assert!(plan.knobs.invalid.is_empty());
    match (route_body(&config, &plan, body), core) {
        (Ok(routing), Ok(fp)) => {
            if same {
                assert_eq!(routing.fingerprint.routing_key, fp.routing_key);
            }
            let names = &config.headers;
            for (name, value) in &routing.headers {
                assert_visible_ascii(name, value);
            }
            let header = |name: &str| {
                routing
                    .headers
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.as_str())
            };
            assert_hex("x-cohort-key", header(&names.key).unwrap(), 16);
            assert_hex("x-cohort-prefix", header(&names.prefix).unwrap(), 16);
            assert_hex("x-cohort-cluster", header(&names.cluster).unwrap(), 8);
            assert_eq!(header(&names.cluster), Some(routing.cluster.as_str()));
            assert_eq!(header(&names.fp).map(str::len), Some(43));
        }
        (Err(reason), Err(error)) if same => assert_eq!(reason, error.bypass_reason()),
        (Err(reason), Ok(_)) if same => {
            panic!("the filter bypassed ({reason}) a body the core fingerprints")
        }
        (Ok(_), Err(error)) if same => panic!("the filter routed a body the core refused: {error}"),
        (Err(reason), _) => assert!(
            BYPASS_REASONS.contains(&reason),
            "unknown bypass reason {reason}"
        ),
        (Ok(_), Err(_)) => {}
    }
}
