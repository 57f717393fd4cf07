//! The real filter in real Envoy (the pinned wheel), in front of recording upstreams on
//! loopback: routing on body-derived headers, affinity, bypass of bad input with the
//! upstream receiving the original bytes, spoofed headers, stats, invalid configuration.
//!
//! Needs `scripts/setup` (Envoy) and `scripts/build-wasm` (the filter); `scripts/test`
//! runs both first.

use cohort_fingerprint::{fingerprint, Request};
use cohort_tests::client::{post_json, request, send_raw, Response};
use cohort_tests::config::{self, set_endpoints, set_filter};
use cohort_tests::envoy::Envoy;
use cohort_tests::upstream::Upstream;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const CHAT: &str = "/v1/chat/completions";

/// `istio/envoy/affinity.yaml` over `upstreams` with the given plugin configuration.
fn affinity(upstreams: &[&Upstream], plugin: &str) -> Envoy {
    let mut config = config::load("affinity");
    let ports: Vec<u16> = upstreams.iter().map(|u| u.port).collect();
    set_endpoints(&mut config, "engines", &ports);
    set_filter(&mut config, plugin);
    config["stats_flush_interval"] = serde_yaml::Value::from("1s");
    Envoy::start(&config)
}

fn upstreams(n: usize) -> Vec<Upstream> {
    (0..n).map(|i| Upstream::start(&format!("u{i}"))).collect()
}

fn chat(system: Option<&str>, user: &str) -> Vec<u8> {
    let mut messages = vec![];
    if let Some(system) = system {
        messages.push(json!({"role": "system", "content": system}));
    }
    messages.push(json!({"role": "user", "content": user}));
    serde_json::to_vec(&json!({"model": "gemma-3-270m", "messages": messages})).unwrap()
}

fn upstream_of(response: &Response) -> String {
    response
        .header("x-upstream")
        .expect("answered by an upstream")
        .to_owned()
}

const TEMPLATES: [&str; 5] = [
    "Please refund order {n} for {name}, the receipt is at {url}",
    "Why was my card payment of ${n} to {name} declined?",
    "Send invoice {id} to {email} before the {n}th",
    "How do I reset the password of {email}? I tried {n} times",
    "Book a table for {n} people at {name} and text me the link {url}",
];
const NAMES: [&str; 8] = [
    "John",
    "Mary Ann",
    "Lisbon",
    "Oleksandr",
    "Dr Zhou",
    "Amelie",
    "Kofi",
    "Paris",
];

fn filled(template: &str, i: usize) -> String {
    template
        .replace("{n}", &(i * 37 + 3).to_string())
        .replace("{name}", NAMES[i % NAMES.len()])
        .replace(
            "{url}",
            &format!("https://shop.example.com/r/{i}?x={}", i * 7),
        )
        .replace("{id}", &format!("INV-{:04}-X{i}", 2024 + i))
        .replace("{email}", &format!("user{i}@mail{}.example.org", i % 3))
}

#[test]
fn one_cohort_one_replica_and_cohorts_spread_over_replicas() {
    let ups = upstreams(4);
    let envoy = affinity(&ups.iter().collect::<Vec<_>>(), "{}");

    // 5 intents x 40 fillings: every request of an intent lands on one replica.
    let mut replicas_of: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    for i in 0..40 {
        for (t, template) in TEMPLATES.iter().enumerate() {
            let response = post_json(
                envoy.listen_port,
                CHAT,
                &[],
                &chat(None, &filled(template, i)),
            );
            assert_eq!(response.status, 200);
            assert!(response
                .header("x-cohort")
                .unwrap()
                .contains("mode=affinity; cluster="));
            replicas_of
                .entry(t)
                .or_default()
                .insert(upstream_of(&response));
        }
    }
    for (t, replicas) in &replicas_of {
        assert_eq!(replicas.len(), 1, "intent {t} went to {replicas:?}");
    }

    // 200 applications (system prompts), 1 request each: spread over the 4 replicas.
    let mut load: BTreeMap<String, usize> = BTreeMap::new();
    for app in 0..200 {
        let system = format!("You are assistant number {app} of the Example Corp help desk.");
        let response = post_json(envoy.listen_port, CHAT, &[], &chat(Some(&system), "hello"));
        *load.entry(upstream_of(&response)).or_default() += 1;
    }
    let max = *load.values().max().unwrap() as f64;
    let mean = 200.0 / 4.0;
    println!(
        "load per replica for 200 cohorts: {load:?}, max/mean {:.2}",
        max / mean
    );
    assert_eq!(load.len(), 4);
    // The ring is built from the upstreams' addresses, and their ports are free ports
    // picked per run: each host's share of the ring varies by a few percent from run to
    // run on top of the keys' own spread (measured 1.12–1.44 in four runs, once above 1.5).
    assert!(max / mean <= 1.65, "max/mean {:.2}", max / mean);
    assert_eq!(envoy.stat("wasmcustom.cohort_fingerprinted_total"), 400);
}

