//! The breaker as shipped: real Envoy with the real filter running the filter
//! configuration extracted from each rendered overlay (`kubectl kustomize istio/<overlay>`,
//! [`cohort_tests::manifests`]), under a stated load of many users, with faults injected in
//! Envoy itself.
//!
//! What the test adapts, and nothing else: the batcher clusters the overlay names (Istio's
//! `outbound|50051||cohort-batcher-<i>…` names) become the test's `cohort-batcher-<i>`
//! clusters on the real `cohort serve` shards it starts (batch mode: one shard, as the
//! stack's front takes one); the engines are recording upstreams that answer after 200 ms
//! (a time to first token; the batch front's hold window must not read as a latency fault
//! against a sub-millisecond upstream). The rollout and breaker values are the overlay's.
//!
//! Faults: Envoy fault filters after the Cohort filter answer 503 to a runtime-set
//! percentage of requests: one only to requests Cohort routed (they carry `x-cohort-key`;
//! held-out and bypassed requests do not), the other to every request; a third delays
//! Cohort's requests. Each run, per overlay:
//!
//! 1. healthy load: the breaker stays closed, both groups are served;
//! 2. **Cohort's requests fail 2%** (the hold-out's do not): the breaker opens within its
//!    window (the evidence gathered in `window_s`, and a fold), and from then on every
//!    request takes the traditional path and succeeds. With a 5% hold-out it is usually
//!    the absolute rule that has the evidence first (docs/FILTER.md); the test prints
//!    which rule tripped;
//! 3. **recovery**: the fault heals; the breaker stays open for its cool-down, probes, and
//!    closes; Cohort routes again;
//! 4. **every request fails 2%**: the relative rule stays closed (the hold-out fails as
//!    much), and the absolute rule opens the breaker.
//!
//! And in a run of its own per overlay, **Cohort's requests turn 4× slower** than the
//! hold-out's: the relative rule opens the breaker.
//!
//! The overlays run side by side, each on its own stack (600 requests/s in all): the
//! breaker's windows and cool-down are the shipped ones, so one overlay's run takes about a
//! minute, and three in turn would take three.
//!
//! Load: 2,000 session ids (`x-cohort-session`, the shipped rollout key) from 64 clients,
//! each sending one request every 320 ms: 200 requests/s offered, so the 5% hold-out gets
//! some 100 requests in the 10 s window (`min_requests` is 20).

use cohort_tests::client::verdict;
use cohort_tests::client::Connection;
use cohort_tests::config::set_endpoints;
use cohort_tests::manifests;
use cohort_tests::stack::{Stack, StackBuilder};
use serde_json::{json, Value};
use serde_yaml::Value as Yaml;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const CHAT: &str = "/v1/chat/completions";
const SESSIONS: usize = 2_000;
const CLIENTS: usize = 64;
const PACE: Duration = Duration::from_millis(320);
const ENGINE_DELAY: Duration = Duration::from_millis(200);
/// How long after the state gauge flips every worker acts on it (two folds, with room for
/// late ticks on a loaded machine).
const SETTLE: Duration = Duration::from_millis(1200);
/// A fold of the breaker (0.5 s) and its tick, with room for late ticks.
const FOLD: Duration = Duration::from_secs(2);
/// The runtime keys of the fault filters: 503s to Cohort's requests, 503s to every
/// request, a delay of Cohort's requests.
const FAULT_ROUTED: &str = "test.fault.routed.abort_percent";
const FAULT_ALL: &str = "test.fault.all.abort_percent";
const DELAY_ROUTED: &str = "test.fault.routed.delay_percent";
/// The delay: 200 ms answers become 800 ms ones, 4× the hold-out's.
const DELAY: &str = "0.6s";

/// The filter configuration the overlay ships, as rendered by kustomize.
fn shipped(overlay: &str) -> Value {
    serde_json::from_str(&manifests::filter_config(&manifests::render(overlay)))
        .expect("the shipped filter configuration is JSON")
}

