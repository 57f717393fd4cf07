//! Engine discovery end to end, against a real DNS server: Debian's `dnsmasq`, started by
//! the test on a free loopback port and rewritten during it (the batcher and Envoy are
//! pointed at it; the machine's `/etc/resolv.conf` is never read or touched).
//!
//! Three recording engines listen on one port at 127.0.0.2, .3 and .4 (all loopback on
//! Linux), so the A records tell them apart. `cohort serve` learns them from the SRV
//! records `_http._tcp.llm-engine.cohort.test` (names `llm-engine-N`, the pods' stable
//! names); Envoy's `all-replicas` cluster resolves the same name through the same server
//! (STRICT_DNS), and its `override_host` policy sends each request to the
//! `x-gateway-destination-endpoint` the filter wrote from the batcher's answer (the policy
//! the Istio overlay's `cohort-engine-endpoint` EnvoyFilter patches in, as kustomize
//! renders it). Under
//! fewer than 50 requests/s for 60 s:
//!
//! - a replica that appears in DNS is probed, then receives requests, at the endpoint the
//!   batcher named (every request carrying the header reached the engine it names);
//! - a replica removed from DNS receives nothing new after one interval, and is stopped
//!   after the interval plus a drain;
//! - not one request fails;
//! - with the DNS server gone, the batcher keeps the last known set, says so on
//!   `cohort_discovery_stale`, and logs it once.
//!
//! And a DNS server that answers only malformed messages (garbage, a header promising
//! answers it lacks, control bytes in an SRV target, a compression loop, a record cut in
//! half) leaves the batcher serving, stale, with one log line.
//!
//! Needs `/usr/sbin/dnsmasq` (`scripts/setup`), Envoy, the built filter and the `cohort`
//! binary, like the other assign-mode tests.

use cohort_fingerprint::headers::HeaderNames;
use cohort_tests::batcher::{Batcher, BatcherSpec};
use cohort_tests::dns::{Dnsmasq, Pod};
use cohort_tests::envoy::Envoy;
use cohort_tests::load::{self, Plan};
use cohort_tests::manifests;
use cohort_tests::upstream::Upstream;
use cohort_tests::{config, eventually, free_port, stays, with_port_retries};
use serde_yaml::Value;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const SERVICE: &str = "llm-engine.cohort.test";
const CHAT: &str = "/v1/chat/completions";
const ENDPOINT: &str = "x-gateway-destination-endpoint";
/// The batcher's re-resolution interval in this test (`--discovery-interval-s`).
const INTERVAL: Duration = Duration::from_secs(2);
/// What a leaving replica is given after the interval before it is stopped: Envoy's own
/// DNS refresh (1 s) and the requests it still has in flight (50 ms each).
const DRAIN: Duration = Duration::from_secs(3);

/// The engine pods: stable name and loopback address.
const PODS: [(&str, [u8; 4]); 3] = [
    ("llm-engine-0", [127, 0, 0, 2]),
    ("llm-engine-1", [127, 0, 0, 3]),
    ("llm-engine-2", [127, 0, 0, 4]),
];

/// A dnsmasq serving [`SERVICE`]'s records for the pods at indexes `pods` of [`PODS`].
fn dnsmasq(engine_port: u16, pods: &[usize]) -> Dnsmasq {
    Dnsmasq::start(SERVICE, "http", engine_port, &pod_list(pods))
}

fn pod_list(pods: &[usize]) -> Vec<Pod<'static>> {
    pods.iter()
        .map(|&i| Pod {
            name: PODS[i].0,
            ip: PODS[i].1.into(),
        })
        .collect()
}

/// One `cohort serve` shard learning [`SERVICE`]'s replicas from the DNS server on loopback
/// `dns_port`, every `interval`.
fn discovering_batcher(dns_port: u16, interval: Duration) -> Batcher {
    Batcher::start(BatcherSpec {
        grpc_port: free_port(),
        http_port: free_port(),
        replicas: Vec::new(),
        shard_index: 0,
        shard_count: 1,
        front_port: None,
        picker_port: None,
        extra_args: vec![
            "--discovery-dns".into(),
            SERVICE.into(),
            "--discovery-resolver".into(),
            format!("127.0.0.1:{dns_port}"),
            "--discovery-interval-s".into(),
            interval.as_secs().to_string(),
        ],
    })
}

