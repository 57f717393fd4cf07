//! Staged rollout and the automatic breaker, end to end: real Envoy with the real filter
//! (`istio/envoy/affinity.yaml`) in front of recording upstreams.
//!
//! - Rollout: with `rollout.share` 0.05, 5% ± 1% of 10,000 requests (2,000 users) are
//!   fingerprinted, each user always lands in the same group, and a held-out request
//!   reaches the upstream exactly as sent (body and headers; only Envoy's own headers are
//!   added, as without the filter).
//! - Breaker: Cohort-routed requests (they carry `x-cohort-key`) go to one upstream, the
//!   rest (the hold-out, and everything while the breaker is open) to another. The first
//!   starts failing (5xx), or turns 5× slower; the breaker opens, requests stop going
//!   through Cohort, and once the fault clears it probes and closes. Each test prints its
//!   timeline: requests, errors and the breaker state per half second.

use cohort_tests::client::verdict;
use cohort_tests::client::Connection;
use cohort_tests::config::{self, set_endpoints, set_filter};
use cohort_tests::envoy::Envoy;
use cohort_tests::eventually;
use cohort_tests::upstream::Upstream;
use serde_json::json;
use serde_yaml::Value;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const CHAT: &str = "/v1/chat/completions";

/// Labels of the per-group response stats.
const ROUTED: (&str, &str) = ("cohort_group", "routed");
const HELD_OUT: (&str, &str) = ("cohort_group", "holdout");
const FAILED: (&str, &str) = ("cohort_status", "5xx");

fn chat(user: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "model": "gemma-3-270m",
        "messages": [{"role": "user", "content": user}],
    }))
    .unwrap()
}

#[test]
fn a_share_of_users_is_routed_and_the_hold_out_reaches_the_upstream_as_sent() {
    let ups: Vec<Upstream> = (0..2).map(|i| Upstream::start(&format!("u{i}"))).collect();
    let mut config = config::load("affinity");
    set_endpoints(&mut config, "engines", &[ups[0].port, ups[1].port]);
    set_filter(
        &mut config,
        r#"{"mode":"affinity","rollout":{"share":0.05,"key_header":"x-user-id"}}"#,
    );
    let envoy = Envoy::start(&config);
    let listen = envoy.listen_port;

    const USERS: usize = 2_000;
    const PER_USER: usize = 5;
    const CLIENTS: usize = 4;
    let groups: Mutex<BTreeMap<usize, Vec<String>>> = Mutex::new(BTreeMap::new());
    std::thread::scope(|scope| {
        for client in 0..CLIENTS {
            let groups = &groups;
            scope.spawn(move || {
                let mut connection = Connection::new(listen);
                let mut mine: Vec<(usize, String)> = Vec::new();
                for n in (client..USERS * PER_USER).step_by(CLIENTS) {
                    let user = n % USERS;
                    let (user_id, test_id) = (format!("user-{user}"), n.to_string());
                    let response = connection
                        .post_json(
                            CHAT,
                            &[("x-user-id", &user_id), ("x-test-id", &test_id)],
                            &chat(&format!("please refund order {n}")),
                        )
                        .expect("request completes");
                    assert_eq!(response.status, 200, "{}", response.text());
                    mine.push((user, verdict(response.header("x-cohort"))));
                }
                let mut groups = groups.lock().unwrap();
                for (user, verdict) in mine {
                    groups.entry(user).or_default().push(verdict);
                }
            });
        }
    });
    let groups = groups.into_inner().unwrap();
    let total = USERS * PER_USER;
    let mut routed = 0;
    for (user, verdicts) in &groups {
        assert_eq!(verdicts.len(), PER_USER);
        assert!(
            verdicts.iter().all(|v| v == &verdicts[0]),
            "user {user} changed groups: {verdicts:?}"
        );
        match verdicts[0].as_str() {
            "routed" => routed += PER_USER,
            "holdout" => {}
            other => panic!("user {user}: {other}"),
        }
    }
    let share = routed as f64 / total as f64;
    println!("rollout share 0.05: {routed} of {total} requests routed ({share:.4})");
    assert!((0.04..=0.06).contains(&share), "{share}");
    assert_eq!(
        envoy.stat("wasmcustom.cohort_fingerprinted_total"),
        routed as u64
    );
    assert_eq!(
        envoy.stat("wasmcustom.cohort_bypass_holdout_total"),
        (total - routed) as u64
    );

    // What the upstreams got: the hold-out exactly as sent.
    let received: Vec<_> = ups.iter().flat_map(Upstream::received).collect();
    assert_eq!(received.len(), total);
    let envoys_own = |name: &str| {
        name.starts_with("x-envoy-") || name.starts_with("x-forwarded-") || name == "x-request-id"
    };
    let mut held_out = 0;
    for got in &received {
        let n: usize = got.header("x-test-id").unwrap().parse().unwrap();
        let user = n % USERS;
        let is_routed = groups[&user][0] == "routed";
        assert_eq!(
            got.header("x-cohort-key").is_some(),
            is_routed,
            "request {n}"
        );
        if is_routed {
            continue;
        }
        held_out += 1;
        assert_eq!(
            got.body,
            chat(&format!("please refund order {n}")),
            "request {n}"
        );
        let body_len = got.body.len().to_string();
        let sent = [
            ("host", "cohort.test"),
            ("content-type", "application/json"),
            ("content-length", body_len.as_str()),
            ("x-user-id", &format!("user-{user}")),
            ("x-test-id", &n.to_string()),
        ];
        for (name, value) in sent {
            assert_eq!(got.header(name), Some(value), "request {n}: {name}");
        }
        let added: Vec<&str> = got
            .headers
            .iter()
            .map(|(name, _)| name.as_str())
            .filter(|name| !sent.iter().any(|(s, _)| s == name) && !envoys_own(name))
            .collect();
        assert!(added.is_empty(), "request {n}: added {added:?}");
    }
    assert_eq!(held_out, total - routed);
}