#[test]
fn a_route_on_a_body_derived_header_picks_another_cluster() {
    let (dedicated, general) = (Upstream::start("dedicated"), Upstream::start("general"));
    let mut config = config::load("header-routes");
    set_endpoints(&mut config, "dedicated", &[dedicated.port]);
    set_endpoints(&mut config, "general", &[general.port]);
    set_filter(&mut config, "{}");
    let app = chat(
        Some("You are the billing assistant."),
        "where is my invoice?",
    );
    let prefix = fingerprint(&Request::new(&app)).unwrap().stable_prefix;
    config::replace_string(
        &mut config,
        "REPLACE_WITH_STABLE_PREFIX",
        &format!("{prefix:016x}"),
    );
    let envoy = Envoy::start(&config);

    // The route matches a header that exists only after the filter read the body.
    for user in [
        "where is my invoice?",
        "change my billing address",
        "refund 42",
    ] {
        let body = chat(Some("You are the billing assistant."), user);
        assert_eq!(
            upstream_of(&post_json(envoy.listen_port, CHAT, &[], &body)),
            "dedicated"
        );
    }
    let other = chat(
        Some("You are the travel assistant."),
        "where is my invoice?",
    );
    assert_eq!(
        upstream_of(&post_json(envoy.listen_port, CHAT, &[], &other)),
        "general"
    );
    let bypassed = post_json(envoy.listen_port, CHAT, &[], b"{not json");
    assert_eq!(upstream_of(&bypassed), "general");
    assert_eq!(
        general.received().last().unwrap().header("x-cohort-bypass"),
        Some("invalid_json")
    );
    assert_eq!(dedicated.count(), 3);
    drop(envoy);
}

/// Sends `body` and checks: the client gets the upstream's 200, the upstream got the exact
/// bytes, `x-cohort-bypass` names `reason` (None: fingerprinted), the counter moved.
fn check_passthrough(
    envoy: &Envoy,
    upstream: &Upstream,
    name: &str,
    response: Response,
    body: &[u8],
    reason: Option<&str>,
) {
    assert_eq!(response.status, 200, "{name}: {}", response.text());
    let got = upstream
        .received()
        .pop()
        .unwrap_or_else(|| panic!("{name}: nothing reached the upstream"));
    assert!(
        got.body == body,
        "{name}: upstream received {} bytes, sent {}",
        got.body.len(),
        body.len()
    );
    assert_eq!(got.header("x-cohort-bypass"), reason, "{name}");
    if let Some(reason) = reason {
        assert!(
            response
                .header("x-cohort")
                .unwrap()
                .ends_with(&format!("bypass={reason}")),
            "{name}"
        );
        assert!(
            envoy.stat(&format!("wasmcustom.cohort_bypass_{reason}_total")) > 0,
            "{name}"
        );
    } else {
        assert!(got.header("x-cohort-key").is_some(), "{name}");
    }
}

