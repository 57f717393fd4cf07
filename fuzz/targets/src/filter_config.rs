//! The filter's plugin configuration (the JSON in Envoy's `configuration` or Istio's
//! `pluginConfig`), then one request routed under an accepted configuration.
//!
//! Invariants: parsing is deterministic; a refusal says why; an accepted configuration is
//! within its documented ranges, its header names are lowercase tokens and distinct, a
//! batching mode has a batcher, and every configured API path matches requests to itself
//! (with a query string or under a prefix) — a path that can never match is refused, not
//! silently ignored; the headers written under it are visible ASCII.

use crate::check::assert_visible_ascii;
use cohort_filter::config::{FilterConfig, Mode};
use cohort_filter::decision::{inspect_headers, route_body, spoofed_headers, HeadersVerdict};

const BODY: &[u8] = br#"{"model":"m","messages":[{"role":"user","content":"refund order 12"}]}"#;

/// The fuzz target.
pub fn filter_config(data: &[u8]) {
    let result = FilterConfig::parse(data);
    assert_eq!(result, FilterConfig::parse(data), "deterministic");
    let config = match result {
        Ok(config) => config,
        Err(error) => {
            assert!(!error.to_string().is_empty());
            return;
        }
    };
    assert!((1..=64 << 20).contains(&config.body_limit_bytes));
    assert!((256..=1 << 20).contains(&config.header_limit_bytes));
    assert!((1..=10_000).contains(&config.assign_deadline_ms));
    if config.mode != Mode::Affinity {
        assert!(!config.batcher_clusters.is_empty());
    }
    assert!(!config.api_paths.is_empty());
    for path in &config.api_paths {
        assert!(
            config.is_api_path(path),
            "api path {path:?} accepted but never matches itself"
        );
        assert!(config.is_api_path(&format!("{path}?api-version=1")));
        assert!(config.is_api_path(&format!("/gateway{path}")));
    }
    let names = config.headers.reserved();
    for (i, name) in names.iter().enumerate() {
        assert_visible_ascii("header name", name);
        assert!(!name.bytes().any(|b| b.is_ascii_uppercase()), "{name}");
        assert!(!names[..i].contains(name), "header {name} configured twice");
    }

    let path = &config.api_paths[0];
    let headers: Vec<(String, String)> = [
        (":method", "POST"),
        (":path", path.as_str()),
        (config.tenant_header.as_str(), "tenant-a"),
    ]
    .iter()
    .map(|(n, v)| (n.to_string(), v.to_string()))
    .collect();
    let spoofed = spoofed_headers(&config, &headers);
    assert_eq!(
        spoofed.contains(&config.tenant_header.as_str()),
        !config.trust_tenant_header
    );
    let HeadersVerdict::Buffer(plan) = inspect_headers(&config, &headers, Some("spiffe://a"))
    else {
        panic!("a small POST to {path:?} was not buffered");
    };
    if let Ok(routing) = route_body(&config, &plan, BODY) {
        for (name, value) in &routing.headers {
            assert_visible_ascii(name, value);
        }
    }
}
