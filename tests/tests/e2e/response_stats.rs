//! The filter's per-group response stats in a real Envoy, read the way Prometheus scrapes
//! them (`/stats/prometheus`, the shipped `stats_tags` turning the tags in the stat names into
//! labels):
//!
//! - every counted request's response lands in its group (routed, held out, bypassed with
//!   its reason), on its route, and for the two compared groups in its user's unit; the
//!   cached and prompt tokens of a stream's final usage chunk are counted per group;
//! - the time to first byte is the first SSE event, not the end of the stream (the latency
//!   histograms are sampled as the fingerprint ones are: `envoy_filter` checks the rate;
//!   these tests time every request);
//! - `response_stats.max_routes` caps the routes that get series of their own.

use cohort_tests::client::{verdict, Connection};
use cohort_tests::config::{self, set_endpoints, set_filter};
use cohort_tests::envoy::Envoy;
use cohort_tests::eventually;
use cohort_tests::upstream::Upstream;
use serde_yaml::Value;
use std::collections::BTreeSet;
use std::time::Duration;

const CHAT: &str = "/v1/chat/completions";
const COMPLETIONS: &str = "/v1/completions";

/// A stream of two token events and a final usage chunk (100 prompt tokens, 60 cached).
const EVENTS: [&str; 3] = [
    "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n",
    "data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\n",
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":60}}}\n\ndata: [DONE]\n\n",
];

fn chat(user: &str) -> Vec<u8> {
    serde_json::to_vec(
        &serde_json::json!({"model": "m", "stream": true, "messages": [
            {"role": "system", "content": "You are the Example Bank assistant."},
            {"role": "user", "content": format!("where is my refund, {user}")},
        ]}),
    )
    .unwrap()
}

/// `affinity.yaml` on `upstream`, its route named `chat`, a second route `completions` for
/// `/v1/completions`, histograms merged every 200 ms, and the plugin configuration `plugin`.
fn envoy(upstream: &Upstream, plugin: &str) -> Envoy {
    let mut config = config::load("affinity");
    set_endpoints(&mut config, "engines", &[upstream.port]);
    let routes = &mut config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]["route_config"]["virtual_hosts"][0]["routes"];
    let mut chat_route = routes[0].clone();
    chat_route["name"] = Value::from("chat");
    let mut completions = chat_route.clone();
    completions["name"] = Value::from("completions");
    completions["match"] = serde_yaml::from_str(&format!("{{prefix: {COMPLETIONS}}}")).unwrap();
    *routes = Value::Sequence(vec![completions, chat_route]);
    config["stats_flush_interval"] = Value::from("0.2s");
    set_filter(&mut config, plugin);
    Envoy::start(&config)
}

/// Responses counted so far, all groups.
fn responses(envoy: &Envoy) -> f64 {
    envoy.series_sum("cohort_responses_total", &[])
}

#[test]
fn responses_are_counted_by_group_route_and_unit_as_prometheus_labels() {
    let upstream = Upstream::start("engine");
    let gate = upstream.set_sse(&EVENTS);
    let envoy = envoy(
        &upstream,
        r#"{"rollout":{"share":0.5,"key_header":"x-user-id"},"breaker":{"enabled":false},"histogram_sample_every":1}"#,
    );
    let mut connection = Connection::new(envoy.listen_port);
    let (mut routed, mut held) = (0.0, 0.0);
    let mut treated_user = None;
    for i in 0..48 {
        gate.release();
        let user = format!("user-{i}");
        let response = connection
            .post_json(CHAT, &[("x-user-id", user.as_str())], &chat(&user))
            .unwrap();
        assert_eq!(response.status, 200);
        match verdict(response.header("x-cohort")).as_str() {
            "routed" => {
                routed += 1.0;
                treated_user = Some(user);
            }
            "holdout" => held += 1.0,
            other => panic!("{other}"),
        }
    }
    // Two bodies that are not JSON from a treated user: bypassed, with their reason (a
    // held-out user's would be held out: the hold-out is decided before the body is read).
    let treated_user = treated_user.expect("a treated user");
    for _ in 0..2 {
        gate.release();
        let response = connection
            .post_json(CHAT, &[("x-user-id", treated_user.as_str())], b"{oops")
            .unwrap();
        assert_eq!(verdict(response.header("x-cohort")), "invalid_json");
    }
    assert!(
        routed >= 10.0 && held >= 10.0,
        "{routed} routed, {held} held out"
    );
    // Counted at the end of each stream, histograms merged at Envoy's flush.
    assert!(
        eventually(Duration::from_secs(10), || {
            responses(&envoy) == 50.0
                && envoy.series_sum("cohort_response_ttfb_ms_count", &[]) == 50.0
        }),
        "{}",
        envoy.admin("/stats/prometheus")
    );
    let routed_labels = [("cohort_group", "routed"), ("cohort_route", "chat")];
    let held_labels = [("cohort_group", "holdout"), ("cohort_route", "chat")];
    for (labels, n) in [(routed_labels, routed), (held_labels, held)] {
        let ok = [labels[0], labels[1], ("cohort_status", "2xx")];
        assert_eq!(
            envoy.series_sum("cohort_responses_total", &ok),
            n,
            "{labels:?}: {:?}",
            envoy.series("cohort_responses_total", &[])
        );
        assert_eq!(
            envoy.series_sum("cohort_response_ttfb_ms_count", &labels),
            n
        );
        assert_eq!(
            envoy.series_sum("cohort_response_total_ms_count", &labels),
            n
        );
        assert_eq!(
            envoy.series_sum("cohort_response_headers_ms_count", &labels),
            n
        );
        // Every stream ended with a usage chunk: 100 prompt tokens, 60 cached.
        assert_eq!(
            envoy.series_sum("cohort_response_prompt_tokens_total", &labels),
            100.0 * n
        );
        assert_eq!(
            envoy.series_sum("cohort_response_cached_tokens_total", &labels),
            60.0 * n
        );
        // Users are spread over the units, in both groups.
        let units: BTreeSet<String> = envoy
            .series("cohort_responses_total", &labels)
            .into_iter()
            .map(|(series, _)| {
                let start = series.find("cohort_unit=\"").expect("a unit") + 13;
                series[start..start + 1].to_owned()
            })
            .collect();
        assert!(units.len() >= 5, "{units:?}");
    }
    let bypassed = [
        ("cohort_group", "bypassed"),
        ("cohort_reason", "invalid_json"),
        ("cohort_route", "chat"),
    ];
    assert_eq!(envoy.series_sum("cohort_responses_total", &bypassed), 2.0);
    // Bypassed requests are not split by unit (only the compared groups are).
    assert!(envoy
        .series("cohort_responses_total", &bypassed)
        .iter()
        .all(|(series, _)| !series.contains("cohort_unit")));
}