/// `istio/envoy/assign.yaml` for one batcher, with `all-replicas` following [`SERVICE`]
/// through the test's DNS server.
fn envoy_config(grpc_port: u16, dns_port: u16, engine_port: u16) -> Value {
    let mut yaml = Envoy::assign_config(
        &[grpc_port],
        &[],
        r#"{"mode": "assign", "assign_deadline_ms": 25, "batcher_clusters": ["cohort-batcher-0"]}"#,
    );
    let clusters = yaml["static_resources"]["clusters"]
        .as_sequence_mut()
        .unwrap();
    let all = clusters
        .iter_mut()
        .find(|c| c["name"].as_str() == Some("all-replicas"))
        .expect("assign.yaml has all-replicas");
    let dns: Value = serde_yaml::from_str(&format!(
        r#"
type: STRICT_DNS
dns_refresh_rate: 1s
respect_dns_ttl: false
dns_lookup_family: V4_ONLY
typed_dns_resolver_config:
  name: envoy.network.dns_resolver.cares
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.network.dns_resolver.cares.v3.CaresDnsResolverConfig
    resolvers: [{{ socket_address: {{ address: 127.0.0.1, port_value: {dns_port} }} }}]
    dns_resolver_options: {{ no_default_search_domain: true }}
load_assignment:
  cluster_name: all-replicas
  endpoints:
  - lb_endpoints:
    - endpoint: {{ address: {{ socket_address: {{ address: {SERVICE}, port_value: {engine_port} }} }} }}
"#
    ))
    .unwrap();
    for (key, value) in dns.as_mapping().unwrap() {
        all[key] = value.clone();
    }
    let standalone =
        override_host_header(&serde_json::to_value(&all["load_balancing_policy"]).unwrap());
    assert_eq!(
        standalone.as_deref(),
        Some(ENDPOINT),
        "assign.yaml's all-replicas"
    );
    // The policy the Istio overlay patches onto the engines' cluster, as kustomize renders
    // it: what runs here is what ships.
    all["load_balancing_policy"] = serde_yaml::to_value(istio_endpoint_policy()).unwrap();
    config::set_filter(
        &mut yaml,
        r#"{"mode": "assign", "assign_deadline_ms": 25, "batcher_clusters": ["cohort-batcher-0"]}"#,
    );
    yaml
}

/// The header an `override_host` load-balancing policy reads.
fn override_host_header(policy: &serde_json::Value) -> Option<String> {
    let first = &policy["policies"][0]["typed_extension_config"];
    (first["name"] == "envoy.load_balancing_policies.override_host").then(|| {
        first["typed_config"]["override_host_sources"][0]["header"]
            .as_str()
            .map(str::to_owned)
    })?
}

/// The `load_balancing_policy` of the assign overlay's `cohort-engine-endpoint`
/// EnvoyFilter, checked against the rest of the overlay: it patches the cluster of the
/// engines' Service (the one the base EnvoyFilter patches) and reads the filter's
/// endpoint header.
fn istio_endpoint_policy() -> serde_json::Value {
    let objects = manifests::render("assign");
    let patch = &manifests::find(&objects, "EnvoyFilter", "cohort-engine-endpoint")["spec"]
        ["configPatches"][0];
    assert_eq!(patch["applyTo"], "CLUSTER");
    let cluster_patches = |objects: &[serde_json::Value]| -> Vec<serde_json::Value> {
        manifests::find(objects, "EnvoyFilter", "cohort")["spec"]["configPatches"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["applyTo"] == "CLUSTER")
            .cloned()
            .collect()
    };
    // The base overlay's bounded-load patch names the engines' cluster; assign mode drops
    // it (Envoy refuses it beside a load_balancing_policy) and sets its own there.
    let base = cluster_patches(&manifests::render("base"));
    assert_eq!(
        base.len(),
        1,
        "the base EnvoyFilter patches the engines' cluster"
    );
    assert!(
        cluster_patches(&objects).is_empty(),
        "assign drops the base's cluster patch"
    );
    assert_eq!(patch["match"], base[0]["match"], "the same cluster");
    let policy = patch["patch"]["value"]["load_balancing_policy"].clone();
    assert_eq!(
        override_host_header(&policy).as_deref(),
        Some(HeaderNames::default().endpoint.as_str())
    );
    policy
}

/// Chat request `id`: one of a few applications (shared system prompts, which stay on
/// the replica that holds them), or every third one a cold prompt of its own (which any
/// replica serves as well as another, so a newcomer gets its share).
fn body(id: u64) -> Vec<u8> {
    let app = if id % 3 == 0 { id } else { id % 5 };
    serde_json::to_vec(&serde_json::json!({"model": "m", "messages": [
        {"role": "system", "content": format!("Assistant of application {app}. {}", "Be brief and cite sources. ".repeat(20))},
        {"role": "user", "content": format!("Question {id}: what changed in release {}?", id % 97)},
    ]}))
    .unwrap()
}

