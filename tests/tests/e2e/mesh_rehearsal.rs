//! The assign overlay rehearsed as a mesh would run it: everything the sidecar, the batcher
//! and the engines are given comes from `kubectl kustomize istio/assign`, and only what a
//! cluster would supply is the test's own (addresses, the pods, the DNS server).
//!
//! From the rendered objects:
//! - **the sidecar's Envoy**: the Cohort HTTP filter with the EnvoyFilter's Wasm settings
//!   and filter configuration (the `oci://` module replaced by the built file, as
//!   istio-agent hands Envoy a local file), the listener's buffer limit from its LISTENER
//!   patch; the engines' cluster as Istio derives it from the DestinationRule (ring hash,
//!   connection pool, outlier detection) with every rendered CLUSTER patch merged onto it
//!   (assign's `override_host` policy); the routes translated from
//!   the VirtualService with the DestinationRule's consistent hash on `x-cohort-key`; the
//!   batcher clusters under the names the filter configuration uses (Istio's
//!   `outbound|50051||cohort-batcher-N.llm.svc.cluster.local`), shaped as in
//!   `istio/envoy/assign.yaml`;
//! - **the batcher**: `cohort serve` with the ConfigMap's `cohort.toml`, one process per
//!   shard of `shard_count`; the only change is `discovery.resolver` (the test's DNS server
//!   in place of the pod's kube-dns) and the listen ports (flags, as the harness starts
//!   every batcher);
//! - **the engines' names**: the headless Service the batcher discovers (`discovery.dns`,
//!   SRV through `port_name`), served by dnsmasq with three engine-sim pods
//!   (`llm-engine-0..2` at 127.0.0.2–4 on one port); the engines' cluster resolves the same
//!   name, which gives it the pods' addresses as EDS would in the mesh.
//!
//! What the test adds to observe, and nothing else: the route echoes, on the response, the
//! request headers the filter wrote and the upstream address Envoy picked.
//!
//! It checks what docs/ISTIO.md promises of assign mode: the `x-cohort-*` headers on the
//! request and `x-cohort` on the response, the batcher's replica choice honoured through
//! `x-gateway-destination-endpoint` (the upstream that served is the endpoint named, and a
//! shared prompt keeps its replica and hits its cache), the hold-out left alone, and fail
//! open with the batcher down (every request still served, routed by key).

use cohort_tests::batcher::{Batcher, BatcherSpec};
use cohort_tests::client::Connection;
use cohort_tests::dns::{Dnsmasq, Pod};
use cohort_tests::engine_sim::EngineSim;
use cohort_tests::envoy::Envoy;
use cohort_tests::manifests::{batcher_config, filter_config, find, render};
use cohort_tests::{config, eventually, free_port, one_at_a_time, with_port_retries};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::Duration;

const CHAT: &str = "/v1/chat/completions";
const PODS: [&str; 3] = ["llm-engine-0", "llm-engine-1", "llm-engine-2"];
/// Response headers the test's route adds to observe the request as the engine got it.
const SEEN_UPSTREAM: &str = "x-rehearsal-upstream";
const SEEN_ENDPOINT: &str = "x-rehearsal-endpoint";
const SEEN_KEY: &str = "x-rehearsal-key";
const SEEN_SHARD: &str = "x-rehearsal-shard";

/// The patch of `kind`/`name`'s configPatches applied to `apply_to`.
fn patch<'a>(objects: &'a [Value], name: &str, apply_to: &str) -> &'a Value {
    find(objects, "EnvoyFilter", name)["spec"]["configPatches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["applyTo"] == apply_to)
        .unwrap_or_else(|| panic!("EnvoyFilter {name} has no {apply_to} patch"))
}

