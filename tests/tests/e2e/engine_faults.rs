//! An engine replica killed (`kill -9`) under load, with real llama.cpp replicas (two,
//! Gemma 3 270M) behind real Envoy with the real filter:
//!
//! - affinity mode (`istio/envoy/affinity.yaml`, ring hash on `x-cohort-key`): requests in
//!   flight on the dead replica are retried on the survivor (none fails), a stream cut by
//!   the kill ends at once (no hang), the dead replica's keys go to the survivor, and with
//!   no replica left a request gets a clean 503 quickly;
//! - batch mode (`istio/envoy/batch.yaml`, `cohort serve` with its front): the same through
//!   the front, which fails requests over to the survivor and answers a clean 502 when no
//!   engine is left;
//! - assign mode (`istio/envoy/assign.yaml`, `cohort serve` probing the replicas): requests
//!   in flight on the dead replica, and those assigned to it before the batcher's probe saw
//!   it die, are retried on the survivor (the failover cluster); after the probe interval
//!   nothing more is assigned to it.
//!
//! Each needs Envoy's retry policy to pick another host (`previous_hosts`, with enough
//! host-selection attempts for a ring hash), a retry circuit breaker above Envoy's default
//! of 3 concurrent retries, and outlier detection allowed to eject one replica of two.
//!
//! Needs `scripts/setup` (Envoy, llama-server and the model), `scripts/build-wasm` and the
//! `cohort` binary; `scripts/test` provides all of them.

use cohort_tests::client::{post_json, post_stream, Response};
use cohort_tests::config::set_endpoints;
use cohort_tests::llama::Llama;
use cohort_tests::stack::Stack;
use cohort_tests::{eventually, one_at_a_time};
use serde_json::json;
use std::time::{Duration, Instant};

const CHAT: &str = "/v1/chat/completions";
/// Applications (system prompts) with a request in flight at the kill: distinct cohorts,
/// spread over the two replicas.
const APPS: usize = 8;
/// Applications whose owner replica the affinity test finds out (both replicas own some).
const PROBED_APPS: usize = 16;

/// A request of application `app`, `max_tokens` long, streamed or not.
fn body(app: usize, max_tokens: u32, stream: bool) -> Vec<u8> {
    let system = format!(
        "[engine-faults app {app}] You are the assistant of the Example Bank support desk. {}",
        "Answer in two sentences and cite the policy section. ".repeat(4)
    );
    serde_json::to_vec(&json!({
        "model": "gemma-3-270m",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "How do I reset my card PIN?"},
        ],
        "max_tokens": max_tokens,
        "stream": stream,
    }))
    .unwrap()
}

/// What happened to the requests in flight when a replica was killed.
struct InFlight {
    /// Each non-streamed request's answer and latency.
    answers: Vec<(Response, Duration)>,
    /// Whether the cut stream ended with `[DONE]`, and how long after the kill it ended.
    stream_done: bool,
    stream_end_after_kill: Duration,
}

/// Starts `APPS` non-streamed requests and one stream of `stream_app`; once the stream has
/// its first event, kills replica `victim` (SIGKILL) and collects every outcome.
fn kill_under_load(
    port: u16,
    stream_app: usize,
    replicas: &mut [Option<Llama>],
    victim: impl FnOnce(&cohort_tests::client::EventStream) -> usize,
) -> (InFlight, usize) {
    // Long enough to still be generating when its replica is killed, on any runner.
    let mut stream = post_stream(port, CHAT, &[], &body(stream_app, 512, true));
    assert_eq!(stream.status, 200);
    assert!(stream.next_data().is_some(), "the stream started");
    let victim = victim(&stream);
    std::thread::scope(|scope| {
        let requests: Vec<_> = (0..APPS)
            .map(|app| {
                scope.spawn(move || {
                    let started = Instant::now();
                    let response = post_json(port, CHAT, &[], &body(app, 8, false));
                    (response, started.elapsed())
                })
            })
            .collect();
        // Deliberate window: 300 ms for the requests to reach the engines, then the victim
        // is killed under them.
        std::thread::sleep(Duration::from_millis(300));
        replicas[victim] = None;
        let killed = Instant::now();
        let mut stream_done = false;
        while let Some(data) = stream.next_data() {
            stream_done |= data == "[DONE]";
        }
        let stream_end_after_kill = killed.elapsed();
        let answers = requests.into_iter().map(|h| h.join().unwrap()).collect();
        (
            InFlight {
                answers,
                stream_done,
                stream_end_after_kill,
            },
            victim,
        )
    })
}