/// The load requests `engine` received (probes carry no load id), with their arrival.
fn load_requests(engine: &Upstream) -> Vec<(Instant, Option<String>)> {
    engine
        .received()
        .into_iter()
        .filter(|r| r.header(load::ID_HEADER).is_some())
        .map(|r| (r.at, r.header(ENDPOINT).map(str::to_owned)))
        .collect()
}

/// Requests that carried the endpoint header and reached another engine than the one it
/// names, outside the `changes` windows: (arrival, the header, the engine's endpoint).
fn misrouted(
    engines: &[(&Upstream, String)],
    changes: &[(Instant, Instant)],
) -> Vec<(Instant, String, String)> {
    let mut wrong = Vec::new();
    for (engine, own) in engines {
        for (at, header) in load_requests(engine) {
            let Some(header) = header else { continue };
            let in_change = changes.iter().any(|(from, to)| at >= *from && at <= *to);
            if header != *own && !in_change {
                wrong.push((at, header, own.clone()));
            }
        }
    }
    wrong
}

#[test]
fn replicas_join_and_leave_through_dns_with_no_failed_request() {
    // A light load (two clients, under 40 requests/s) for a minute, judged on outcomes and
    // windows of seconds: it holds no part of the machine and runs beside the other tests.
    // One port for every engine, each on its own loopback address.
    let mut engines: Vec<Upstream> = with_port_retries("engines", |_| {
        let port = free_port();
        PODS.iter()
            .map(|(name, ip)| Upstream::start_at(name, SocketAddr::from((*ip, port))))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())
    });
    let engine_port = engines[0].port;
    for engine in &engines {
        // Paced: 2 clients × (50 ms + overhead) stay under 50 requests/s.
        engine.set_delay(Duration::from_millis(50));
    }
    let endpoint = |i: usize| SocketAddr::from((PODS[i].1, engine_port)).to_string();
    let leaving = std::sync::Mutex::new(Some(engines.remove(1)));
    let (e0, e2) = (&engines[0], &engines[1]);

    let mut dns = dnsmasq(engine_port, &[0, 1]);
    let batcher = discovering_batcher(dns.port, INTERVAL);
    assert!(
        eventually(Duration::from_secs(10), || batcher
            .metric("cohort_discovery_replicas")
            == 2.0),
        "{}",
        batcher.log()
    );
    let envoy = Envoy::start(&envoy_config(batcher.spec.grpc_port, dns.port, engine_port));

    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let left = |f: &dyn Fn(&Upstream) -> bool| leaving.lock().unwrap().as_ref().is_some_and(f);
    let served = |engine: &Upstream, i: usize| {
        load_requests(engine)
            .iter()
            .any(|(_, e)| e.as_deref() == Some(endpoint(i).as_str()))
    };
    let (outcomes, joined_at, left_at) = std::thread::scope(|scope| {
        let load = scope.spawn(|| {
            load::run(
                &Plan {
                    port: envoy.listen_port,
                    path: CHAT,
                    clients: 2,
                    body: &body,
                    cap: Duration::from_secs(90),
                },
                &stop,
            )
        });
        assert!(
            eventually(Duration::from_secs(15), || served(e0, 0)
                && left(&|e| served(e, 1))),
            "both discovered replicas take assigned requests:\n{}",
            batcher.log()
        );
        assert!(load_requests(e2).is_empty(), "not in DNS yet");

        // A replica joins: it appears in DNS, is probed, then receives requests.
        std::thread::sleep(Duration::from_secs(10).saturating_sub(started.elapsed()));
        // From the moment the records start changing (Envoy may see them first).
        let joined_at = Instant::now();
        dns.serve(&pod_list(&[0, 1, 2])).unwrap();
        assert!(
            eventually(INTERVAL * 5, || served(e2, 2)),
            "the new replica receives requests at its endpoint:\n{}",
            batcher.log()
        );
        println!(
            "joined: first assigned request after {:?}",
            joined_at.elapsed()
        );
        let log = batcher.log();
        assert!(
            log.lines()
                .any(|l| l.contains("answered its first probe") && l.contains("llm-engine-2")),
            "{log}"
        );

        // A replica leaves: first out of DNS, then stopped after the interval and a drain.
        std::thread::sleep(Duration::from_secs(30).saturating_sub(started.elapsed()));
        let left_at = Instant::now();
        dns.serve(&pod_list(&[0, 2])).unwrap();
        // Deliberate window: the documented interval plus the drain, under load.
        std::thread::sleep(INTERVAL + DRAIN);
        let removed = leaving.lock().unwrap().take().expect("still running");
        let late = load_requests(&removed)
            .into_iter()
            .filter(|(t, _)| *t > left_at + INTERVAL + Duration::from_secs(1))
            .count();
        assert_eq!(
            late, 0,
            "requests reached the removed replica after the interval"
        );
        let before = load_requests(&removed).len();
        drop(removed);
        println!("left: {before} requests served by the removed replica, none after the interval");

        // Deliberate window: the load runs its 60 s.
        std::thread::sleep(Duration::from_secs(60).saturating_sub(started.elapsed()));
        stop.store(true, Ordering::Relaxed);
        (load.join().unwrap(), joined_at, left_at)
    });
    let elapsed = outcomes
        .last()
        .map(|o| o.started + o.latency - outcomes[0].started)
        .unwrap_or_default();
    let failed: Vec<_> = outcomes.iter().filter(|o| o.status != 200).collect();
    let rate = outcomes.len() as f64 / elapsed.as_secs_f64().max(1.0);
    println!(
        "{} requests in {elapsed:?} ({rate:.1}/s), {} failed",
        outcomes.len(),
        failed.len()
    );
    assert!(elapsed >= Duration::from_secs(59), "{elapsed:?}");
    assert!(rate < 50.0, "{rate}/s");
    assert!(
        failed.is_empty(),
        "failed: {:?}",
        &failed[..failed.len().min(5)]
    );
    // Envoy follows DNS at its own refresh (1 s), the batcher at its interval: for a moment
    // after each change one knows a replica the other does not (a request the batcher sent
    // to the newcomer, or to the leaver, is then routed by key). Outside those moments,
    // every request carrying the endpoint header reached the engine it names.
    let settle = INTERVAL + Duration::from_secs(2);
    let wrong = misrouted(
        &[(e0, endpoint(0)), (e2, endpoint(2))],
        &[(joined_at, joined_at + settle), (left_at, left_at + settle)],
    );
    let since = |t: &Instant| t.saturating_duration_since(started);
    assert!(
        wrong.is_empty(),
        "{:?}",
        wrong
            .iter()
            .map(|(t, h, e)| (since(t), h, e))
            .collect::<Vec<_>>()
    );
    assert!(
        load_requests(e2)
            .iter()
            .any(|(t, _)| *t > left_at + INTERVAL),
        "the remaining replicas keep serving"
    );

    // The DNS server goes away: the last known set stays in use, one log line says so.
    let log_before = batcher.log().len();
    dns.stop();
    assert!(
        eventually(INTERVAL * 5, || batcher.metric("cohort_discovery_stale")
            == 1.0),
        "{}",
        batcher.log()
    );
    assert!(batcher.metric("cohort_discovery_resolve_failures_total") >= 1.0);
    assert_eq!(batcher.metric("cohort_discovery_replicas"), 2.0);
    let chats = || {
        [e0, e2]
            .iter()
            .map(|e| e.received().iter().filter(|r| r.path == CHAT).count())
            .sum::<usize>()
    };
    let sent_before = chats();
    for id in 0..20u64 {
        let response =
            cohort_tests::client::post_json(envoy.listen_port, CHAT, &[], &body(10_000 + id));
        assert_eq!(response.status, 200, "{}", response.text());
    }
    assert_eq!(chats(), sent_before + 20, "the known replicas still serve");
    // The inspector's Replicas panel lists the discovered replicas by their pods' names,
    // at their endpoints, probed, with their share of the Assigns, first-byte times and
    // the blocks they were sent (the one that left is gone from it).
    let state =
        cohort_tests::client::request(batcher.spec.http_port, "GET", "/ui/api/state", &[], b"");
    let state: serde_json::Value = serde_json::from_slice(&state.unwrap().body).unwrap();
    let rows = state["replicas"].as_array().expect("a replicas array");
    let shown: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|r| {
            let field = |k: &str| r[k].as_str().unwrap_or_default();
            (field("name"), field("source"), field("endpoint"))
        })
        .collect();
    let (endpoint0, endpoint2) = (endpoint(0), endpoint(2));
    assert_eq!(
        shown,
        [
            ("llm-engine-0", "discovered", endpoint0.as_str()),
            ("llm-engine-2", "discovered", endpoint2.as_str()),
        ],
        "{state}"
    );
    for row in rows {
        assert_eq!(row["probe"]["up"], true, "{row}");
        assert!(row["share_60s"].as_f64().is_some_and(|s| s > 0.0), "{row}");
        assert!(row["ttft_ms"]["p50"].is_u64(), "{row}");
        assert!(
            row["blocks_resident"].as_u64().is_some_and(|b| b > 0),
            "{row}"
        );
        assert!(row["in_flight"].is_u64(), "{row}");
    }
    let stale_lines = || {
        batcher.log()[log_before..]
            .lines()
            .filter(|l| l.contains("keeping the last known set"))
            .count()
    };
    // Several failed resolutions, one line.
    assert!(
        stays(INTERVAL * 3, || stale_lines() <= 1) && stale_lines() == 1,
        "{}",
        &batcher.log()[log_before..]
    );
}

