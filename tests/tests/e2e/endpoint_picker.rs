//! `cohort serve` as a Gateway API Inference Extension endpoint picker, through real Envoy
//! (`istio/envoy/endpoint-picker.yaml`: ext_proc to the picker, override_host over the
//! pool) in front of recording replicas the batcher knows by URL. The behaviours the
//! Inference Extension's conformance suite checks (docs/ENDPOINT-PICKER.md has the table):
//!
//! - requests land only on the endpoint the picker returned first, and a repeated prefix
//!   on the same replica;
//! - the fallback list is used when the first endpoint refuses;
//! - the subset hint (`envoy.lb.subset_hint`) is honoured; an empty one, or one with no
//!   endpoint of the pool, gets 503 from the picker;
//! - the served endpoint is reported back: the batcher's in-flight book follows the
//!   response (1 while it streams, 0 after) on the replica that served it;
//! - picker down: FailOpen serves every request from the pool, FailClose answers 5xx;
//! - HTTP/1.1 and h2c upstreams both work;
//! - a body over the picker's limit and a body that is not JSON reach the replica byte for
//!   byte with their `x-cohort-bypass` reason, with the body streamed full-duplex and
//!   buffered; a streamed (SSE) response passes unchanged, event by event.
//!
//! Needs `scripts/setup` (Envoy) and the `cohort` binary (built by `cargo test
//! --workspace`).

use cohort_tests::client::{self, post_json, Response};
use cohort_tests::config::{self, PickerBody};
use cohort_tests::eventually;
use cohort_tests::h2;
use cohort_tests::stack::Stack;
use cohort_tests::upstream::Received;
use serde_json::json;
use std::time::Duration;

const CHAT: &str = "/v1/chat/completions";
const DESTINATION: &str = "x-gateway-destination-endpoint";

/// A chat request of application `app` (its own long system prompt: its own prefix) with
/// question `question`.
fn chat(app: usize, question: usize) -> Vec<u8> {
    let system = format!(
        "You are assistant number {app} of the Example Corp help desk. {}",
        format!("Policy {app}: answer briefly, cite the handbook, never guess. ").repeat(24)
    );
    serde_json::to_vec(&json!({"model": "m", "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": format!("Question {question}: how do I reset my password?")},
    ]}))
    .unwrap()
}

/// The chat requests engine `i` received (the batcher's health probes left out).
fn chats(stack: &Stack, i: usize) -> Vec<Received> {
    stack
        .upstream(i)
        .received()
        .into_iter()
        .filter(|r| r.path.ends_with(CHAT))
        .collect()
}

/// The endpoints a request carried to its replica, in order.
fn destinations(received: &Received) -> Vec<String> {
    received
        .header(DESTINATION)
        .unwrap_or_default()
        .split(',')
        .map(|e| e.trim().to_owned())
        .filter(|e| !e.is_empty())
        .collect()
}

