//! The knobs in batch mode, through real Envoy with the real filter, real `cohort serve`
//! (gRPC and the HTTP front) and two recording engines:
//!
//! - `x-cohort-batch-threshold` picks the codebook level that keys a bare prompt, so it
//!   decides which bare prompts share a batch: two paraphrases in one coarse cell are
//!   leader and follower at 0.1, and two leaders at 0.9 (the front joins them on the key
//!   alone with `min_shared = 0`: bare prompts share no prefix blocks);
//! - with the filter's learned cohorts, paraphrases the codebook splits share a batch;
//! - the filter writes the prefetch level its knob policy allowed for the front.
//!
//! Needs `scripts/setup` (Envoy), `scripts/build-wasm` (the filter) and the `cohort`
//! binary; `scripts/test` does all three.

use cohort_fingerprint::{fingerprint, Request};
use cohort_tests::client::post_json;
use cohort_tests::stack::{Replicas, Stack};
use cohort_tests::{eventually, one_at_a_time, stays, QUIET_WINDOW};
use serde_json::json;
use std::time::Duration;

const CHAT: &str = "/v1/chat/completions";

fn chat(user: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"model": "m", "messages": [{"role": "user", "content": user}]}))
        .unwrap()
}

/// The routing key the filter gives a bare prompt at `threshold` (unsalted: no tenant).
fn key(text: &str, threshold: f32) -> u64 {
    let body = chat(text);
    let request = Request {
        path: Some(CHAT),
        batch_threshold: threshold,
        ..Request::new(&body)
    };
    fingerprint(&request).unwrap().routing_key.0
}

/// Two paraphrases that share a cohort at 0.1 and not at 0.9.
fn coarse_pair() -> (&'static str, &'static str) {
    const PROMPTS: [&str; 10] = [
        "how do I get a refund for my order",
        "I want my money back for this purchase",
        "can you cancel my order and refund me",
        "please return the money for the item I bought",
        "what is the status of my refund",
        "my card was charged twice, I need a refund",
        "how long does a refund take to arrive",
        "refund the payment for my last order",
        "I returned the product, where is my refund",
        "give me my money back",
    ];
    for (i, a) in PROMPTS.iter().enumerate() {
        for b in &PROMPTS[i + 1..] {
            if key(a, 0.1) == key(b, 0.1) && key(a, 0.9) != key(b, 0.9) {
                return (a, b);
            }
        }
    }
    panic!("no pair of the prompts shares a coarse cell and splits at the finest level");
}

/// Two recording vLLM-adapter engines behind Envoy in batch mode, with the filter's
/// configuration `filter` over the defaults; the front joins on the key alone
/// (`min_shared = 0`) within a 1 s window.
fn stack(filter: serde_json::Value) -> Stack {
    let stack = Stack::batch()
        .upstreams(2)
        .replicas(Replicas::Adapter("vllm"))
        .serve_toml("[batch]\nmin_shared = 0.0\nwindow_ms = 1000\n")
        .filter(json!({"assign_deadline_ms": 2000}))
        .filter(filter)
        .start();
    for engine in stack.upstreams() {
        // The leader's first byte comes late: its batch stays open for the follower.
        engine.set_delay(Duration::from_millis(600));
    }
    stack
}

/// Sends `a`, then `b` 50 ms later, both with `headers`; returns their batch roles.
fn roles(stack: &Stack, a: &str, b: &str, headers: &[(&str, &str)]) -> (String, String) {
    let send = |text: &str| {
        let response = post_json(stack.port(), CHAT, headers, &chat(text));
        assert_eq!(response.status, 200, "{}", response.text());
        let role = response.header("x-cohort-batch").unwrap_or_default();
        role.split(';').next().unwrap_or_default().to_owned()
    };
    std::thread::scope(|scope| {
        let first = scope.spawn(|| send(a));
        // Deliberate window: the second arrives 50 ms after the first, inside its window.
        std::thread::sleep(Duration::from_millis(50));
        let second = scope.spawn(|| send(b));
        (first.join().unwrap(), second.join().unwrap())
    })
}