#[test]
fn bad_inputs_reach_the_upstream_unchanged_with_a_bypass_reason() {
    let upstream = Upstream::start("u");
    let envoy = affinity(&[&upstream], "{}");
    let port = envoy.listen_port;
    let mut invalid_utf8 = br#"{"model":"m","messages":[{"role":"user","content":"caf"#.to_vec();
    invalid_utf8.extend_from_slice(&[0xC3, 0x28, 0xFF]);
    invalid_utf8.extend_from_slice(br#""}]}"#);
    let deep = format!(
        r#"{{"model":"m","messages":{}{}}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let cases: Vec<(&str, Vec<u8>, Option<&str>)> = vec![
        ("invalid utf-8", invalid_utf8, Some("invalid_json")),
        (
            "malformed json",
            b"{\"model\": \"m\", \"messages\": [".to_vec(),
            Some("invalid_json"),
        ),
        (
            "nested 10,000 deep",
            deep.into_bytes(),
            Some("invalid_json"),
        ),
        (
            "empty messages",
            br#"{"model":"m","messages":[]}"#.to_vec(),
            Some("empty_prompt"),
        ),
        (
            "not an object",
            br#"[{"role":"user","content":"hi"}]"#.to_vec(),
            Some("unknown_shape"),
        ),
        (
            "missing messages",
            br#"{"model":"m","input_ids":[1,2,3]}"#.to_vec(),
            Some("malformed_request"),
        ),
        (
            "wrong types",
            br#"{"model":"m","messages":"hello"}"#.to_vec(),
            Some("malformed_request"),
        ),
        (
            "raw NUL bytes",
            b"{\"model\":\"m\",\"prompt\":\"a\0b\"}".to_vec(),
            Some("invalid_json"),
        ),
        ("emoji only", chat(None, "🔥🚀🙏"), None),
        (
            "zero-width and bidi",
            chat(None, "can\u{200B}cel \u{202E}my order\u{FEFF}"),
            None,
        ),
        ("escaped NULs", chat(None, "cancel\u{0}my order"), None),
    ];
    for (name, body, reason) in &cases {
        let response = post_json(port, CHAT, &[], body);
        check_passthrough(&envoy, &upstream, name, response, body, *reason);
    }

    // A 10 MB body with Content-Length: bypassed at the headers, never a 413.
    let big = chat(None, &"lorem ipsum ".repeat(10 * 1024 * 1024 / 12));
    let response = post_json(port, CHAT, &[], &big);
    check_passthrough(
        &envoy,
        &upstream,
        "10 MB body",
        response,
        &big,
        Some("body_too_large"),
    );

    // A 3 MB chunked body (no length up front): the filter stops buffering at its limit.
    let chunked_body = chat(None, &"dolor sit amet ".repeat(3 * 1024 * 1024 / 15));
    let mut raw = format!("POST {CHAT} HTTP/1.1\r\nhost: t\r\nconnection: close\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n").into_bytes();
    for chunk in chunked_body.chunks(64 * 1024) {
        raw.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        raw.extend_from_slice(chunk);
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"0\r\n\r\n");
    let response = send_raw(port, &raw).unwrap();
    check_passthrough(
        &envoy,
        &upstream,
        "3 MB chunked body",
        response,
        &chunked_body,
        Some("body_too_large"),
    );

    // A chunked body followed by trailers is fingerprinted (Envoy drops HTTP/1 trailers
    // unless enabled; with them the body ends at the trailers callback, which the filter handles).
    let body = chat(None, "refund order 77 please");
    let mut raw = format!("POST {CHAT} HTTP/1.1\r\nhost: t\r\nconnection: close\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n", body.len()).into_bytes();
    raw.extend_from_slice(&body);
    raw.extend_from_slice(b"\r\n0\r\nx-checksum: abc\r\n\r\n");
    let response = send_raw(port, &raw).unwrap();
    check_passthrough(
        &envoy,
        &upstream,
        "chunked body with trailers",
        response,
        &body,
        None,
    );

    // Request headers over 8 KiB: bypassed, not rejected.
    let padding = "p".repeat(9 * 1024);
    let body = chat(None, "refund my order");
    let response = post_json(port, CHAT, &[("x-padding", &padding)], &body);
    check_passthrough(
        &envoy,
        &upstream,
        "headers over 8 KiB",
        response,
        &body,
        Some("headers_too_large"),
    );

    // A gzip-encoded body is not parsed.
    let response = post_json(
        port,
        CHAT,
        &[("content-encoding", "gzip")],
        b"\x1f\x8b\x08\x00binary",
    );
    check_passthrough(
        &envoy,
        &upstream,
        "gzip body",
        response,
        b"\x1f\x8b\x08\x00binary",
        Some("content_encoded"),
    );

    let requests = envoy.stat("wasmcustom.cohort_requests_total");
    assert_eq!(requests as usize, cases.len() + 5);
}

/// The first `per_intent` test prompts of each of the first `intents` Banking77 intents, in
/// file order (data/intent/banking77_test.csv).
fn banking77(intents: usize, per_intent: usize) -> Vec<String> {
    let by_intent = cohort_fingerprint::banking77::test_by_intent();
    by_intent
        .into_iter()
        .take(intents)
        .flat_map(|(_, texts)| texts.into_iter().take(per_intent))
        .collect()
}

/// Banking77 prompts as traffic would bring them: the first `per_intent` of each of the
/// first `intents` intents, the intents interleaved; with the intent's index.
fn banking77_interleaved(intents: usize, per_intent: usize) -> Vec<(usize, String)> {
    let prompts = banking77(intents, per_intent);
    let mut out = Vec::new();
    for k in 0..per_intent {
        for intent in 0..intents {
            out.push((intent, prompts[intent * per_intent + k].clone()));
        }
    }
    out
}

#[test]
fn learned_cohorts_put_each_intent_on_one_replica() {
    // Through Envoy in affinity mode, with no system prompt, 20 paraphrases
    // of each of 5 intents. With `learned_cohorts` the filter's leader clustering
    // (fingerprint/src/learned.rs, in Envoy's shared data) keys them; without it, the
    // codebook's cells do, and they cut through the intents (docs/SKETCH.md).
    let ups = upstreams(4);
    let ups: Vec<&Upstream> = ups.iter().collect();
    let prompts = banking77_interleaved(5, 20);
    // The least share, over the intents, of an intent in its largest cohort (from the
    // response's `x-cohort` header) and on its most used replica.
    let run = |plugin: &str, headers: &[(&str, &str)]| -> (f64, f64, usize, Envoy) {
        let envoy = affinity(&ups, plugin);
        let mut ids = BTreeSet::new();
        let mut cohorts: BTreeMap<usize, BTreeMap<String, usize>> = BTreeMap::new();
        let mut replicas: BTreeMap<usize, BTreeMap<String, usize>> = BTreeMap::new();
        for (intent, text) in &prompts {
            let response = post_json(envoy.listen_port, CHAT, headers, &chat(None, text));
            assert_eq!(response.status, 200);
            let summary = response.header("x-cohort").expect("routed by Cohort");
            let cluster = summary
                .split("cluster=")
                .nth(1)
                .and_then(|rest| rest.split(';').next())
                .expect("a cohort id")
                .to_owned();
            ids.insert(cluster.clone());
            *cohorts
                .entry(*intent)
                .or_default()
                .entry(cluster)
                .or_default() += 1;
            *replicas
                .entry(*intent)
                .or_default()
                .entry(upstream_of(&response))
                .or_default() += 1;
        }
        println!("{plugin}: replicas per intent {replicas:?}");
        let least = |counts: &BTreeMap<usize, BTreeMap<String, usize>>| {
            counts
                .values()
                .map(|c| *c.values().max().unwrap() as f64 / 20.0)
                .fold(1.0, f64::min)
        };
        (least(&cohorts), least(&replicas), ids.len(), envoy)
    };
    let learned_on = r#"{"learned_cohorts": {}}"#;
    let (codebook_cohort, codebook_replica, _, _) = run("{}", &[]);
    let (learned_cohort, learned_replica, cohorts, envoy) = run(learned_on, &[]);
    println!(
        "least share of an intent in one cohort / on one replica: \
         codebook {codebook_cohort:.2} / {codebook_replica:.2}, learned {learned_cohort:.2} / {learned_replica:.2}"
    );
    // Which replica a cohort's key lands on depends on the ring the free ports make, so
    // the comparison with the codebook is by cohort; the goal is by replica.
    assert!(
        learned_replica >= 0.8,
        "every intent ≥ 80% on one replica: {learned_replica:.2}"
    );
    assert!(learned_cohort >= 0.8, "{learned_cohort:.2}");
    assert!(
        codebook_cohort < learned_cohort,
        "the codebook splits more: {codebook_cohort:.2}"
    );
    // The batch threshold is the join's similarity bound: higher, more and purer cohorts.
    let (_, _, coarse, _) = run(learned_on, &[("x-cohort-batch-threshold", "0.3")]);
    let (_, _, fine, _) = run(learned_on, &[("x-cohort-batch-threshold", "0.7")]);
    println!("learned cohorts at threshold 0.3 / 0.5 / 0.7: {coarse} / {cohorts} / {fine}");
    assert!(coarse < cohorts && cohorts < fine);
    let started = envoy.stat("wasmcustom.cohort_learned_started_total");
    let joined = envoy.stat("wasmcustom.cohort_learned_joined_total");
    assert_eq!(started + joined, 100);
    assert!((5..=10).contains(&started), "{started} cohorts started");

    // The table's size acts: with room for two leaders of the tenant, five intents keep
    // evicting each other's leaders, so prompts start cohorts again and intents split.
    let (small_cohort, _, _, small) = run(
        r#"{"learned_cohorts": {"capacity": 8, "per_tenant": 2}}"#,
        &[],
    );
    let small_started = small.stat("wasmcustom.cohort_learned_started_total");
    println!("per_tenant 2: {small_started} starts, least share in one cohort {small_cohort:.2}");
    assert!(
        small_started > 2 * started,
        "{small_started} against {started}"
    );
    assert!(small_cohort < learned_cohort, "{small_cohort:.2}");
}

#[test]
fn the_batch_threshold_picks_the_codebook_level_of_bare_prompts() {
    // Cohort ids are the nearest centroids of the shipped codebook, coarse to fine by
    // x-cohort-batch-threshold (fingerprint/src/sketch/codebook.rs). Bare prompts (no
    // system prompt or tools) are keyed by them; an application's system prompt keys its
    // requests whatever the threshold.
    let upstream = Upstream::start("u");
    let envoy = affinity(&[&upstream], "{}");
    let prompts = banking77(5, 20);
    let mut clusters: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    let mut keys: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for threshold in ["0.1", "0.5", "0.9"] {
        for text in &prompts {
            let headers = [("x-cohort-batch-threshold", threshold)];
            let response = post_json(envoy.listen_port, CHAT, &headers, &chat(None, text));
            assert_eq!(response.status, 200);
            let got = upstream.received().pop().unwrap();
            let cluster = got.header("x-cohort-cluster").expect("a cohort id");
            clusters
                .entry(threshold)
                .or_default()
                .insert(cluster.to_owned());
            let key = got.header("x-cohort-key").expect("a routing key");
            keys.entry(threshold).or_default().insert(key.to_owned());
        }
    }
    let count = |t: &str| clusters[t].len();
    println!(
        "distinct cohort ids over 100 prompts of 5 intents: {} / {} / {} at 0.1 / 0.5 / 0.9",
        count("0.1"),
        count("0.5"),
        count("0.9")
    );
    assert!(count("0.1") < count("0.5") && count("0.5") < count("0.9"));
    // The sketch's sign signature gave nearly every prompt an id of its own; the default
    // level groups them (16 ids measured when the codebook was fitted).
    assert!(count("0.5") <= 30, "{} ids", count("0.5"));
    for threshold in ["0.1", "0.5", "0.9"] {
        assert_eq!(
            keys[threshold].len(),
            count(threshold),
            "bare prompts are keyed by cohort"
        );
    }

    let app_key = |threshold: &str| {
        let headers = [("x-cohort-batch-threshold", threshold)];
        let body = chat(Some("You are the bank's support assistant."), &prompts[0]);
        post_json(envoy.listen_port, CHAT, &headers, &body);
        let got = upstream.received().pop().unwrap();
        got.header("x-cohort-key").unwrap().to_owned()
    };
    assert_eq!(
        app_key("0.1"),
        app_key("0.9"),
        "a system prompt anchors the key"
    );
}

#[test]
fn the_operator_sets_knob_defaults_per_route_and_bounds_per_tenant() {
    // The knob policy (fingerprint/src/knobs/policy.rs): a route's default threshold
    // acts without any client header, and a tenant's range clamps a client's header.
    let upstream = Upstream::start("u");
    let plugin = r#"{"trust_tenant_header": true,
        "knobs": {"routes": [{"authority": "coarse.example", "knobs": {"batch_threshold": 0.1}}],
                  "tenants": {"fine-only": {"batch_threshold_range": [0.9, 0.9]}}}}"#;
    let envoy = affinity(&[&upstream], plugin);
    let prompts = banking77(5, 20);
    let ids = |headers: &[(&str, &str)]| -> BTreeSet<String> {
        prompts
            .iter()
            .map(|text| {
                let response = post_json(envoy.listen_port, CHAT, headers, &chat(None, text));
                assert_eq!(response.status, 200);
                let got = upstream.received().pop().unwrap();
                got.header("x-cohort-cluster")
                    .expect("a cohort id")
                    .to_owned()
            })
            .collect()
    };
    let default_route = ids(&[]);
    let coarse_route = ids(&[("host", "Coarse.example:8080")]);
    let coarse_asked = ids(&[("x-cohort-batch-threshold", "0.1")]);
    println!(
        "cohort ids of 100 prompts: default route {}, coarse route {}, header 0.1 {}",
        default_route.len(),
        coarse_route.len(),
        coarse_asked.len()
    );
    assert_eq!(
        coarse_route, coarse_asked,
        "the route's default is threshold 0.1"
    );
    assert!(coarse_route.len() < default_route.len());
    // A client of the tenant asks for 0.1 and gets the tenant's 0.9; another tenant asking
    // for 0.9 gets the same number of ids (tenants' ids are salted apart, so count them).
    let fine_asked_coarse = ids(&[
        ("x-cohort-tenant", "fine-only"),
        ("x-cohort-batch-threshold", "0.1"),
    ]);
    let other_asked_fine = ids(&[
        ("x-cohort-tenant", "other"),
        ("x-cohort-batch-threshold", "0.9"),
    ]);
    assert_eq!(fine_asked_coarse.len(), other_asked_fine.len());
    assert!(fine_asked_coarse.len() > default_route.len());
    assert!(
        envoy.wait_for_stat(
            "wasmcustom.cohort_invalid_knob_batch_threshold_total",
            100,
            Duration::from_secs(5)
        ),
        "each clamped header is counted"
    );
}