/// The one engine that received a chat request with exactly `body`, and what it received;
/// panics unless exactly one engine received it exactly once.
fn receiver(stack: &Stack, engines: usize, body: &[u8]) -> (usize, Received) {
    let found: Vec<(usize, Received)> = (0..engines)
        .flat_map(|i| {
            chats(stack, i)
                .into_iter()
                .filter(|r| r.body == body)
                .map(move |r| (i, r))
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "received by {:?}",
        found.iter().map(|f| f.0).collect::<Vec<_>>()
    );
    found.into_iter().next().unwrap()
}

/// Sends `body` as a chat request over HTTP/1.1.
fn send(stack: &Stack, body: &[u8]) -> Response {
    post_json(stack.port(), CHAT, &[], body)
}

/// Sends `body` as a chat request over h2c, in `pieces` DATA frames.
fn send_h2(stack: &Stack, body: &[u8], pieces: usize) -> Response {
    let size = body.len().div_ceil(pieces.max(1)).max(1);
    h2::send(
        stack.port(),
        h2::Request {
            method: "POST".into(),
            path: CHAT.into(),
            headers: vec![("content-type".into(), b"application/json".to_vec())],
            pieces: body.chunks(size).map(<[u8]>::to_vec).collect(),
            ..Default::default()
        },
    )
    .expect("h2 exchange")
}

/// Asserts that `body` reached exactly the engine the picker named first, byte for byte,
/// and returns that engine.
fn landed_as_picked(stack: &Stack, body: &[u8], response: &Response) -> usize {
    assert_eq!(response.status, 200, "{}", response.text());
    let (i, received) = receiver(stack, 3, body);
    let listed = destinations(&received);
    assert_eq!(
        listed.first(),
        Some(&stack.endpoint(i)),
        "replica-{i} took a request the picker sent to {listed:?}"
    );
    for endpoint in &listed {
        assert!(
            (0..3).any(|j| &stack.endpoint(j) == endpoint),
            "{endpoint} is not in the pool"
        );
    }
    assert_eq!(
        response.header("x-upstream"),
        Some(format!("replica-{i}").as_str())
    );
    i
}

#[test]
fn requests_land_only_on_the_endpoint_the_picker_returned_and_a_prefix_stays() {
    let stack = Stack::picker().start();
    let mut holder = Vec::new();
    for app in 0..6 {
        let body = chat(app, 0);
        let response = send(&stack, &body);
        let i = landed_as_picked(&stack, &body, &response);
        let (_, received) = receiver(&stack, 3, &body);
        assert!(
            received.header("x-cohort-key").is_some(),
            "{:?}",
            received.headers
        );
        assert_eq!(
            received.header("x-cohort-shard"),
            Some(format!("replica-{i}").as_str())
        );
        holder.push(i);
    }
    // The same applications again, new questions: the replica that holds the prefix.
    for (app, &first) in holder.iter().enumerate().take(3) {
        for question in 1..3 {
            let body = chat(app, question);
            let response = send(&stack, &body);
            assert_eq!(
                landed_as_picked(&stack, &body, &response),
                first,
                "application {app}'s prefix moved"
            );
        }
    }
}

#[test]
fn the_fallback_list_is_used_when_the_first_endpoint_refuses() {
    // The batcher probes its replicas once an hour: it still counts a stopped replica
    // in, so the picker names it first for the prefix it holds, and Envoy must go down
    // the list.
    let mut stack = Stack::picker()
        .serve_toml("[batch]\nscrape_interval_s = 3600\n")
        .start();
    let body = chat(7, 0);
    let first = landed_as_picked(&stack, &body, &send(&stack, &body));
    stack.stop_upstream(first);
    let retries = stack.envoy.stat("cluster.inference-pool.upstream_rq_retry");
    let reattributed = "cohort_picker_reattributed_total";
    let moved = stack.batcher().metric(reattributed);
    let mut refused = 0;
    for question in 1..4 {
        let body = chat(7, question);
        let response = send(&stack, &body);
        assert_eq!(response.status, 200, "{}", response.text());
        let found: Vec<(usize, Received)> = (0..3)
            .filter(|&i| i != first)
            .flat_map(|i| {
                chats(&stack, i)
                    .into_iter()
                    .filter(|r| r.body == body)
                    .map(move |r| (i, r))
            })
            .collect();
        assert_eq!(found.len(), 1, "question {question}");
        let (i, received) = &found[0];
        let listed = destinations(received);
        if question == 1 {
            assert_eq!(
                listed[0],
                stack.endpoint(first),
                "the prefix's holder first"
            );
        }
        // Served by the first endpoint of the list that did not refuse.
        let expected = listed.iter().find(|e| **e != stack.endpoint(first));
        assert_eq!(
            expected,
            Some(&stack.endpoint(*i)),
            "served by replica-{i}; listed {listed:?}"
        );
        refused += usize::from(listed[0] == stack.endpoint(first));
    }
    assert!(
        stack.envoy.stat("cluster.inference-pool.upstream_rq_retry") >= retries + refused as u64,
        "Envoy did not retry"
    );
    // The picker learnt which endpoint served each of them (the served endpoint's report).
    assert!(
        eventually(Duration::from_secs(5), || {
            stack.batcher().metric(reattributed) >= moved + refused as f64
        }),
        "{}",
        stack.batcher().metrics()
    );
}

/// A picker stack whose Envoy sends the subset hint: the engines named by `subset`
/// (indices), or `extra` endpoints outside the pool.
fn with_subset(subset: &'static [usize], extra: &'static [&'static str]) -> Stack {
    Stack::picker()
        .envoy_config(move |yaml, ports| {
            let mut endpoints: Vec<String> = subset
                .iter()
                .map(|&i| format!("127.0.0.1:{}", ports[i]))
                .collect();
            endpoints.extend(extra.iter().map(|e| e.to_string()));
            config::set_subset_hint(yaml, &endpoints);
        })
        .start()
}

#[test]
fn the_subset_hint_is_honoured() {
    let stack = with_subset(&[1], &[]);
    for app in 0..5 {
        let body = chat(app, 0);
        let response = send(&stack, &body);
        assert_eq!(
            landed_as_picked(&stack, &body, &response),
            1,
            "application {app}"
        );
        let (_, received) = receiver(&stack, 3, &body);
        assert_eq!(
            destinations(&received),
            vec![stack.endpoint(1)],
            "a list outside the subset"
        );
    }
}

#[test]
fn an_empty_subset_or_one_with_no_endpoint_of_the_pool_gets_503() {
    for stack in [
        with_subset(&[], &[]),
        with_subset(&[], &["10.255.255.1:8000"]),
    ] {
        for app in 0..3 {
            let response = send(&stack, &chat(app, 0));
            assert_eq!(response.status, 503, "{}", response.text());
        }
        assert_eq!((0..3).map(|i| chats(&stack, i).len()).sum::<usize>(), 0);
    }
}

#[test]
fn the_served_endpoint_is_reported_back() {
    let stack = Stack::picker().start();
    let gates: Vec<_> = (0..3)
        .map(|i| {
            stack
                .upstream(i)
                .set_sse(&["data: {\"n\":1}\n\n", "data: [DONE]\n\n"])
        })
        .collect();
    let batcher = stack.batcher();
    let first_bytes = "cohort_progress_reports_total{phase=\"first_byte\"}";
    let before = batcher.metric(first_bytes);
    let body = chat(3, 0);
    let mut events = client::post_stream(stack.port(), CHAT, &[], &body);
    assert_eq!(events.status, 200);
    let (i, _) = receiver(&stack, 3, &body);
    let in_flight = format!("cohort_replica_in_flight{{replica=\"replica-{i}\"}}");
    // The response's headers reached the picker with the endpoint that served it.
    assert!(
        eventually(Duration::from_secs(5), || batcher.metric(first_bytes)
            > before),
        "no first byte reported:\n{}",
        batcher.metrics()
    );
    assert_eq!(batcher.metric(&in_flight), 1.0, "{}", batcher.metrics());
    assert_eq!(events.next_data().as_deref(), Some("{\"n\":1}"));
    gates[i].release();
    assert_eq!(events.next_data().as_deref(), Some("[DONE]"));
    assert_eq!(events.next_data(), None);
    // Its end came back too: nothing left in flight on that replica.
    assert!(
        eventually(Duration::from_secs(5), || batcher.metric(&in_flight) == 0.0),
        "{}",
        batcher.metrics()
    );
}

#[test]
fn picker_down_fail_open_serves_every_request_from_the_pool() {
    let mut stack = Stack::picker()
        .envoy_config(|yaml, _| {
            config::set_picker_fail_open(yaml, true);
            config::set_picker_body(yaml, PickerBody::Buffered);
        })
        .start();
    let body = chat(0, 0);
    landed_as_picked(&stack, &body, &send(&stack, &body));
    stack.batcher_mut().kill9();
    for question in 1..7 {
        let body = chat(0, question);
        let response = send(&stack, &body);
        assert_eq!(response.status, 200, "{}", response.text());
        let (_, received) = receiver(&stack, 3, &body);
        assert_eq!(
            received.header(DESTINATION),
            None,
            "the picker answered while down"
        );
    }
}

#[test]
fn picker_down_fail_close_answers_5xx() {
    let mut stack = Stack::picker().start();
    let body = chat(0, 0);
    landed_as_picked(&stack, &body, &send(&stack, &body));
    stack.batcher_mut().kill9();
    for question in 1..4 {
        let response = send(&stack, &chat(0, question));
        assert!(
            (500..600).contains(&response.status),
            "{} {}",
            response.status,
            response.text()
        );
    }
    assert_eq!((0..3).map(|i| chats(&stack, i).len()).sum::<usize>(), 1);
}

fn serves_both_client_protocols(stack: &Stack, version: &str) {
    for app in 0..2 {
        let body = chat(app, 10);
        let response = send(stack, &body);
        let i = landed_as_picked(stack, &body, &response);
        assert_eq!(receiver(stack, 3, &body).1.version, version);
        let body = chat(app, 11);
        let response = send_h2(stack, &body, 3);
        assert_eq!(landed_as_picked(stack, &body, &response), i);
        assert_eq!(receiver(stack, 3, &body).1.version, version);
    }
}

#[test]
fn http1_upstreams_work() {
    serves_both_client_protocols(&Stack::picker().start(), "HTTP/1.1");
}

#[test]
fn h2c_upstreams_work() {
    let stack = Stack::picker()
        .envoy_config(|yaml, _| config::set_upstream_h2c(yaml, "inference-pool"))
        .start();
    serves_both_client_protocols(&stack, "HTTP/2.0");
}

/// The picker's body limit in these tests (its filter configuration).
const BODY_LIMIT: usize = 4096;

/// Over-size and non-JSON bodies reach their replica unchanged, with their bypass reason
/// and an endpoint; a plain request is fingerprinted beside them. Each is sent over
/// HTTP/1.1 and over h2c in pieces, every body its own bytes.
fn bodies_pass_unchanged(body_mode: PickerBody) {
    let stack = Stack::picker()
        .filter(json!({"body_limit_bytes": BODY_LIMIT}))
        .envoy_config(move |yaml, _| config::set_picker_body(yaml, body_mode))
        .start();
    for (round, h2) in [false, true].into_iter().enumerate() {
        let mut oversize = chat(1, round);
        let padding = "x".repeat(BODY_LIMIT * 5);
        oversize.splice(1..1, format!("\"pad\":\"{padding}\",").into_bytes());
        assert!(serde_json::from_slice::<serde_json::Value>(&oversize).is_ok());
        let mut not_json = format!("{{\"model\": \"m{round}\", \"messages\": [").into_bytes();
        not_json.extend_from_slice(b"\xff\xfe not json");
        not_json.extend(std::iter::repeat_n(b'\x01', 300));
        let cases: [(&str, Vec<u8>, Option<&str>); 3] = [
            ("plain", chat(2, round), None),
            ("over-size", oversize, Some("body_too_large")),
            ("not JSON", not_json, Some("invalid_json")),
        ];
        for (name, body, bypass) in cases {
            let response = match h2 {
                false => send(&stack, &body),
                true => send_h2(&stack, &body, 4),
            };
            assert_eq!(
                response.status,
                200,
                "{name} (h2 {h2}): {}",
                response.text()
            );
            // Exactly these bytes, once, on one replica.
            let (_, received) = receiver(&stack, 3, &body);
            assert_eq!(
                received.header("x-cohort-bypass"),
                bypass,
                "{name} (h2 {h2})"
            );
            assert!(
                received.header(DESTINATION).is_some(),
                "{name}: no endpoint"
            );
        }
    }
}

#[test]
fn bodies_over_the_limit_or_not_json_pass_unchanged_full_duplex() {
    bodies_pass_unchanged(PickerBody::FullDuplex);
}

#[test]
fn bodies_over_the_limit_or_not_json_pass_unchanged_buffered() {
    bodies_pass_unchanged(PickerBody::Buffered);
}

#[test]
fn a_streamed_response_passes_unchanged_event_by_event() {
    let stack = Stack::picker().start();
    let events = [
        "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\n",
        "data: [DONE]\n\n",
    ];
    let gates: Vec<_> = (0..3).map(|i| stack.upstream(i).set_sse(&events)).collect();
    let body = chat(4, 0);
    let mut stream = client::post_stream(stack.port(), CHAT, &[], &body);
    assert_eq!(stream.status, 200);
    assert_eq!(stream.header("content-type"), Some("text/event-stream"));
    let (i, _) = receiver(&stack, 3, &body);
    // The first events arrive while the replica still holds the last one back: nothing
    // buffers the response.
    assert_eq!(
        stream.next_data().as_deref(),
        Some("{\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}")
    );
    assert_eq!(
        stream.next_data().as_deref(),
        Some("{\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}")
    );
    gates[i].release();
    assert_eq!(stream.next_data().as_deref(), Some("[DONE]"));
    assert_eq!(stream.next_data(), None);
}

#[test]
fn a_response_longer_than_the_ext_proc_call_timeout_streams_to_its_end() {
    // The ext_proc stream lives as long as the response (trailers SEND): the gRPC
    // service's `timeout`, here 1 s, must not cut a response that streams for longer.
    let stack = Stack::picker()
        .envoy_config(|config, _| {
            config::http_filter(config, "envoy.filters.http.ext_proc")["grpc_service"]["timeout"] =
                "1s".into();
        })
        .start();
    let events = [
        "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n",
        "data: [DONE]\n\n",
    ];
    let gates: Vec<_> = (0..3).map(|i| stack.upstream(i).set_sse(&events)).collect();
    let body = chat(5, 0);
    let mut stream = client::post_stream(stack.port(), CHAT, &[], &body);
    assert_eq!(stream.status, 200);
    let (i, _) = receiver(&stack, 3, &body);
    assert!(stream.next_data().is_some());
    // Deliberate window: the response outlives the ext_proc call's timeout.
    std::thread::sleep(Duration::from_millis(1500));
    gates[i].release();
    assert_eq!(stream.next_data().as_deref(), Some("[DONE]"));
    assert_eq!(stream.next_data(), None);
}