/// Envoy over two upstreams: requests Cohort routed (they carry `x-cohort-key`) go to
/// `routed`, everything else to `direct`.
fn split_stack(routed: &Upstream, direct: &Upstream, plugin: &str) -> Envoy {
    let mut config = config::load("affinity");
    let clusters = config["static_resources"]["clusters"]
        .as_sequence_mut()
        .unwrap();
    let mut other = clusters[0].clone();
    other["name"] = Value::from("direct");
    other["load_assignment"]["cluster_name"] = Value::from("direct");
    clusters.push(other);
    for cluster in clusters.iter_mut() {
        // A failing upstream must keep answering: no ejection, no retries on 5xx here.
        if let Value::Mapping(map) = cluster {
            map.remove("outlier_detection");
        }
    }
    set_endpoints(&mut config, "engines", &[routed.port]);
    set_endpoints(&mut config, "direct", &[direct.port]);
    let routes = &mut config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]["route_config"]["virtual_hosts"][0]["routes"];
    let by_key = routes[0].clone();
    let mut cohort = by_key.clone();
    cohort["match"] =
        serde_yaml::from_str("{prefix: /, headers: [{name: x-cohort-key, present_match: true}]}")
            .unwrap();
    let mut rest = by_key;
    rest["route"]["cluster"] = Value::from("direct");
    *routes = Value::Sequence(vec![cohort, rest]);
    set_filter(&mut config, plugin);
    config["stats_flush_interval"] = Value::from("1s");
    Envoy::start(&config)
}

/// One request's fate in a breaker run.
struct Sent {
    at: Duration,
    status: u16,
    verdict: String,
}