#[test]
fn the_batch_threshold_decides_which_bare_prompts_share_a_batch() {
    let _serial = one_at_a_time();
    let (a, b) = coarse_pair();
    let stack = stack(json!({}));
    let coarse = roles(&stack, a, b, &[("x-cohort-batch-threshold", "0.1")]);
    assert_eq!(
        coarse,
        ("leader".to_owned(), "follower".to_owned()),
        "{a:?} and {b:?} are one cohort at 0.1"
    );
    // The coarse batch closed (its 1 s window) before the fine pair comes.
    assert!(eventually(Duration::from_secs(5), || stack
        .batcher()
        .metric("cohort_batches_open")
        == 0.0));
    let fine = roles(&stack, a, b, &[("x-cohort-batch-threshold", "0.9")]);
    assert_eq!(
        fine,
        ("leader".to_owned(), "leader".to_owned()),
        "two cohorts at 0.9"
    );
}

#[test]
fn learned_cohorts_decide_which_bare_prompts_share_a_batch() {
    // Two paraphrases in different codebook cells at the default threshold (cosine 0.68):
    // two leaders by the codebook; with the filter's learned cohorts the second joins the
    // first's cohort, so its key, and it follows.
    let _serial = one_at_a_time();
    let (a, b) = ("where is my new card", "my card has not arrived yet");
    assert_ne!(key(a, 0.5), key(b, 0.5), "different codebook cells");
    let codebook = stack(json!({}));
    assert_eq!(
        roles(&codebook, a, b, &[]),
        ("leader".to_owned(), "leader".to_owned())
    );
    drop(codebook);
    let learned = stack(json!({"learned_cohorts": {}}));
    assert_eq!(
        roles(&learned, a, b, &[]),
        ("leader".to_owned(), "follower".to_owned())
    );
}

/// Three sessions walk "look up" then "refund" (each step its own system prompt), asking
/// for `high` prefetch; returns the warm-ups the front issued by the end of
/// [`QUIET_WINDOW`] after the walks (`expect_none`: checked through the window to stay 0).
fn warmups_after_walks(stack: &Stack, expect_none: bool) -> f64 {
    for session in ["s1", "s2", "s3"] {
        for system in [
            "Look up the customer's order.",
            "Refund the customer's order.",
        ] {
            let body = serde_json::to_vec(&json!({"model": "m", "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": format!("question of {session}")},
            ]}))
            .unwrap();
            let headers = [("x-cohort-session", session), ("x-cohort-prefetch", "high")];
            let response = post_json(stack.port(), CHAT, &headers, &body);
            assert_eq!(response.status, 200);
            // Deliberate window: the walk is paced, 500 ms between steps.
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    let issued = || stack.batcher().metric("cohort_prefetch_issued_total");
    if expect_none {
        assert!(stays(QUIET_WINDOW, || issued() == 0.0), "{}", issued());
    } else {
        eventually(QUIET_WINDOW, || issued() >= 1.0);
    }
    issued()
}

#[test]
fn the_filters_knob_policy_caps_the_prefetch_the_front_acts_on() {
    // The filter writes the level its policy allowed as `x-cohort-prefetch` for the front:
    // capped at `none`, a client's `high` warms nothing. No machine hold: the walks are
    // paced (half a second a step) against recording upstreams, and what is judged is a
    // count, not a latency.
    let capped = stack(json!({"knobs": {"global": {"max_prefetch": "none"}}}));
    assert_eq!(warmups_after_walks(&capped, true), 0.0);
    drop(capped);
    // Positive control: the same walks without the cap are warmed, observed the same way.
    let open = stack(json!({}));
    assert!(warmups_after_walks(&open, false) >= 1.0);
}
