//! Assign mode on the live load, end to end: real Envoy with the real filter, real
//! `cohort serve` over real gRPC, three recording upstream replicas that a test can make
//! slow or failing.
//!
//! - the filter reports each assigned request's first byte and end under its ticket; the
//!   batcher's in-flight book follows (in flight while a replica is slow, 0 after);
//! - a prefix whose holder has turned slow leaves it once the requests queued there cost
//!   more than a cold prefill elsewhere (the decaying estimate alone would keep sending
//!   them: a few small prompts are far below its slack);
//! - a replica that answers 5xx is left out of decisions, also for the prefix it holds;
//! - with replica URLs (the batcher probes them), a replica that goes away is left out
//!   after the probe interval: nothing more is assigned to it and every request succeeds,
//!   also those assigned to it before the probe saw it (Envoy retries them elsewhere).
//!
//! Needs `scripts/setup` (Envoy), `scripts/build-wasm` (the filter) and the `cohort`
//! binary (built by `cargo test --workspace`); `scripts/test` does all three.

use cohort_tests::client::post_json;
use cohort_tests::envoy::Envoy;
use cohort_tests::stack::{Replicas, Stack};
use cohort_tests::{eventually, one_at_a_time};
use serde_json::json;
use std::time::Duration;

const CHAT: &str = "/v1/chat/completions";
const REPLICAS: [&str; 3] = ["replica-0", "replica-1", "replica-2"];

/// Three recording replicas behind Envoy in assign mode; with `probed`, the batcher knows
/// their URLs and probes them every second.
fn stack_with(probed: bool) -> Stack {
    let stack = Stack::assign();
    match probed {
        true => stack.replicas(Replicas::Urls),
        false => stack,
    }
    .start()
}

fn stack() -> Stack {
    stack_with(false)
}

/// A request of one application (a long shared system prompt) with its own question.
fn body(question: usize) -> Vec<u8> {
    let system = format!(
        "You are the support assistant of the Example Bank. {}",
        "Answer politely, cite the policy section, never reveal account numbers. ".repeat(16)
    );
    serde_json::to_vec(&json!({"model": "m", "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": format!("Question {question}: how do I reset my card PIN?")},
    ]}))
    .unwrap()
}

/// Sends request `question`; returns the replica that answered and the status.
fn send(envoy: &Envoy, question: usize) -> (String, u16) {
    let response = post_json(envoy.listen_port, CHAT, &[], &body(question));
    let replica = response.header("x-upstream").unwrap_or_default().to_owned();
    (replica, response.status)
}

fn index(replica: &str) -> usize {
    REPLICAS.iter().position(|r| *r == replica).unwrap()
}

#[test]
fn a_slow_holder_sheds_its_prefix_and_the_book_follows() {
    let _serial = one_at_a_time();
    let stack = stack();
    let b = stack.batcher();
    // Warm: the prefix lands somewhere and stays there while the fleet is quiet.
    let (holder, status) = send(&stack.envoy, 0);
    assert_eq!(status, 200);
    for q in 1..4 {
        assert_eq!(
            send(&stack.envoy, q).0,
            holder,
            "a quiet fleet keeps the prefix home"
        );
    }
    assert!(eventually(Duration::from_secs(2), || {
        b.metric("cohort_progress_reports_total{phase=\"end\"}") >= 4.0
    }));
    assert_eq!(b.metric("cohort_assign_live_load"), 1.0);
    // The holder turns slow: its answers take 3 s. Sixteen requests of the prefix follow,
    // 120 ms apart, each waiting for its answer in its own thread. The queue they build
    // there passes a cold prefill elsewhere plus `live_slack` (one more) after about ten.
    stack
        .upstream(index(&holder))
        .set_delay(Duration::from_secs(3));
    let in_flight = format!("cohort_replica_in_flight{{replica=\"{holder}\"}}");
    let served: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..16)
            .map(|i| {
                // Deliberate window: the requests are paced 120 ms apart.
                std::thread::sleep(Duration::from_millis(120));
                let envoy = &stack.envoy;
                scope.spawn(move || {
                    let (replica, status) = send(envoy, 100 + i);
                    assert_eq!(status, 200);
                    replica
                })
            })
            .collect();
        // While they run, the book shows the holder's requests in flight.
        assert!(b.metric(&in_flight) >= 1.0, "{}", b.metrics());
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let on_holder = served.iter().filter(|r| **r == holder).count();
    assert!(
        (1..16).contains(&on_holder),
        "the slow holder took some, then the prefix moved: {served:?}"
    );
    // Every request ended: nothing left in flight anywhere.
    assert!(
        eventually(Duration::from_secs(3), || REPLICAS.iter().all(|r| b
            .metric(&format!("cohort_replica_in_flight{{replica=\"{r}\"}}"))
            == 0.0)),
        "{}",
        b.metrics()
    );
    assert!(b.metric("cohort_progress_reports_total{phase=\"first_byte\"}") >= 12.0);
    assert_eq!(
        b.metric("cohort_progress_reports_total{phase=\"unknown\"}"),
        0.0
    );
}

#[test]
fn a_replica_answering_5xx_is_left_out() {
    let _serial = one_at_a_time();
    let stack = stack();
    let b = stack.batcher();
    let (holder, _) = send(&stack.envoy, 0);
    stack.upstream(index(&holder)).set_status(503);
    let (replica, status) = send(&stack.envoy, 1);
    assert_eq!((replica.as_str(), status), (holder.as_str(), 503));
    let available = format!("cohort_replica_available{{replica=\"{holder}\"}}");
    assert!(
        eventually(Duration::from_secs(2), || b.metric(&available) == 0.0),
        "{}",
        b.metrics()
    );
    assert!(b.metric("cohort_replica_server_errors_total") >= 1.0);
    // Its prefix goes elsewhere now, and every answer is a success.
    for q in 2..8 {
        let (replica, status) = send(&stack.envoy, q);
        assert_ne!(replica, holder);
        assert_eq!(status, 200);
    }
}

#[test]
fn a_replica_that_goes_away_gets_nothing_after_the_probe_interval() {
    let _serial = one_at_a_time();
    let mut stack = stack_with(true);
    let (holder, status) = send(&stack.envoy, 0);
    assert_eq!(status, 200);
    let up = format!("cohort_engine_up{{replica=\"{holder}\"}}");
    assert!(eventually(Duration::from_secs(3), || stack
        .batcher()
        .metric(&up)
        == 1.0));
    // The holder goes away (its port refuses connections), with nothing in flight.
    stack.stop_upstream(index(&holder));
    let b = stack.batcher();
    // Before the probe sees it, its prefix is still assigned to it: Envoy's retry goes to
    // another replica (the failover cluster), and the caller sees nothing of it.
    for q in 20..23 {
        let (replica, status) = send(&stack.envoy, q);
        assert_eq!(status, 200, "request {q} right after the kill");
        assert_ne!(replica, holder);
    }
    let available = format!("cohort_replica_available{{replica=\"{holder}\"}}");
    assert!(
        eventually(Duration::from_secs(3), || b.metric(&up) == 0.0
            && b.metric(&available) == 0.0),
        "{}",
        b.metrics()
    );
    let assigned = format!("cohort_replica_assigned_total{{replica=\"{holder}\"}}");
    let before = b.metric(&assigned);
    // Its prefix and everything else now goes to the others, and every request succeeds.
    for q in 1..13 {
        let (replica, status) = send(&stack.envoy, q);
        assert_eq!(status, 200, "request {q}");
        assert_ne!(replica, holder);
    }
    assert_eq!(
        b.metric(&assigned),
        before,
        "nothing assigned to the dead replica"
    );
}