#[test]
fn bare_prompts_of_different_semantic_modes_get_different_cohorts() {
    // x-cohort-semantic-mode keys bare prompts apart: the same prompts under `intent` and
    // `topic` share no cohort id and no routing key, so neither affinity nor batch grouping
    // mixes them.
    let upstream = Upstream::start("u");
    let envoy = affinity(&[&upstream], "{}");
    let prompts = banking77(5, 4);
    let seen = |mode: &str| -> (BTreeSet<String>, BTreeSet<String>) {
        let mut clusters = BTreeSet::new();
        let mut keys = BTreeSet::new();
        for text in &prompts {
            let headers = [("x-cohort-semantic-mode", mode)];
            let response = post_json(envoy.listen_port, CHAT, &headers, &chat(None, text));
            assert_eq!(response.status, 200);
            let got = upstream.received().pop().unwrap();
            clusters.insert(got.header("x-cohort-cluster").unwrap().to_owned());
            keys.insert(got.header("x-cohort-key").unwrap().to_owned());
        }
        (clusters, keys)
    };
    let (intent_clusters, intent_keys) = seen("intent");
    let (topic_clusters, topic_keys) = seen("topic");
    assert!(intent_clusters.is_disjoint(&topic_clusters));
    assert!(intent_keys.is_disjoint(&topic_keys));
    assert!(
        topic_clusters.len() < prompts.len(),
        "topic prompts still group"
    );
}