#[test]
fn the_first_byte_is_the_first_event_and_the_total_waits_for_the_last() {
    let upstream = Upstream::start("engine");
    let gate = upstream.set_sse(&EVENTS);
    let envoy = envoy(
        &upstream,
        r#"{"breaker":{"enabled":false},"histogram_sample_every":1}"#,
    );
    let release = std::thread::spawn(move || {
        // Deliberate window: the stream's last event comes 400 ms after its first.
        std::thread::sleep(Duration::from_millis(400));
        gate.release();
    });
    let response = Connection::new(envoy.listen_port)
        .post_json(CHAT, &[], &chat("u"))
        .unwrap();
    release.join().unwrap();
    assert!(response.text().contains("cached_tokens"));
    let routed = [("cohort_group", "routed")];
    assert!(
        eventually(Duration::from_secs(10), || envoy
            .series_sum("cohort_response_total_ms_count", &routed)
            == 1.0),
        "{}",
        envoy.admin("/stats/prometheus")
    );
    let bucket = |metric: &str, le: &str| {
        let labels = [("cohort_group", "routed"), ("le", le)];
        envoy.series_sum(&format!("cohort_response_{metric}_bucket"), &labels)
    };
    assert_eq!(
        bucket("ttfb_ms", "250"),
        1.0,
        "the first event came at once"
    );
    assert_eq!(bucket("headers_ms", "250"), 1.0);
    assert_eq!(
        bucket("total_ms", "250"),
        0.0,
        "the stream ended 400 ms later"
    );
    assert_eq!(bucket("total_ms", "1000"), 1.0);
    // Without a hold-out (share 1) there are no units.
    assert!(envoy
        .series("cohort_responses_total", &routed)
        .iter()
        .all(|(series, _)| !series.contains("cohort_unit")));
}

#[test]
fn max_routes_caps_the_routes_with_series_of_their_own() {
    let upstream = Upstream::start("engine");
    let gate = upstream.set_sse(&EVENTS);
    // The default (8): both routes get their own; 1: the first one met; 0: none.
    for (max_routes, expected) in [
        (None, ["chat", "completions"]),
        (Some(1), ["chat", "other"]),
        (Some(0), ["other", "other"]),
    ] {
        let plugin = match max_routes {
            Some(n) => format!(r#"{{"response_stats":{{"max_routes":{n}}}}}"#),
            None => "{}".into(),
        };
        let envoy = envoy(&upstream, &plugin);
        let mut connection = Connection::new(envoy.listen_port);
        for path in [CHAT, COMPLETIONS] {
            gate.release();
            let body = if path == CHAT {
                chat("u")
            } else {
                br#"{"model":"m","prompt":"hello","stream":true}"#.to_vec()
            };
            let response = connection.post_json(path, &[], &body).unwrap();
            assert_eq!(verdict(response.header("x-cohort")), "routed", "{path}");
            // One at a time, so the first route met is the chat one.
            assert!(eventually(Duration::from_secs(5), || responses(&envoy)
                >= if path == CHAT { 1.0 } else { 2.0 }));
        }
        for route in ["chat", "completions", "other"] {
            let want = expected.iter().filter(|r| **r == route).count() as f64;
            assert_eq!(
                envoy.series_sum("cohort_responses_total", &[("cohort_route", route)]),
                want,
                "max_routes {max_routes:?}, route {route}: {}",
                envoy.admin("/stats/prometheus")
            );
        }
    }
}