/// Merges `from` into `into` as Envoy's proto MERGE does for messages (recursively; other
/// values replaced).
fn merge(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Object(into), Value::Object(from)) => {
            for (key, value) in from {
                merge(into.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
        (into, from) => *into = from.clone(),
    }
}

/// The routes of the rendered VirtualService `llm-engine`, as Istio would write them for
/// the sidecar: header matches, the destination's cluster, timeout, retries, and the
/// DestinationRule's consistent hash on a header; plus the observation headers.
fn routes(objects: &[Value], engines_cluster: &str) -> Value {
    let virtual_service = find(objects, "VirtualService", "llm-engine");
    let hash = &find(objects, "DestinationRule", "llm-engine")["spec"]["trafficPolicy"]
        ["loadBalancer"]["consistentHash"]["httpHeaderName"];
    let routes: Vec<Value> = virtual_service["spec"]["http"]
        .as_array()
        .unwrap()
        .iter()
        .map(|http| {
            assert!(
                http["route"][0]["destination"]["subset"].is_null(),
                "assign mode routes on no subset"
            );
            let headers: Vec<Value> = http["match"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|m| m["headers"].as_object().cloned().unwrap_or_default())
                .map(|(name, value)| {
                    json!({"name": name, "string_match": {"exact": value["exact"]}})
                })
                .collect();
            let timeout = http["timeout"].as_str().unwrap_or("15s");
            let mut route = json!({
                "cluster": engines_cluster,
                "timeout": timeout,
                "hash_policy": [{"header": {"header_name": hash}}],
            });
            if let Some(retries) = http.get("retries") {
                route["retry_policy"] = json!({
                    "retry_on": retries["retryOn"],
                    "num_retries": retries["attempts"],
                });
            }
            json!({
                "name": http["name"],
                "match": {"prefix": "/", "headers": headers},
                "route": route,
                "response_headers_to_add": [
                    {"header": {"key": SEEN_UPSTREAM, "value": "%UPSTREAM_REMOTE_ADDRESS%"}},
                    {"header": {"key": SEEN_ENDPOINT, "value": "%REQ(x-gateway-destination-endpoint)%"}},
                    {"header": {"key": SEEN_KEY, "value": "%REQ(x-cohort-key)%"}},
                    {"header": {"key": SEEN_SHARD, "value": "%REQ(x-cohort-shard)%"}},
                ],
            })
        })
        .collect();
    json!(routes)
}

/// The sidecar's Envoy for the rendered assign overlay (see the module doc).
fn sidecar(
    objects: &[Value],
    grpc_ports: &[u16],
    dns: &Dnsmasq,
    service: &str,
    engine_port: u16,
) -> serde_yaml::Value {
    // The filter, as the EnvoyFilter's EXTENSION_CONFIG gives it.
    let extension = patch(objects, "cohort", "EXTENSION_CONFIG");
    let mut wasm = extension["patch"]["value"]["typed_config"]["value"].clone();
    assert_eq!(
        extension["patch"]["value"]["typed_config"]["type_url"],
        "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
    );
    wasm["config"]["vm_config"]["code"] =
        json!({"local": {"filename": config::filter_wasm().display().to_string()}});
    wasm["@type"] = json!("type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm");
    let filter_json: Value = serde_json::from_str(&filter_config(objects)).unwrap();

    // The engines' cluster: what Istio derives from the DestinationRule (ring hash, the
    // connection pool, outlier detection), the pods' addresses from DNS, then every rendered
    // CLUSTER patch that matches it, merged in order.
    let endpoint_patch = patch(objects, "cohort-engine-endpoint", "CLUSTER");
    let engines_service = endpoint_patch["match"]["cluster"]["service"]
        .as_str()
        .unwrap();
    let engines_cluster = format!("outbound|{engine_port}||{engines_service}");
    let policy = &find(objects, "DestinationRule", "llm-engine")["spec"]["trafficPolicy"];
    let pool = &policy["connectionPool"]["http"];
    let outlier = &policy["outlierDetection"];
    let ring = &policy["loadBalancer"]["consistentHash"]["ringHash"];
    let mut engines = json!({
        "name": engines_cluster,
        "type": "STRICT_DNS",
        "lb_policy": "RING_HASH",
        "ring_hash_lb_config": {"minimum_ring_size": ring["minimumRingSize"]},
        "connect_timeout": "1s",
        "dns_refresh_rate": "1s",
        "respect_dns_ttl": false,
        "dns_lookup_family": "V4_ONLY",
        "typed_dns_resolver_config": {
            "name": "envoy.network.dns_resolver.cares",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.network.dns_resolver.cares.v3.CaresDnsResolverConfig",
                "resolvers": [{"socket_address": {"address": "127.0.0.1", "port_value": dns.port}}],
                "dns_resolver_options": {"no_default_search_domain": true},
            },
        },
        "load_assignment": {"cluster_name": engines_cluster, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": service, "port_value": engine_port}}}}
        ]}]},
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "common_http_protocol_options": {"idle_timeout": pool["idleTimeout"]},
            "explicit_http_config": {"http_protocol_options": {}},
        }},
        "circuit_breakers": {"thresholds": [{"max_retries": pool["maxRetries"]}]},
        "outlier_detection": {
            "consecutive_5xx": outlier["consecutive5xxErrors"],
            "consecutive_gateway_failure": outlier["consecutiveGatewayErrors"],
            "interval": outlier["interval"],
            "base_ejection_time": outlier["baseEjectionTime"],
            "max_ejection_percent": outlier["maxEjectionPercent"],
        },
    });
    let cluster_patches: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == "EnvoyFilter")
        .flat_map(|o| o["spec"]["configPatches"].as_array().unwrap())
        .filter(|p| p["applyTo"] == "CLUSTER" && p["match"] == endpoint_patch["match"])
        .collect();
    for cluster_patch in cluster_patches {
        assert_eq!(cluster_patch["patch"]["operation"], "MERGE");
        merge(&mut engines, &cluster_patch["patch"]["value"]);
    }

    // The batcher clusters, under the names the filter configuration uses.
    let standalone = config::load("assign");
    let shape = serde_json::to_value(
        standalone["static_resources"]["clusters"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|c| c["name"].as_str() == Some("cohort-batcher-0"))
            .unwrap(),
    )
    .unwrap();
    let names = filter_json["batcher_clusters"].as_array().unwrap();
    assert_eq!(names.len(), grpc_ports.len());
    let mut clusters = vec![engines];
    for (name, port) in names.iter().zip(grpc_ports) {
        let mut cluster = shape.clone();
        cluster["name"] = name.clone();
        cluster["load_assignment"] = json!({"cluster_name": name, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}
        ]}]});
        clusters.push(cluster);
    }

    let listener_patch = patch(objects, "cohort", "LISTENER");
    let mut listener = json!({
        "name": "outbound",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "outbound",
                "route_config": {"virtual_hosts": [{
                    "name": "llm-engine", "domains": ["*"], "routes": routes(objects, &engines_cluster),
                }]},
                "http_filters": [
                    {"name": "cohort", "typed_config": wasm},
                    {"name": "envoy.filters.http.router", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}},
                ],
            },
        }]}],
    });
    merge(&mut listener, &listener_patch["patch"]["value"]);
    let bootstrap = json!({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {"listeners": [listener], "clusters": clusters},
    });
    serde_yaml::to_value(&bootstrap).unwrap()
}