#[test]
fn an_anchored_category_gets_a_cohort_of_its_own_through_envoy() {
    // The recommendation template: a capitalised category mid-sentence is masked as a
    // name, so every category is one cohort; anchored (【…】) each is its own.
    let upstream = Upstream::start("u");
    let envoy = affinity(&[&upstream], "{}");
    let categories = ["Electronics", "Gardening", "Books", "Toys", "Kitchen"];
    let cohorts = |anchored: bool| -> BTreeSet<String> {
        categories
            .iter()
            .map(|category| {
                let value = if anchored {
                    format!("\u{3010}{category}\u{3011}")
                } else {
                    (*category).to_owned()
                };
                let ask = format!(
                    "Based on my purchase history of running shoes and socks, recommend {value} \
                     products I might like"
                );
                let response = post_json(envoy.listen_port, CHAT, &[], &chat(None, &ask));
                assert_eq!(response.status, 200);
                let got = upstream.received().pop().unwrap();
                got.header("x-cohort-cluster").unwrap().to_owned()
            })
            .collect()
    };
    assert_eq!(cohorts(false).len(), 1);
    assert_eq!(cohorts(true).len(), categories.len());
}

#[test]
fn spoofed_routing_headers_never_take_effect() {
    let upstream = Upstream::start("u");
    let envoy = affinity(&[&upstream], "{}");
    let body = chat(None, "cancel my order 42");
    let honest = post_json(envoy.listen_port, CHAT, &[], &body);
    assert_eq!(honest.status, 200);
    let honest_key = upstream
        .received()
        .pop()
        .unwrap()
        .header("x-cohort-key")
        .unwrap()
        .to_owned();

    let spoofed = [
        ("x-cohort-key", "ffffffffffffffff"),
        ("x-cohort-shard", "7"),
        ("x-cohort-cluster", "deadbeef"),
        ("x-cohort-tenant", "victim"),
    ];
    post_json(envoy.listen_port, CHAT, &spoofed, &body);
    let got = upstream.received().pop().unwrap();
    assert_eq!(
        got.header("x-cohort-key"),
        Some(honest_key.as_str()),
        "the key is the body's, salted as before"
    );
    assert_eq!(got.header("x-cohort-shard"), None);
    assert_ne!(got.header("x-cohort-cluster"), Some("deadbeef"));
    assert_eq!(got.header("x-cohort-tenant"), None);

    // Also on paths the filter does not fingerprint.
    request(
        envoy.listen_port,
        "GET",
        "/v1/models",
        &[("x-cohort-key", "ffffffffffffffff")],
        b"",
    )
    .unwrap();
    assert_eq!(
        upstream.received().pop().unwrap().header("x-cohort-key"),
        None
    );
    assert!(envoy.stat("wasmcustom.cohort_spoofed_header_removed_total") >= 5);
}

