//! Batch mode at saturation, end to end: real Envoy (`istio/envoy/batch.yaml`) with the
//! real filter, a real `cohort serve` with its HTTP front, and three engines that answer at
//! once (recording upstreams, so the layer itself is the bottleneck). Clients send back to
//! back on keep-alive connections; every request carries a unique id, counted at the
//! clients and at the engines.
//!
//! - soak: `COHORT_SOAK_SECONDS` (default 20) at saturation; 0 failed, 0 lost, 0 sent
//!   twice; after the warm-up, Envoy's and the batcher's RSS grow less than 5% and their
//!   open file descriptors do not grow beyond the connection pools' bound
//!   (`scripts/soak SECONDS` runs it long and prints the numbers);
//! - SIGTERM of the batcher under the same load: the two-stage drain (health 503 and
//!   `connection: close` for the drain delay, then stop accepting) fails and loses nothing,
//!   the process exits 0, and Envoy sends the traffic to the replicas directly after.
//!
//! Needs `scripts/setup` (Envoy), `scripts/build-wasm` (the filter) and the `cohort`
//! binary (built by `cargo test --workspace`); `scripts/test` does all three.

use cohort_tests::load::{self, latencies, reconcile, window, Outcome, Plan, ID_HEADER};
use cohort_tests::procstat::{self, Sample};
use cohort_tests::stack::{Replicas, Stack};
use cohort_tests::upstream::Upstream;
use cohort_tests::{one_at_a_time, percentile};
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const CHAT: &str = "/v1/chat/completions";
/// Clients sending back to back: enough to keep the 2 CI cores busy.
const CLIENTS: usize = 16;

/// Batch mode over three counting engines that answer at once.
fn stack(extra_args: &[&str]) -> Stack {
    // At saturation the clients, Envoy, the batcher and the engines share two cores, and
    // an Assign can wait longer than the shipped 25 ms for a core; such a request skips
    // the front (correctly), so the soak allows 100 ms to keep the front in the path.
    // Returns once the front and the three replicas behind it passed their health check.
    Stack::batch()
        .counting(3, ID_HEADER)
        .replicas(Replicas::Adapter("openai"))
        .batcher_args(extra_args)
        .filter(json!({"assign_deadline_ms": 100}))
        .start()
}

/// Request `id`: 24 applications (each its own system prompt) × 50 questions, so the
/// fingerprint store and the cohorts reach their steady state during the warm-up, and
/// concurrent requests of one application co-batch.
fn body(id: u64) -> Vec<u8> {
    let app = id % 24;
    let question = (id / 24) % 50;
    let system = format!(
        "You are assistant {app} of the Example Bank. {}",
        "Answer politely, cite the policy section, never reveal account numbers. ".repeat(8)
    );
    serde_json::to_vec(&json!({
        "model": "gemma-3-270m",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": format!("Question {question}: how do I reset my card PIN?")},
        ],
        "max_tokens": 16,
    }))
    .unwrap()
}

fn plan(port: u16, cap: Duration) -> Plan<'static> {
    Plan {
        port,
        path: CHAT,
        clients: CLIENTS,
        body: &body,
        cap,
    }
}

/// Every id the engines received, over the three of them.
fn engine_ids(stack: &Stack) -> Vec<u64> {
    stack.upstreams().flat_map(Upstream::ids).collect()
}

/// Asserts 0 failed and 0 lost: every request answered 200, and the engines received every
/// id exactly once and nothing else.
fn assert_all_answered_and_counted(outcomes: &[Outcome], stack: &Stack) {
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| o.status != 200).collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed; first: {:?}",
        failed.len(),
        outcomes.len(),
        failed.first()
    );
    let (lost, duplicated, unknown) = reconcile(outcomes, engine_ids(stack));
    assert!(
        lost.is_empty(),
        "{} answered but never reached an engine: {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    assert!(
        duplicated.is_empty(),
        "{} reached the engines twice: {:?}",
        duplicated.len(),
        &duplicated[..duplicated.len().min(10)]
    );
    assert!(
        unknown.is_empty(),
        "engines saw ids no client sent: {unknown:?}"
    );
}