/// An Envoy fault filter answering 503 to the runtime key's percentage of requests (those
/// with `header`, if given).
fn fault_filter(name: &str, runtime_key: &str, header: Option<&str>) -> Yaml {
    let headers = header.map_or(String::new(), |h| {
        format!(", headers: [{{name: {h}, present_match: true}}]")
    });
    serde_yaml::from_str(&format!(
        "{{name: {name}, typed_config: {{'@type': type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault, \
         abort: {{http_status: 503, percentage: {{numerator: 0, denominator: HUNDRED}}}}, \
         abort_percent_runtime: {runtime_key}{headers}}}}}"
    ))
    .unwrap()
}

/// An Envoy fault filter delaying the runtime key's percentage of the requests with
/// `header` by [`DELAY`].
fn delay_filter(name: &str, runtime_key: &str, header: &str) -> Yaml {
    serde_yaml::from_str(&format!(
        "{{name: {name}, typed_config: {{'@type': type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault, \
         delay: {{fixed_delay: {DELAY}, percentage: {{numerator: 0, denominator: HUNDRED}}}}, \
         delay_percent_runtime: {runtime_key}, headers: [{{name: {header}, present_match: true}}]}}}}"
    ))
    .unwrap()
}

/// Inserts the fault filters before the router, and a runtime the admin API can set.
fn with_faults(yaml: &mut Yaml) {
    let filters = yaml["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]["http_filters"]
        .as_sequence_mut()
        .unwrap();
    let router = filters
        .iter()
        .position(|f| f["name"].as_str() == Some("envoy.filters.http.router"))
        .expect("a router");
    filters.insert(router, fault_filter("fault-all", FAULT_ALL, None));
    filters.insert(
        router,
        fault_filter("fault-routed", FAULT_ROUTED, Some("x-cohort-key")),
    );
    filters.insert(
        router,
        delay_filter("delay-routed", DELAY_ROUTED, "x-cohort-key"),
    );
    yaml["layered_runtime"] =
        serde_yaml::from_str("{layers: [{name: admin, admin_layer: {}}]}").unwrap();
}

/// The stack for `overlay`'s shipped filter configuration.
fn stack(overlay: &str) -> (Stack, Value) {
    let config = shipped(overlay);
    let builder: StackBuilder = match config["mode"].as_str() {
        Some("affinity") => Stack::plain("affinity")
            .envoy_config(|yaml, ports| set_endpoints(yaml, "engines", ports)),
        Some("assign") => {
            let shards = config["batcher_clusters"].as_array().map_or(1, Vec::len);
            Stack::assign().shards(shards)
        }
        Some("batch") => Stack::batch(),
        other => panic!("{overlay}: mode {other:?}"),
    };
    let stack = builder
        .counting(3, "x-load-id")
        .filter(config.clone())
        .envoy_config(|yaml, _| with_faults(yaml))
        .start();
    for engine in stack.upstreams() {
        engine.set_delay(ENGINE_DELAY);
    }
    (stack, config)
}

/// Sets a fault percentage through Envoy's admin runtime.
fn set_fault(stack: &Stack, key: &str, percent: u32) {
    let path = format!("/runtime_modify?{key}={percent}");
    let response =
        cohort_tests::client::request(stack.envoy.admin_port, "POST", &path, &[], b"").unwrap();
    assert_eq!(response.status, 200, "{}", response.text());
}

/// One request's fate.
struct Sent {
    at: Duration,
    status: u16,
    verdict: String,
}

/// The breaker's counters and state.
fn stat(stack: &Stack, name: &str) -> u64 {
    stack.envoy.stat(&format!("wasmcustom.cohort_{name}"))
}

/// Sends the paced load until `driver` returns; returns every request's fate.
fn under_load(stack: &Stack, driver: impl FnOnce(Instant)) -> Vec<Sent> {
    let stop = AtomicBool::new(false);
    let sent = Mutex::new(Vec::new());
    let start = Instant::now();
    let port = stack.port();
    std::thread::scope(|scope| {
        for client in 0..CLIENTS {
            let (stop, sent) = (&stop, &sent);
            scope.spawn(move || {
                let mut connection = Connection::new(port);
                let mut mine = Vec::new();
                let mut next = start + PACE.mul_f64(client as f64 / CLIENTS as f64);
                let mut n = client;
                while !stop.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(120)
                {
                    if let Some(wait) = next.checked_duration_since(Instant::now()) {
                        // Deliberate pacing: one request every PACE per client.
                        std::thread::sleep(wait);
                    }
                    next += PACE;
                    let session = format!("session-{}", n % SESSIONS);
                    let id = n.to_string();
                    n += CLIENTS;
                    let body = serde_json::to_vec(&json!({
                        "model": "m",
                        "messages": [{"role": "user", "content": format!("where is my order {}", n % 97)}],
                    }))
                    .unwrap();
                    let at = start.elapsed();
                    let headers = [("x-cohort-session", session.as_str()), ("x-load-id", &id)];
                    let (status, verdict) = match connection.post_json(CHAT, &headers, &body) {
                        Ok(r) => (r.status, verdict(r.header("x-cohort"))),
                        Err(_) => (0, "no answer".to_owned()),
                    };
                    mine.push(Sent {
                        at,
                        status,
                        verdict,
                    });
                }
                sent.lock().unwrap().extend(mine);
            });
        }
        driver(start);
        stop.store(true, Ordering::Relaxed);
    });
    let mut sent = sent.into_inner().unwrap();
    sent.sort_by_key(|s| s.at);
    sent
}

/// Waits until the breaker's state gauge reads `want` (0 closed, 1 open, 2 half-open).
fn wait_state(stack: &Stack, want: u64, within: Duration) -> bool {
    cohort_tests::eventually(within, || stat(stack, "breaker_state") == want)
}

fn between(sent: &[Sent], from: Duration, to: Duration) -> Vec<&Sent> {
    sent.iter().filter(|s| s.at >= from && s.at < to).collect()
}

/// Requests per verdict and their 5xx.
fn summary(sent: &[&Sent]) -> String {
    let mut counts = std::collections::BTreeMap::<&str, (usize, usize)>::new();
    for s in sent {
        let entry = counts.entry(s.verdict.as_str()).or_default();
        entry.0 += 1;
        entry.1 += usize::from(s.status != 200);
    }
    format!("{counts:?} (requests, failed)")
}

fn the_shipped_breaker_trips_and_recovers(overlay: &str) {
    let (stack, config) = stack(overlay);
    let breaker = &config["breaker"];
    let window = Duration::from_secs(breaker["window_s"].as_u64().unwrap());
    let cool_down = Duration::from_secs(breaker["cool_down_s"].as_u64().unwrap());
    let probe = Duration::from_secs(breaker["probe_s"].as_u64().unwrap());
    assert_eq!(
        config["rollout"]["share"], 0.95,
        "{overlay} ships a 5% hold-out"
    );
    assert_eq!(breaker["absolute_enabled"], true, "{overlay}");

    let mut marks = std::collections::BTreeMap::new();
    let mut relative_trip = (0, 0);
    let sent = under_load(&stack, |start| {
        // Deliberate window of healthy load: 3 s.
        std::thread::sleep(Duration::from_secs(3));
        assert_eq!(
            stat(&stack, "breaker_state"),
            0,
            "{overlay}: healthy and closed"
        );
        marks.insert("fault_routed", start.elapsed());
        set_fault(&stack, FAULT_ROUTED, 2);
        assert!(
            wait_state(&stack, 1, window + FOLD),
            "{overlay}: not open within {window:?} (and a fold) of Cohort's requests failing 2%"
        );
        marks.insert("open", start.elapsed());
        relative_trip = (
            stat(&stack, "breaker_trips_relative_total"),
            stat(&stack, "breaker_trips_absolute_total"),
        );
        // Deliberate window: the open breaker under load, 3 s.
        std::thread::sleep(Duration::from_secs(3));
        set_fault(&stack, FAULT_ROUTED, 0);
        marks.insert("healed", start.elapsed());
        assert!(
            wait_state(&stack, 0, cool_down + probe + Duration::from_secs(6)),
            "{overlay}: not closed after the cool-down and the probes"
        );
        marks.insert("closed", start.elapsed());
        // Deliberate window: closed again under load, 3 s.
        std::thread::sleep(Duration::from_secs(3));
        marks.insert("fault_all", start.elapsed());
        set_fault(&stack, FAULT_ALL, 2);
        assert!(
            wait_state(&stack, 1, window + FOLD),
            "{overlay}: not open within {window:?} (and a fold) of every request failing 2%"
        );
        marks.insert("open_again", start.elapsed());
        set_fault(&stack, FAULT_ALL, 0);
    });
    let rate = sent.len() as f64 / sent.last().map_or(1.0, |s| s.at.as_secs_f64());
    println!(
        "{overlay}: {} requests, {rate:.0}/s; marks {marks:?}",
        sent.len()
    );
    let (fault, open) = (marks["fault_routed"], marks["open"]);
    let (healed, closed) = (marks["healed"], marks["closed"]);
    let (fault_all, open_again) = (marks["fault_all"], marks["open_again"]);
    println!(
        "{overlay}: Cohort's requests failing 2% -> open {:.2} s (trips relative/absolute {relative_trip:?}); \
         open -> closed {:.2} s; every request failing 2% -> open {:.2} s",
        (open - fault).as_secs_f64(),
        (closed - open).as_secs_f64(),
        (open_again - fault_all).as_secs_f64()
    );
    for (phase, from, to) in [
        ("healthy", Duration::ZERO, fault),
        ("cohort fault", fault, open),
        ("open", open, healed),
        ("healed", healed, closed),
        ("closed", closed, fault_all),
        ("every request failing", fault_all, open_again),
    ] {
        println!("{overlay}: {phase}: {}", summary(&between(&sent, from, to)));
    }

    // Healthy: both groups served, and the hold-out is large enough to be judged.
    // (A request started just before the fault may meet it.)
    let healthy = between(&sent, Duration::ZERO, fault - Duration::from_millis(100));
    assert!(healthy.iter().all(|s| s.status == 200), "{overlay}");
    let held_out = healthy.iter().filter(|s| s.verdict == "holdout").count();
    let routed = healthy.iter().filter(|s| s.verdict == "routed").count();
    assert!(
        routed > 10 * held_out && held_out > 0,
        "{overlay}: {routed} / {held_out}"
    );
    let per_window = held_out as f64 * window.as_secs_f64() / fault.as_secs_f64();
    let min_requests = breaker["min_requests"].as_u64().unwrap() as f64;
    assert!(
        per_window >= 2.0 * min_requests,
        "{overlay}: hold-out {per_window:.0} per window"
    );

    // Open: once every worker read the state, every request takes the traditional path.
    let while_open = between(&sent, open + SETTLE, healed);
    assert!(!while_open.is_empty(), "{overlay}");
    for s in &while_open {
        assert_eq!(s.status, 200, "{overlay} at {:?}: {}", s.at, s.verdict);
        assert!(
            s.verdict == "breaker_open" || s.verdict == "holdout",
            "{overlay} at {:?}: {}",
            s.at,
            s.verdict
        );
    }
    assert_eq!(relative_trip.0 + relative_trip.1, 1, "{overlay}: one trip");

    // Recovery: open for the cool-down, then probes, then closed and routing again.
    assert!(
        closed - open >= cool_down,
        "{overlay}: closed before the cool-down"
    );
    let after = between(&sent, closed + SETTLE, fault_all);
    assert!(after.iter().any(|s| s.verdict == "routed"), "{overlay}");
    let failed: Vec<_> = after
        .iter()
        .filter(|s| s.status != 200)
        .map(|s| (s.at, s.status, &s.verdict))
        .collect();
    assert!(failed.is_empty(), "{overlay}: after closing, {failed:?}");

    // Every request failing: the absolute rule, not the relative one, opened it.
    assert_eq!(
        stat(&stack, "breaker_trips_relative_total"),
        relative_trip.0,
        "{overlay}: the relative rule tripped although the hold-out failed as much"
    );
    assert_eq!(
        stat(&stack, "breaker_trips_absolute_total"),
        relative_trip.1 + 1,
        "{overlay}"
    );
    assert_eq!(stat(&stack, "breaker_trips_total"), 2, "{overlay}");
    // (The hold-out's own 5xx are by chance: some 45 requests at 2%, none 40% of the time.)
    assert!(
        stack
            .envoy
            .series_sum("cohort_responses_total", &[("cohort_group", "holdout")])
            > 0.0,
        "{overlay}"
    );
}

/// Cohort's requests turn 4× slower than the hold-out's (a delay of 600 ms on 200 ms
/// answers): the relative rule, the one that compares with the hold-out, opens the breaker.
fn the_shipped_relative_rule_opens_on_cohort_latency(overlay: &str) {
    let (stack, config) = stack(overlay);
    let window = Duration::from_secs(config["breaker"]["window_s"].as_u64().unwrap());
    let mut marks = std::collections::BTreeMap::new();
    let sent = under_load(&stack, |start| {
        // Deliberate window of healthy load: 3 s.
        std::thread::sleep(Duration::from_secs(3));
        assert_eq!(
            stat(&stack, "breaker_state"),
            0,
            "{overlay}: healthy and closed"
        );
        marks.insert("slow", start.elapsed());
        set_fault(&stack, DELAY_ROUTED, 100);
        assert!(
            wait_state(&stack, 1, window + FOLD),
            "{overlay}: not open within {window:?} (and a fold) of Cohort's requests turning 4x slower"
        );
        marks.insert("open", start.elapsed());
        set_fault(&stack, DELAY_ROUTED, 0);
    });
    let (slow, open) = (marks["slow"], marks["open"]);
    println!(
        "{overlay}: Cohort's requests 4x slower -> open {:.2} s; slow phase {}",
        (open - slow).as_secs_f64(),
        summary(&between(&sent, slow, open))
    );
    assert!(
        sent.iter().all(|s| s.status == 200),
        "{overlay}: slow, never failed"
    );
    assert_eq!(stat(&stack, "breaker_trips_relative_total"), 1, "{overlay}");
    assert_eq!(stat(&stack, "breaker_trips_absolute_total"), 0, "{overlay}");
}

/// Runs `scenario` on every overlay at once, each on its own stack (200 requests/s each):
/// the three runs take the time of one, and a panic names its overlay.
fn on_every_overlay(scenario: fn(&str)) {
    std::thread::scope(|scope| {
        for overlay in manifests::MODE_OVERLAYS {
            scope.spawn(move || scenario(overlay));
        }
    });
}

#[test]
fn the_relative_rule_opens_on_cohort_latency_in_every_overlay() {
    // The latency rule under test: alone on the machine.
    let _machine = cohort_tests::one_at_a_time();
    on_every_overlay(the_shipped_relative_rule_opens_on_cohort_latency);
}

#[test]
fn the_breaker_trips_by_each_rule_and_recovers_in_every_overlay() {
    // A minute of the shipped windows under load, judged on 5xx and state: beside the other
    // long load tests, never beside one that holds the machine alone.
    let _machine = cohort_tests::under_load_together();
    assert_eq!(
        manifests::filter_config(&manifests::render("gpu")),
        manifests::filter_config(&manifests::render("assign")),
        "the gpu overlay ships the assign overlay's filter configuration"
    );
    on_every_overlay(the_shipped_breaker_trips_and_recovers);
}