#[test]
fn other_requests_pass_untouched() {
    let upstream = Upstream::start("u");
    let envoy = affinity(&[&upstream], "{}");
    let response = request(envoy.listen_port, "GET", "/v1/models", &[], b"").unwrap();
    assert_eq!(response.status, 200);
    assert_eq!(response.header("x-cohort"), None);
    let body = br#"{"input":"embed me"}"#;
    let response = post_json(envoy.listen_port, "/v1/embeddings", &[], body);
    assert_eq!(response.header("x-cohort"), None);
    let got = upstream.received().pop().unwrap();
    assert_eq!(got.body, body);
    assert!(got.headers.iter().all(|(n, _)| !n.starts_with("x-cohort")));
    assert_eq!(envoy.stat("wasmcustom.cohort_requests_total"), 0);
}

#[test]
fn stats_show_in_admin_stats_and_prometheus() {
    let upstream = Upstream::start("u");
    let envoy = affinity(&[&upstream], r#"{"histogram_sample_every": 1}"#);
    for i in 0..5 {
        post_json(
            envoy.listen_port,
            CHAT,
            &[("x-cohort-batch-threshold", "NaN")],
            &chat(None, &format!("refund order {i}")),
        );
    }
    post_json(envoy.listen_port, CHAT, &[], b"{oops");
    assert_eq!(envoy.stat("wasmcustom.cohort_requests_total"), 6);
    assert_eq!(envoy.stat("wasmcustom.cohort_fingerprinted_total"), 5);
    assert_eq!(envoy.stat("wasmcustom.cohort_bypass_total"), 1);
    assert_eq!(envoy.stat("wasmcustom.cohort_bypass_invalid_json_total"), 1);
    assert_eq!(
        envoy.stat("wasmcustom.cohort_invalid_knob_batch_threshold_total"),
        5
    );

    // Histograms appear after a stats flush (1 s in the test config), with every sample
    // once both workers' samples are merged: poll rather than guess the flush.
    let expected = [
        "# TYPE cohort_requests_total counter",
        "cohort_requests_total{} 6",
        "cohort_bypass_invalid_json_total{} 1",
        "cohort_fingerprint_us_count{} 5",
        "cohort_sketch_us_count{} 5",
        "cohort_body_bytes_count{} 5",
        "cohort_assign_ok_total{} 0",
    ];
    let flushed = cohort_tests::eventually(Duration::from_secs(15), || {
        let stats = envoy.admin("/stats?filter=cohort");
        let prometheus = envoy.admin("/stats/prometheus");
        [
            "wasmcustom.cohort_fingerprint_us: P0",
            "wasmcustom.cohort_body_bytes: P0",
            "wasmcustom.cohort_sketch_us: P0",
        ]
        .iter()
        .all(|name| stats.contains(name))
            && expected.iter().all(|name| prometheus.contains(name))
    });
    let prometheus = envoy.admin("/stats/prometheus");
    let missing: Vec<_> = expected
        .iter()
        .filter(|name| !prometheus.contains(*name))
        .collect();
    assert!(
        flushed,
        "missing from /stats/prometheus: {missing:?}\n{}",
        envoy.admin("/stats?filter=cohort")
    );
}

/// `histogram_sample_every` (default 8): the per-body histograms take the first request of
/// each worker and then one in eight; the counters still count every request.
#[test]
fn per_body_histograms_are_sampled_and_counters_are_not() {
    // The fingerprint histograms and the response stats' latency histograms.
    let upstream = Upstream::start("u");
    let count = |envoy: &Envoy, name: &str| -> Option<u64> {
        let page = envoy.admin("/stats/prometheus");
        page.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}_count{{}} "))?.parse().ok())
    };
    for (config, low, high) in [("{}", 3, 4), (r#"{"histogram_sample_every": 1}"#, 20, 20)] {
        let envoy = affinity(&[&upstream], config);
        for i in 0..20 {
            let r = post_json(
                envoy.listen_port,
                CHAT,
                &[],
                &chat(None, &format!("refund {i}")),
            );
            assert_eq!(r.status, 200);
        }
        assert_eq!(envoy.stat("wasmcustom.cohort_fingerprinted_total"), 20);
        // Two workers: ceil(k/8) samples each for k and 20 - k requests, so 3 or 4.
        let settled = cohort_tests::eventually(Duration::from_secs(15), || {
            [
                "cohort_fingerprint_us",
                "cohort_sketch_us",
                "cohort_body_bytes",
            ]
            .iter()
            .all(|name| count(&envoy, name).is_some_and(|n| (low..=high).contains(&n)))
                // The response stats' times at the same rate; their counters count all.
                && ["cohort_response_ttfb_ms_count", "cohort_response_total_ms_count"]
                    .iter()
                    .all(|name| (low..=high).contains(&(envoy.series_sum(name, &[]) as u64)))
                && envoy.series_sum("cohort_responses_total", &[]) == 20.0
        });
        assert!(
            settled,
            "{config}: fingerprint_us count {:?}, response ttfb count {}, expected {low}..={high}",
            count(&envoy, "cohort_fingerprint_us"),
            envoy.series_sum("cohort_response_ttfb_ms_count", &[])
        );
    }
}

#[test]
fn an_invalid_configuration_passes_everything_through() {
    let upstream = Upstream::start("u");
    let envoy = affinity(&[&upstream], r#"{"mode": "turbo"}"#);
    let body = chat(None, "refund my order");
    let response = post_json(
        envoy.listen_port,
        CHAT,
        &[("x-cohort-key", "client-value")],
        &body,
    );
    assert_eq!(response.status, 200);
    assert_eq!(response.header("x-cohort"), None);
    let got = upstream.received().pop().unwrap();
    assert_eq!(got.body, body);
    assert_eq!(
        got.header("x-cohort-key"),
        Some("client-value"),
        "untouched, as if the filter were absent"
    );
    assert!(
        envoy.log().contains("invalid configuration"),
        "{}",
        envoy.log()
    );
}