/// Answers to a DNS question (`query`) that no resolver should trust, one per call.
fn hostile_answer(query: &[u8], n: u64) -> Vec<u8> {
    let id = &query[..2];
    let question = &query[12..];
    let header = |answers: u16| {
        let mut h = id.to_vec();
        h.extend_from_slice(&[0x81, 0x80, 0, 1]);
        h.extend_from_slice(&answers.to_be_bytes());
        h.extend_from_slice(&[0, 0, 0, 0]);
        h
    };
    match n % 5 {
        // Bytes that are not a DNS message.
        0 => [id, &b"\xff\x00garbage"[..]].concat(),
        // A header that promises 65,535 answers and carries none.
        1 => [header(u16::MAX), question.to_vec()].concat(),
        // An SRV answer whose target is control bytes and markup.
        2 => {
            let mut m = [header(1), question.to_vec()].concat();
            let target = b"\x0a\r\nx<b>\x00evil\x04test\x00";
            m.extend_from_slice(&[0xc0, 0x0c, 0, 33, 0, 1, 0, 0, 0, 5]);
            m.extend_from_slice(&((6 + target.len()) as u16).to_be_bytes());
            m.extend_from_slice(&[0, 0, 0, 0, 0x1f, 0x40]);
            m.extend_from_slice(target);
            m
        }
        // A name that points at itself (a compression loop).
        3 => {
            let mut m = [header(1), question.to_vec()].concat();
            let at = m.len() as u16;
            m.extend_from_slice(&(0xc000 | at).to_be_bytes());
            m.extend_from_slice(&[
                0, 33, 0, 1, 0, 0, 0, 5, 0, 8, 0, 0, 0, 0, 0x1f, 0x40, 0xc0, 0x0c,
            ]);
            m
        }
        // An answer cut in the middle of a record.
        _ => {
            let mut m = [header(1), question.to_vec()].concat();
            m.extend_from_slice(&[0xc0, 0x0c, 0, 33, 0, 1, 0, 0]);
            m
        }
    }
}