fn soak_seconds() -> u64 {
    std::env::var("COHORT_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20)
        .clamp(10, 3600)
}

#[test]
fn soak_at_saturation_loses_nothing_and_leaks_nothing() {
    // One at a time: each saturates the machine.
    let _alone = one_at_a_time();
    // A small audit log, so the bounded cache is full before the warm-up ends and the
    // leak check below measures everything else (its own bound is a unit test).
    let stack = stack(&["--audit-max-records", "1000"]);
    let seconds = soak_seconds();
    // A quarter of the run (5–30 s) warms up: pools, the store, the cohorts, allocators.
    let warmup = Duration::from_secs((seconds / 4).clamp(5, 30));
    let (envoy_pid, batcher_pid) = (stack.envoy.pid(), stack.batcher().pid().unwrap());
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let (outcomes, samples) = std::thread::scope(|scope| {
        let load = scope.spawn(|| {
            load::run(
                &plan(stack.envoy.listen_port, Duration::from_secs(seconds + 60)),
                &stop,
            )
        });
        // One sample of both processes a second (on a fixed schedule) while the load runs.
        let mut samples: Vec<(Duration, Sample, Sample)> = Vec::new();
        for tick in 1..=seconds {
            let due = started + Duration::from_secs(tick);
            // Deliberate window: the samples are taken on a fixed schedule.
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            let (Some(envoy), Some(batcher)) =
                (procstat::sample(envoy_pid), procstat::sample(batcher_pid))
            else {
                break;
            };
            samples.push((started.elapsed(), envoy, batcher));
        }
        stop.store(true, Ordering::Relaxed);
        (load.join().unwrap(), samples)
    });
    let elapsed = started.elapsed().as_secs_f64();
    assert!(
        samples.len() as u64 == seconds,
        "both processes alive throughout: {} samples",
        samples.len()
    );
    assert_all_answered_and_counted(&outcomes, &stack);

    let batched = outcomes.iter().filter(|o| o.batched).count();
    let leaders = stack
        .batcher()
        .metric("cohort_front_requests_total{role=\"leader\"}");
    let followers = stack
        .batcher()
        .metric("cohort_front_requests_total{role=\"follower\"}");
    let warm = samples
        .iter()
        .find(|(t, ..)| *t >= warmup)
        .copied()
        .expect("a sample after the warm-up");
    let end = *samples.last().unwrap();
    let measured = window(&outcomes, started + warmup, Instant::now());
    println!(
        "soak {seconds} s: {} requests, {:.0} req/s, {} through the front ({leaders} leaders, {followers} followers), p50 {:?} p99 {:?} (after warm-up: p50 {:?} p99 {:?})",
        outcomes.len(),
        outcomes.len() as f64 / elapsed,
        batched,
        percentile(latencies(&outcomes), 0.5),
        percentile(latencies(&outcomes), 0.99),
        percentile(latencies(&measured), 0.5),
        percentile(latencies(&measured), 0.99),
    );
    println!(
        "envoy: after warm-up ({:?}) {}, end ({:?}) {}",
        warm.0, warm.1, end.0, end.1
    );
    println!(
        "cohort serve: after warm-up {}, end {}; store {} entries ({} bytes), {} cohorts",
        warm.2,
        end.2,
        stack.batcher().metric("cohort_store_entries"),
        stack.batcher().metric("cohort_store_bytes"),
        stack.batcher().metric("cohort_cohorts"),
    );
    for (t, envoy, batcher) in samples.iter().step_by((samples.len() / 10).max(1)) {
        println!(
            "  {:>5.0} s  envoy {envoy}  cohort serve {batcher}",
            t.as_secs_f64()
        );
    }
    assert!(
        batched * 2 > outcomes.len(),
        "most requests went through the front: {batched} of {}",
        outcomes.len()
    );
    assert!(
        followers > 0.0,
        "concurrent requests of one cohort co-batched"
    );
    for (name, at_warm, at_end) in [("envoy", warm.1, end.1), ("cohort serve", warm.2, end.2)] {
        assert!(
            at_end.rss_kib * 100 < at_warm.rss_kib * 105,
            "{name}: RSS grew {at_warm} → {at_end} (≥ 5%)"
        );
        // Each client connection and each pooled upstream connection is one fd; the
        // pools may open a few more under a burst, but a leak grows with requests. Since
        // batch mode decides on the live load (leaders spread over the three engines) the
        // front's pools reach their size more slowly: 80 s runs end at 60-61 fds before
        // and after that change, but now about 5 of them open after the warm-up; one more
        // per engine is allowed for that.
        assert!(
            at_end.fds <= at_warm.fds + CLIENTS / 4 + stack.upstreams().count(),
            "{name}: file descriptors grew {at_warm} → {at_end}"
        );
    }
}

#[test]
fn sigterm_under_saturation_drains_without_failing_or_losing_a_request() {
    // One at a time: each saturates the machine.
    let _alone = one_at_a_time();
    let mut stack = stack(&["--drain-delay-ms", "1500"]);
    let stop = AtomicBool::new(false);
    let port = stack.port();
    let (outcomes, signalled, exited, status) = std::thread::scope(|scope| {
        let load = scope.spawn(|| load::run(&plan(port, Duration::from_secs(60)), &stop));
        // Deliberate windows of load: 3 s before SIGTERM, 2 s after the exit.
        std::thread::sleep(Duration::from_secs(3));
        let signalled = Instant::now();
        let status = stack.batcher_mut().terminate();
        let exited = Instant::now();
        std::thread::sleep(Duration::from_secs(2));
        stop.store(true, Ordering::Relaxed);
        (load.join().unwrap(), signalled, exited, status)
    });
    let status = status.expect("the batcher was running");
    let before = window(&outcomes, outcomes[0].started, signalled);
    let draining = window(&outcomes, signalled, exited);
    let after = window(&outcomes, exited, Instant::now());
    let via_front = |o: &[Outcome]| o.iter().filter(|o| o.batched).count();
    println!(
        "SIGTERM under load: {} requests; before {} ({} via the front, p99 {:?}); draining {:?}: {} ({} via the front, p99 {:?}); after exit {} ({} via the front, p99 {:?})",
        outcomes.len(),
        before.len(),
        via_front(&before),
        percentile(latencies(&before), 0.99),
        exited - signalled,
        draining.len(),
        via_front(&draining),
        percentile(latencies(&draining), 0.99),
        after.len(),
        via_front(&after),
        percentile(latencies(&after), 0.99),
    );
    assert!(status.success(), "exits 0 after draining: {status}");
    assert_all_answered_and_counted(&outcomes, &stack);
    assert!(via_front(&before) > 0, "the front served before SIGTERM");
    assert!(!after.is_empty(), "load continued after the batcher exited");
    assert_eq!(
        via_front(&after),
        0,
        "after exit, the replicas answer directly"
    );
}