/// One chat request of application `app` (its own system prompt, over the 4 KiB that pick
/// a request's batcher shard, so an application's requests meet one shard) from user
/// `session`.
fn ask(
    connection: &mut Connection,
    app: usize,
    turn: usize,
    session: &str,
) -> cohort_tests::client::Response {
    ask_with(connection, app, turn, &[("x-cohort-session", session)])
}

/// [`ask`] with the given request headers.
fn ask_with(
    connection: &mut Connection,
    app: usize,
    turn: usize,
    headers: &[(&str, &str)],
) -> cohort_tests::client::Response {
    let body = serde_json::to_vec(&json!({
        "model": "sim-model",
        "max_tokens": 2,
        "messages": [
            {"role": "system", "content": format!("You are the assistant of application {app}. {}", "Answer in one short paragraph and cite the policy you used. ".repeat(80))},
            {"role": "user", "content": format!("Question {turn}: how do I change my plan {}?", turn * 7)},
        ],
    }))
    .unwrap();
    connection
        .post_json(CHAT, headers, &body)
        .expect("Envoy answers")
}

#[test]
fn the_rendered_assign_overlay_routes_through_envoy_the_batcher_and_discovered_engines() {
    let _serial = one_at_a_time();
    let objects = render("assign");
    let (_, toml_text) = batcher_config(&objects);
    let mut toml: toml::Table = toml_text.parse().unwrap();
    let discovery = toml["discovery"]
        .as_table()
        .expect("assign discovers its engines")
        .clone();
    let service = discovery["dns"].as_str().unwrap().to_owned();
    let port_name = discovery["port_name"].as_str().unwrap().to_owned();
    let shards = toml["shard_count"].as_integer().unwrap() as u32;

    // The engine pods, one port on three loopback addresses, and the DNS that lists them.
    let pods: Vec<EngineSim> = with_port_retries("engine pods", |_| {
        let port = free_port();
        (0..PODS.len())
            .map(|i| EngineSim::start_at(Ipv4Addr::new(127, 0, 0, 2 + i as u8), port, 0.002))
            .collect::<Result<Vec<_>, _>>()
    });
    let engine_port = pods[0].port;
    let listed: Vec<Pod> = pods
        .iter()
        .zip(PODS)
        .map(|(sim, name)| Pod { name, ip: sim.ip })
        .collect();
    let dns = Dnsmasq::start(&service, &port_name, engine_port, &listed);
    let endpoint_of: BTreeMap<String, String> = PODS
        .iter()
        .zip(&pods)
        .map(|(name, sim)| (name.to_string(), sim.endpoint()))
        .collect();

    // The batcher: the shipped file, asking the test's DNS server; one process per shard.
    toml["discovery"]
        .as_table_mut()
        .unwrap()
        .insert("resolver".into(), dns.address().into());
    let dir = std::env::temp_dir().join(format!("cohort-rehearsal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config_path = dir.join("cohort.toml");
    std::fs::write(&config_path, toml::to_string(&toml).unwrap()).unwrap();
    let mut batchers: Vec<Batcher> = (0..shards)
        .map(|shard| {
            Batcher::start(BatcherSpec {
                grpc_port: free_port(),
                http_port: free_port(),
                replicas: Vec::new(),
                shard_index: shard,
                shard_count: shards,
                front_port: None,
                picker_port: None,
                extra_args: vec!["--config".into(), config_path.display().to_string()],
            })
        })
        .collect();
    for batcher in &batchers {
        assert!(
            eventually(Duration::from_secs(15), || batcher
                .metric("cohort_discovery_replicas")
                == PODS.len() as f64),
            "shard {}: the pods not discovered:\n{}",
            batcher.spec.shard_index,
            batcher.log()
        );
    }
    let grpc_ports: Vec<u16> = batchers.iter().map(|b| b.spec.grpc_port).collect();
    let envoy = Envoy::start(&sidecar(&objects, &grpc_ports, &dns, &service, engine_port));
    let mut connection = Connection::new(envoy.listen_port);

    // Users the rollout treats (the shipped share keeps 5% out, stable per session), found
    // by their first answer; the held-out ones must be left alone.
    let mut treated = Vec::new();
    let mut held_out = 0;
    let started = std::time::Instant::now();
    let mut last = String::new();
    assert!(
        eventually(Duration::from_secs(15), || {
            let r = ask(&mut connection, 99, 0, "warm-up");
            last = format!("{} {:?}", r.status, r.header("x-cohort"));
            r.header("x-cohort").is_some_and(|h| h.contains("shard="))
        }),
        "no Assign answer through Envoy (last: {last}):\n{}\n{}\nbatcher 0:\n{}",
        envoy.log(),
        envoy
            .admin("/stats")
            .lines()
            .filter(|l| l.contains("batcher") || l.contains("assign"))
            .collect::<Vec<_>>()
            .join("\n"),
        batchers[0].log()
    );
    for user in 0..80 {
        let session = format!("user-{user}");
        let response = ask(&mut connection, 100 + user, 0, &session);
        assert_eq!(response.status, 200);
        let verdict = cohort_tests::client::verdict(response.header("x-cohort"));
        if verdict == "holdout" {
            held_out += 1;
            assert!(
                response.header(SEEN_KEY).unwrap_or("").is_empty(),
                "{verdict}"
            );
        } else {
            treated.push(session);
        }
    }
    assert!(treated.len() >= 60, "{} of 80 treated", treated.len());

    // Assign mode: every treated request goes where the batcher said, with its headers.
    let mut homes: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    let mut cached_repeats = 0;
    for turn in 0..6 {
        for app in 0..4 {
            let session = &treated[(turn * 4 + app) % treated.len()];
            let response = ask(&mut connection, app, turn, session);
            assert_eq!(response.status, 200, "{}", response.text());
            let verdict = response.header("x-cohort").unwrap();
            assert!(verdict.contains("mode=assign"), "{verdict}");
            let shard = verdict
                .split("; ")
                .find_map(|part| part.strip_prefix("shard="))
                .unwrap_or_else(|| panic!("no shard in {verdict}"));
            let endpoint = &endpoint_of[shard];
            assert_eq!(response.header(SEEN_SHARD), Some(shard), "{verdict}");
            assert_eq!(
                response.header(SEEN_ENDPOINT),
                Some(endpoint.as_str()),
                "{verdict}"
            );
            assert_eq!(
                response.header(SEEN_UPSTREAM),
                Some(endpoint.as_str()),
                "the engine that served is the one the batcher named ({verdict})"
            );
            let key = response.header(SEEN_KEY).unwrap();
            assert!(
                key.len() == 16 && key.chars().all(|c| c.is_ascii_hexdigit()),
                "{key}"
            );
            homes.entry(app).or_default().insert(shard.to_owned());
            if turn > 0
                && response
                    .header("x-sim-cached-tokens")
                    .is_some_and(|t| t != "0")
            {
                cached_repeats += 1;
            }
        }
    }
    // A shared system prompt keeps its replica, whose cache then holds it.
    for (app, shards) in &homes {
        assert_eq!(shards.len(), 1, "application {app} moved: {shards:?}");
    }
    assert!(
        cached_repeats >= 18,
        "{cached_repeats} of 20 repeats hit the cache"
    );
    eprintln!(
        "rehearsal: {} treated / {held_out} held out of 80 users; homes {homes:?}; {cached_repeats} of 20 repeats cached ({:?} since Envoy started)",
        treated.len(),
        started.elapsed()
    );

    // Knobs as shipped: a batcher that discovers its replicas has no front, so it says that
    // nothing warms or predicts, and the caller is told which knobs did nothing.
    let response = ask_with(
        &mut connection,
        0,
        7,
        &[
            ("x-cohort-session", &treated[0]),
            ("x-cohort-prefetch", "high"),
        ],
    );
    assert_eq!(response.status, 200);
    assert_eq!(
        response.header("x-cohort-ignored"),
        Some("prefetch,session"),
        "{:?}",
        response.header("x-cohort")
    );

    // Fail open: with every batcher shard gone, requests are still served, routed by key.
    for batcher in &mut batchers {
        batcher.kill9();
    }
    let mut by_key: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    for turn in 0..3 {
        for (app, session) in treated.iter().enumerate().take(4) {
            let response = ask(&mut connection, app, 10 + turn, session);
            assert_eq!(response.status, 200, "{}", response.text());
            let verdict = response.header("x-cohort").unwrap();
            assert!(
                verdict.contains("mode=affinity") && verdict.contains("fallback="),
                "{verdict}"
            );
            assert_eq!(
                response.header(SEEN_ENDPOINT).unwrap_or(""),
                "",
                "{verdict}"
            );
            by_key
                .entry(app)
                .or_default()
                .insert(response.header(SEEN_UPSTREAM).unwrap().to_owned());
        }
    }
    for (app, upstreams) in &by_key {
        assert_eq!(
            upstreams.len(),
            1,
            "application {app} by key: {upstreams:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