#[test]
fn hostile_dns_answers_never_crash_the_batcher() {
    // A DNS server on loopback that answers every question with something malformed.
    let (socket, port) = with_port_retries("hostile dns", |_| {
        let port = free_port();
        std::net::UdpSocket::bind(("127.0.0.1", port))
            .map(|s| (s, port))
            .map_err(|e| e.to_string())
    });
    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut buf = [0u8; 1500];
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                if let Ok((len, from)) = socket.recv_from(&mut buf) {
                    if len > 12 {
                        let _ = socket.send_to(&hostile_answer(&buf[..len], n), from);
                        n += 1;
                    }
                }
            }
        });
        let batcher = discovering_batcher(port, Duration::from_secs(1));
        // Every kind of answer several times over, and the batcher still serves.
        let failures = || batcher.metric("cohort_discovery_resolve_failures_total");
        let answered = eventually(Duration::from_secs(30), || failures() >= 10.0);
        stop.store(true, Ordering::Relaxed);
        assert!(answered, "{}", batcher.log());
        let ready =
            cohort_tests::client::request(batcher.spec.http_port, "GET", "/readyz", &[], b"");
        assert_eq!(ready.map(|r| r.status).ok(), Some(200), "{}", batcher.log());
        assert_eq!(batcher.metric("cohort_discovery_stale"), 1.0);
        assert_eq!(batcher.metric("cohort_discovery_replicas"), 0.0);
        let log = batcher.log();
        assert!(!log.contains("panicked"), "{log}");
        assert_eq!(
            log.lines()
                .filter(|l| l.contains("keeping the last known set"))
                .count(),
            1,
            "one line for the change of state, not one per failure:\n{log}"
        );
    });
}