/// Checks the in-flight requests: none failed (the dead replica's were retried), and the
/// stream cut by the kill ended promptly without pretending to be complete.
fn assert_in_flight_survived(in_flight: &InFlight) {
    for (response, took) in &in_flight.answers {
        assert_eq!(
            response.status,
            200,
            "an in-flight request failed after {took:?}: {}",
            response.text()
        );
    }
    assert!(
        !in_flight.stream_done,
        "the stream on the killed replica cannot have finished"
    );
    assert!(
        in_flight.stream_end_after_kill < Duration::from_secs(5),
        "the cut stream ended {:?} after the kill",
        in_flight.stream_end_after_kill
    );
}

fn slowest(answers: &[(Response, Duration)]) -> Duration {
    answers.iter().map(|a| a.1).max().unwrap_or_default()
}

#[test]
fn a_replica_killed_under_affinity_routing_fails_nothing_and_its_keys_move() {
    // One at a time: each runs two llama.cpp replicas on the two CI cores.
    let _alone = one_at_a_time();
    let mut stack = Stack::plain("affinity")
        .llama(2, 2)
        .filter(json!({"mode": "affinity"}))
        .envoy_config(|config, ports| set_endpoints(config, "engines", ports))
        .start();
    let (envoy, replicas) = (&stack.envoy, &mut stack.llamas);
    let port = envoy.listen_port;

    // Which replica owns each application's key (the ring hash is deterministic).
    let prompt_tokens = |r: &Option<Llama>| {
        r.as_ref()
            .map_or(0.0, |r| r.metric("llamacpp:prompt_tokens_total"))
    };
    let owners: Vec<usize> = (0..PROBED_APPS)
        .map(|app| {
            let before: Vec<f64> = replicas.iter().map(prompt_tokens).collect();
            assert_eq!(post_json(port, CHAT, &[], &body(app, 1, false)).status, 200);
            (0..2)
                .find(|&r| prompt_tokens(&replicas[r]) > before[r])
                .expect("one replica computed the prompt")
        })
        .collect();
    assert!(
        owners.contains(&0) && owners.contains(&1),
        "keys on both replicas: {owners:?}"
    );
    let victim_app = owners.iter().position(|&o| o == 0).unwrap();

    let (in_flight, victim) = kill_under_load(port, victim_app, replicas, |_| 0);
    let survivor = 1 - victim;
    let retries = envoy.stat("cluster.engines.upstream_rq_retry");
    let overflow = envoy.stat("cluster.engines.upstream_rq_retry_overflow");
    println!(
        "affinity, replica {victim} killed: {} in-flight requests, slowest {:?}; stream cut, ended {:?} after the kill; retries {retries}, retry overflow {overflow}",
        in_flight.answers.len(),
        slowest(&in_flight.answers),
        in_flight.stream_end_after_kill
    );
    assert_in_flight_survived(&in_flight);
    assert_eq!(overflow, 0, "no retry refused by the circuit breaker");
    if owners[..APPS].contains(&victim) {
        assert!(
            retries > 0,
            "the dead replica's in-flight requests were retried"
        );
    }

    // New requests of the dead replica's keys go to the survivor.
    let before = prompt_tokens(&replicas[survivor]);
    let moved: Vec<Duration> = (0..PROBED_APPS)
        .filter(|&app| owners[app] == victim)
        .map(|app| {
            let started = Instant::now();
            let response = post_json(port, CHAT, &[], &body(app, 2, false));
            assert_eq!(response.status, 200, "{}", response.text());
            started.elapsed()
        })
        .collect();
    assert!(prompt_tokens(&replicas[survivor]) > before);
    let ejected = envoy.stat("cluster.engines.outlier_detection.ejections_enforced_total");
    println!(
        "affinity: {} new requests of the dead replica's keys answered by the survivor (slowest {:?}); ejections {ejected}",
        moved.len(),
        moved.iter().max().unwrap()
    );

    // No replica left: a clean error, quickly.
    replicas[survivor] = None;
    let started = Instant::now();
    let response = post_json(port, CHAT, &[], &body(0, 2, false));
    let took = started.elapsed();
    println!("affinity, no replica left: {} in {took:?}", response.status);
    assert_eq!(response.status, 503, "{}", response.text());
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

#[test]
fn a_replica_killed_under_the_batch_front_fails_nothing_and_new_requests_avoid_it() {
    // One at a time: each runs two llama.cpp replicas on the two CI cores.
    let _alone = one_at_a_time();
    // As batch_llama.rs: a deadline a loaded 2-core machine meets (the default 250 ms), so
    // requests are batched. Returns once the front and both replicas behind it passed their
    // first health check (until then Envoy sends marked requests to the replicas directly).
    let mut stack = Stack::batch().llama(2, 2).start();
    // Deliberate window: the front's first engine probe (slot counts from /props) runs at
    // start and shows in no metric (the replicas count as up before it); give it a beat.
    std::thread::sleep(Duration::from_millis(1500));
    let (envoy, batcher, replicas) = (&stack.envoy, &stack.batchers[0], &mut stack.llamas);
    let port = envoy.listen_port;

    let (in_flight, victim) = kill_under_load(port, 0, replicas, |stream| {
        let tag = stream
            .header("x-cohort-batch")
            .unwrap_or_else(|| panic!("not through the front: {:?}", stream.headers));
        let name = tag.split_once(";replica=").expect("role;replica=name").1;
        name.trim_start_matches("replica-").parse().unwrap()
    });
    let survivor = 1 - victim;
    let failovers = batcher.metric("cohort_front_failovers_total");
    println!(
        "batch, replica {victim} killed: {} in-flight requests, slowest {:?}; stream cut, ended {:?} after the kill; front failovers {failovers}",
        in_flight.answers.len(),
        slowest(&in_flight.answers),
        in_flight.stream_end_after_kill
    );
    assert_in_flight_survived(&in_flight);
    for (response, _) in &in_flight.answers {
        assert!(
            response.header("x-cohort-batch").is_some(),
            "through the front"
        );
    }

    // New requests: every one answered by the survivor.
    let survivor_name = format!("replica-{survivor}");
    for app in 0..APPS {
        let response = post_json(port, CHAT, &[], &body(app, 2, false));
        assert_eq!(response.status, 200, "{}", response.text());
        let tag = response.header("x-cohort-batch").unwrap_or_default();
        assert!(tag.ends_with(&survivor_name), "app {app} went to {tag}");
    }

    // No engine left: the front answers a clean 502, quickly.
    replicas[survivor] = None;
    let started = Instant::now();
    let response = post_json(port, CHAT, &[], &body(0, 2, false));
    let took = started.elapsed();
    println!(
        "batch, no replica left: {} in {took:?}: {}",
        response.status,
        response.text()
    );
    assert_eq!(response.status, 502, "{}", response.text());
    assert!(response.text().contains("cohort_engine_unreachable"));
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn a_replica_killed_under_assign_mode_fails_nothing_and_is_assigned_nothing_after_the_probe() {
    // One at a time: each runs two llama.cpp replicas on the two CI cores.
    let _alone = one_at_a_time();
    // Replica URLs: the batcher probes them every second (its front listens, unused).
    let mut stack = Stack::assign().llama(2, 2).start();
    let (envoy, batcher, replicas) = (&stack.envoy, &stack.batchers[0], &mut stack.llamas);
    let port = envoy.listen_port;
    let metric = |s: &str| batcher.metric(s);
    let up = |r: usize| metric(&format!("cohort_engine_up{{replica=\"replica-{r}\"}}"));
    assert!(eventually(Duration::from_secs(5), || up(0) == 1.0 && up(1) == 1.0));

    let (in_flight, victim) = kill_under_load(port, 0, replicas, |_| {
        // The stream is the only request in flight: its replica is the victim.
        let in_flight = |r: usize| {
            metric(&format!(
                "cohort_replica_in_flight{{replica=\"replica-{r}\"}}"
            ))
        };
        (0..2)
            .find(|&r| in_flight(r) == 1.0)
            .expect("the stream is in the book")
    });
    let retries = envoy.stat(&format!(
        "cluster.failover-replica-{victim}.upstream_rq_retry"
    ));
    println!(
        "assign, replica {victim} killed: {} in-flight requests, slowest {:?}; stream cut, ended {:?} after the kill; retries {retries}",
        in_flight.answers.len(),
        slowest(&in_flight.answers),
        in_flight.stream_end_after_kill
    );
    assert_in_flight_survived(&in_flight);

    // After the probe interval the dead replica is out of every decision.
    let available = format!("cohort_replica_available{{replica=\"replica-{victim}\"}}");
    assert!(eventually(Duration::from_secs(3), || metric(&available) == 0.0));
    let assigned = format!("cohort_replica_assigned_total{{replica=\"replica-{victim}\"}}");
    let before = metric(&assigned);
    for app in 0..APPS {
        let response = post_json(port, CHAT, &[], &body(app, 2, false));
        assert_eq!(response.status, 200, "{}", response.text());
    }
    assert_eq!(
        metric(&assigned),
        before,
        "nothing assigned to the dead replica"
    );
    assert_eq!(
        metric("cohort_assign_total"),
        (1 + 2 * APPS) as f64,
        "every request was decided by the batcher"
    );
}