/// Sends requests from `clients` threads (users cycling) until `stop`, while `driver`
/// runs the scenario on this thread; returns what was sent and the sampled states.
fn run_scenario(
    envoy: &Envoy,
    clients: usize,
    driver: impl FnOnce(Instant, &dyn Fn() -> u64),
) -> (Vec<Sent>, Vec<(Duration, u64)>) {
    let stop = AtomicBool::new(false);
    let sent = Mutex::new(Vec::new());
    let states = Mutex::new(Vec::new());
    let start = Instant::now();
    let port = envoy.listen_port;
    std::thread::scope(|scope| {
        for client in 0..clients {
            let (stop, sent) = (&stop, &sent);
            scope.spawn(move || {
                let mut connection = Connection::new(port);
                let mut mine = Vec::new();
                let mut n = client;
                while !stop.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(60) {
                    let user = format!("user-{}", n % 400);
                    n += clients;
                    let at = start.elapsed();
                    let (status, verdict) = match connection.post_json(
                        CHAT,
                        &[("x-user-id", &user)],
                        &chat("where is my refund"),
                    ) {
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
        let (stop, states) = (&stop, &states);
        scope.spawn(move || {
            while !stop.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(60) {
                let state = envoy.stat("wasmcustom.cohort_breaker_state");
                states.lock().unwrap().push((start.elapsed(), state));
                // Deliberate window: the state is sampled every 100 ms for the timeline.
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let state = || envoy.stat("wasmcustom.cohort_breaker_state");
        driver(start, &state);
        stop.store(true, Ordering::Relaxed);
    });
    let mut sent = sent.into_inner().unwrap();
    sent.sort_by_key(|s| s.at);
    (sent, states.into_inner().unwrap())
}

/// Prints requests, errors, verdicts and the breaker state per half second.
fn print_timeline(sent: &[Sent], states: &[(Duration, u64)]) {
    println!("| t (s) | requests | 5xx | routed | holdout | breaker_open | state |");
    println!("|---|---|---|---|---|---|---|");
    let end = sent.last().map_or(0, |s| s.at.as_millis() / 500);
    for slot in 0..=end {
        let here: Vec<&Sent> = sent
            .iter()
            .filter(|s| s.at.as_millis() / 500 == slot)
            .collect();
        let count = |v: &str| here.iter().filter(|s| s.verdict == v).count();
        let state = states
            .iter()
            .rev()
            .find(|(t, _)| t.as_millis() / 500 <= slot)
            .map_or(0, |(_, s)| *s);
        println!(
            "| {:.1} | {} | {} | {} | {} | {} | {} |",
            slot as f64 / 2.0,
            here.len(),
            here.iter()
                .filter(|s| s.status >= 500 || s.status == 0)
                .count(),
            count("routed"),
            count("holdout"),
            count("breaker_open"),
            ["closed", "open", "half-open"][state.min(2) as usize],
        );
    }
}

/// Waits until the breaker's state gauge reads `want`; returns when, or panics.
fn wait_state(state: &dyn Fn() -> u64, want: u64, within: Duration) -> Instant {
    assert!(
        cohort_tests::eventually(within, || state() == want),
        "breaker never reached state {want}"
    );
    Instant::now()
}

const BREAKER: &str = r#"{"mode":"affinity",
    "rollout":{"share":0.5,"key_header":"x-user-id"},
    "breaker":{"window_s":3,"min_requests":20,"cool_down_s":3,"probe_share":0.5,"probe_s":2}}"#;

/// How long after the breaker's state gauge flips every worker acts on it: two folds. The
/// cool-down (3 s) is longer than the open phase the scenarios hold (2 s), so no half-open
/// probe falls inside it.
const SETTLE: Duration = Duration::from_millis(1200);

#[test]
fn the_breaker_opens_on_cohort_errors_and_closes_after_recovery() {
    let _serial = cohort_tests::one_at_a_time();
    let (routed, direct) = (Upstream::start("routed"), Upstream::start("direct"));
    let envoy = split_stack(&routed, &direct, BREAKER);
    let mut marks = BTreeMap::new();
    let (sent, states) = run_scenario(&envoy, 3, |start, state| {
        // Deliberate windows of load: 2 s healthy, 2 s open, 2 s closed again.
        std::thread::sleep(Duration::from_secs(2));
        routed.set_status(503);
        marks.insert("fault", start.elapsed());
        let opened = wait_state(state, 1, Duration::from_secs(10));
        marks.insert("open", opened - start);
        std::thread::sleep(Duration::from_secs(2));
        routed.set_status(200);
        marks.insert("recovered", start.elapsed());
        let closed = wait_state(state, 0, Duration::from_secs(15));
        marks.insert("closed", closed - start);
        std::thread::sleep(Duration::from_secs(2));
    });
    print_timeline(&sent, &states);
    println!("marks: {marks:?}");
    let (fault, open) = (marks["fault"], marks["open"]);
    let (recovered, closed) = (marks["recovered"], marks["closed"]);
    println!(
        "fault to open: {:.2} s; recovery to closed: {:.2} s",
        (open - fault).as_secs_f64(),
        (closed - recovered).as_secs_f64()
    );
    // Healthy at first: both groups, no errors.
    // (A request started just before the fault may be answered after it.)
    let before: Vec<&Sent> = sent
        .iter()
        .filter(|s| s.at + Duration::from_millis(100) < fault)
        .collect();
    assert!(before.iter().all(|s| s.status == 200));
    assert!(before.iter().any(|s| s.verdict == "routed"));
    assert!(before.iter().any(|s| s.verdict == "holdout"));
    // It opens within a window and a fold of the fault.
    assert!(open - fault < Duration::from_secs(5), "{:?}", open - fault);
    // Once every worker has read the state, nothing fails through Cohort: every request
    // bypasses and the direct upstream answers. A worker reads it at its next fold, at
    // most BREAKER_SYNC (0.5 s) plus a 100 ms tick after the gauge flipped; on a loaded
    // machine ticks run late, so allow twice that.
    let settled = open + SETTLE;
    let while_open: Vec<&Sent> = sent
        .iter()
        .filter(|s| s.at >= settled && s.at < recovered)
        .collect();
    assert!(!while_open.is_empty());
    for s in &while_open {
        assert_eq!(s.status, 200, "at {:?}: {}", s.at, s.verdict);
        assert_ne!(s.verdict, "routed", "at {:?}", s.at);
    }
    // It closes after the cool-down and the probes, and Cohort routes again.
    assert!(closed > recovered);
    let after: Vec<&Sent> = sent.iter().filter(|s| s.at >= closed + SETTLE).collect();
    assert!(after.iter().any(|s| s.verdict == "routed"));
    assert!(after.iter().all(|s| s.status == 200));
    assert!(envoy.stat("wasmcustom.cohort_breaker_trips_total") >= 1);
    // Every Cohort request failing against a clean hold-out: the relative rule.
    assert!(envoy.stat("wasmcustom.cohort_breaker_trips_relative_total") >= 1);
    assert!(envoy.series_sum("cohort_responses_total", &[ROUTED, FAILED]) > 0.0);
    assert_eq!(
        envoy.series_sum("cohort_responses_total", &[HELD_OUT, FAILED]),
        0.0
    );
    assert!(envoy.stat("wasmcustom.cohort_bypass_breaker_open_total") > 0);
}

#[test]
fn the_breaker_opens_when_cohort_traffic_turns_five_times_slower() {
    let _serial = cohort_tests::one_at_a_time();
    let (routed, direct) = (Upstream::start("routed"), Upstream::start("direct"));
    routed.set_delay(Duration::from_millis(20));
    direct.set_delay(Duration::from_millis(20));
    let envoy = split_stack(&routed, &direct, BREAKER);
    let mut marks = BTreeMap::new();
    let (sent, states) = run_scenario(&envoy, 4, |start, state| {
        // Deliberate windows of load: 2 s healthy and equal, 2 s open.
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(state(), 0, "healthy and equal: closed");
        routed.set_delay(Duration::from_millis(100));
        marks.insert("fault", start.elapsed());
        let opened = wait_state(state, 1, Duration::from_secs(10));
        marks.insert("open", opened - start);
        std::thread::sleep(Duration::from_secs(2));
    });
    print_timeline(&sent, &states);
    let (fault, open) = (marks["fault"], marks["open"]);
    println!(
        "fault (5x slower) to open: {:.2} s",
        (open - fault).as_secs_f64()
    );
    assert!(open - fault < Duration::from_secs(5));
    let settled = open + SETTLE;
    assert!(sent
        .iter()
        .filter(|s| s.at >= settled)
        .all(|s| s.verdict != "routed" && s.status == 200));
    assert!(sent.iter().all(|s| s.status == 200), "slow, never failed");
}

#[test]
fn routes_cohort_is_not_enabled_for_are_left_alone() {
    // The route is named `legacy-chat`: disabled by name, or not in an enabled list, it is
    // left untouched; enabled by name, Cohort routes it. (The breaker is off in the first
    // two, and records nothing.)
    for (plugin, expected) in [
        (
            r#"{"rollout":{"disabled_routes":["legacy-chat"]},"breaker":{"enabled":false}}"#,
            "route_disabled",
        ),
        (
            r#"{"rollout":{"enabled_routes":["new-chat"]},"breaker":{"enabled":false}}"#,
            "route_disabled",
        ),
        (
            r#"{"rollout":{"enabled_routes":["legacy-chat"]}}"#,
            "routed",
        ),
    ] {
        let upstream = Upstream::start("u");
        let mut config = config::load("affinity");
        set_endpoints(&mut config, "engines", &[upstream.port]);
        config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
            ["typed_config"]["route_config"]["virtual_hosts"][0]["routes"][0]["name"] =
            Value::from("legacy-chat");
        set_filter(&mut config, plugin);
        let envoy = Envoy::start(&config);
        let body = chat("where is my refund");
        let mut connection = Connection::new(envoy.listen_port);
        let response = connection.post_json(CHAT, &[], &body).unwrap();
        assert_eq!(verdict(response.header("x-cohort")), expected, "{plugin}");
        let got = upstream.received().pop().unwrap();
        assert_eq!(got.body, body);
        let untouched = got.headers.iter().all(|(n, _)| !n.starts_with("x-cohort"));
        assert_eq!(untouched, expected == "route_disabled", "{plugin}");
        assert_eq!(
            envoy.stat("wasmcustom.cohort_bypass_route_disabled_total"),
            u64::from(expected == "route_disabled")
        );
        // Its response is counted in its group, on its route.
        let group = if expected == "routed" {
            ROUTED
        } else {
            ("cohort_reason", "route_disabled")
        };
        assert!(eventually(Duration::from_secs(5), || envoy.series_sum(
            "cohort_responses_total",
            &[group, ("cohort_route", "legacy-chat")]
        ) == 1.0));
    }
}

#[test]
fn without_a_hold_out_only_the_absolute_rule_judges() {
    // Share 1 (the default): every request is Cohort's and there is no control group.
    // With the absolute rule off there is nothing to judge by: even a failing upstream does
    // not open the breaker.
    let (routed, direct) = (Upstream::start("routed"), Upstream::start("direct"));
    let envoy = split_stack(
        &routed,
        &direct,
        r#"{"breaker":{"window_s":1,"min_requests":5,"absolute_enabled":false}}"#,
    );
    routed.set_status(503);
    let mut connection = Connection::new(envoy.listen_port);
    for _ in 0..100 {
        let r = connection
            .post_json(CHAT, &[], &chat("where is my refund"))
            .unwrap();
        assert_eq!(verdict(r.header("x-cohort")), "routed");
    }
    // Deliberate window: past the breaker's 1 s window, then nothing may have opened it
    // (the same faults open it with the absolute rule on, below).
    std::thread::sleep(Duration::from_millis(1200));
    let r = connection
        .post_json(CHAT, &[], &chat("where is my refund"))
        .unwrap();
    assert_eq!(verdict(r.header("x-cohort")), "routed", "still closed");
    assert_eq!(envoy.stat("wasmcustom.cohort_breaker_trips_total"), 0);
    drop(envoy);

    // The absolute rule (on by default) needs no hold-out: the same fault opens it.
    let envoy = split_stack(
        &routed,
        &direct,
        r#"{"breaker":{"window_s":2,"absolute_min_requests":50}}"#,
    );
    let mut connection = Connection::new(envoy.listen_port);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut opened = false;
    while !opened && Instant::now() < deadline {
        let r = connection
            .post_json(CHAT, &[], &chat("where is my refund"))
            .unwrap();
        opened = verdict(r.header("x-cohort")) == "breaker_open";
    }
    assert!(opened, "the absolute rule never opened the breaker");
    assert_eq!(
        envoy.stat("wasmcustom.cohort_breaker_trips_absolute_total"),
        1
    );
    assert_eq!(
        envoy.stat("wasmcustom.cohort_breaker_trips_relative_total"),
        0
    );
    assert!(envoy.series_sum("cohort_responses_total", &[ROUTED, FAILED]) >= 50.0);
}
