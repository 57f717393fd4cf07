//! The endpoint picker deciding on the engines' own account of their caches
//! (docs/KV-EVENTS.md, "Exact residency in decisions"): two `cohort engine-sim` replicas
//! publishing vLLM-format KV events, `cohort serve` following them with
//! `[kv_events] prompt_tokens = "engine-sim"`, and real Envoy's ext_proc asking its picker.
//!
//! 1. A prompt goes to one replica, and its repeat follows it there (prefix).
//! 2. That replica evicts the prompt (a long prompt sent to it directly fills its small
//!    cache) and the other replica gains it (sent to it directly): the batcher's model still
//!    says the first holds it, the engines say otherwise, and the next request goes where
//!    the engines say.
//! 3. The replica holding it resets its prefix cache (`AllBlocksCleared`): the next decision
//!    drops what the batcher's model had recorded there.

use cohort_tests::batcher::{Batcher, BatcherSpec};
use cohort_tests::client::{self, post_json};
use cohort_tests::engine_sim::SimFleet;
use cohort_tests::envoy::Envoy;
use cohort_tests::free_port;
use serde_json::json;
use std::time::Duration;

const CHAT: &str = "/v1/chat/completions";

fn chat(system: &str, user: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"model": "m", "max_tokens": 2, "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": user},
    ]}))
    .unwrap()
}

/// Sends `body` to `port` and returns the simulated replica that answered.
fn served_by(port: u16, body: &[u8]) -> usize {
    let response = post_json(port, CHAT, &[], body);
    assert_eq!(response.status, 200, "{}", response.text());
    response
        .header("x-sim-replica")
        .and_then(|r| r.parse().ok())
        .expect("x-sim-replica")
}

fn wait(what: &str, batcher: &Batcher, done: impl Fn() -> bool) {
    batcher.wait_until(what, Duration::from_secs(10), done);
}

#[test]
fn the_picker_follows_what_the_engines_say_they_hold() {
    // Two replicas of 64 blocks of 16 tokens (4 KB of prompt each), events on four ports
    // from a free base (PUB and replay per replica).
    let (sim, base) = cohort_tests::with_port_retries("engine-sim with KV events", |_| {
        let base = free_port();
        SimFleet::start(
            2,
            &[
                "--time-scale".into(),
                "0.01".into(),
                "--kv-blocks".into(),
                "64".into(),
                "--kv-events-port".into(),
                base.to_string(),
            ],
        )
        .map(|sim| (sim, base))
    });
    let replica = |i: usize| {
        format!(
            "[[replicas]]\nname = \"replica-{i}\"\nurl = \"http://127.0.0.1:{}\"\nengine = \"vllm\"\n\
             kv_events = \"tcp://127.0.0.1:{}\"\nkv_events_replay = \"tcp://127.0.0.1:{}\"\n",
            sim.ports[i],
            base + 2 * i as u16,
            base + 2 * i as u16 + 1
        )
    };
    let config = std::env::temp_dir().join(format!("cohort-exact-residency-{}.toml", free_port()));
    std::fs::write(
        &config,
        format!(
            "drain_delay_ms = 100\n{}{}\
             [kv_events]\nblock_size = 16\nprompt_tokens = \"engine-sim\"\npending_ms = 300\n",
            replica(0),
            replica(1)
        ),
    )
    .unwrap();
    let batcher = Batcher::start(BatcherSpec {
        grpc_port: free_port(),
        http_port: free_port(),
        replicas: Vec::new(),
        shard_index: 0,
        shard_count: 1,
        front_port: Some(free_port()),
        picker_port: Some(free_port()),
        extra_args: vec!["--config".into(), config.display().to_string()],
    });
    let envoy = Envoy::start(&Envoy::endpoint_picker_config(
        batcher.spec.picker_port.unwrap(),
        &sim.ports,
    ));
    let metric = |series: &str| batcher.metric(series);
    let held = |i: usize| {
        metric(&format!(
            "cohort_kv_events_blocks_held{{replica=\"replica-{i}\"}}"
        ))
    };
    let modelled = |i: usize| {
        metric(&format!(
            "cohort_replica_prefix_blocks{{replica=\"replica-{i}\"}}"
        ))
    };
    wait(
        "both replicas probed and both streams healthy",
        &batcher,
        || {
            (0..2).all(|i| {
                metric(&format!(
                    "cohort_kv_events_healthy{{replica=\"replica-{i}\"}}"
                )) == 1.0
            }) && metric("cohort_picker_requests_total{outcome=\"unavailable\"}") == 0.0
        },
    );

    // 1. A 1.6 KB system prompt (25 blocks of 16 tokens) lands somewhere; its repeat follows.
    let system = "You are the refunds desk of Example Corp. Cite the policy number. ".repeat(24);
    let prompt = chat(&system, "Where is my refund?");
    let home = served_by(envoy.listen_port, &prompt);
    let other = 1 - home;
    wait("the engine published the prompt's blocks", &batcher, || {
        held(home) >= 25.0
    });
    assert_eq!(
        served_by(envoy.listen_port, &chat(&system, "And the second one?")),
        home
    );
    assert!(metric("cohort_assign_residency_total{residency=\"events\"}") >= 2.0);
    assert!(metric("cohort_picker_prompt_tokens_total{outcome=\"keyed\"}") >= 2.0);
    assert_eq!(
        metric("cohort_picker_prompt_tokens_total{outcome=\"failed\"}"),
        0.0
    );
    assert!(modelled(home) > 0.0);

    // 2. `home` evicts it (6 KB of another prompt, sent to it directly, fill its 64
    // blocks) and `other` gains it (sent to it directly): the batcher sent neither.
    let applied = |i: usize| {
        metric(&format!(
            "cohort_kv_events_applied_total{{replica=\"replica-{i}\"}}"
        ))
    };
    let before = applied(home);
    let flood = chat(
        &"An unrelated long document about shipping rates. ".repeat(120),
        "Summarise.",
    );
    assert_eq!(served_by(sim.ports[home], &flood), home);
    assert_eq!(served_by(sim.ports[other], &prompt), other);
    wait(
        "the eviction and the other replica's blocks reached the batcher",
        &batcher,
        || applied(home) > before && held(other) >= 25.0,
    );
    // Past `pending_ms`: what the batcher sent `home` no longer counts over its events.
    std::thread::sleep(Duration::from_millis(400));
    let modelled_home = modelled(home);
    assert!(
        modelled_home > 0.0,
        "the model still believes {home} holds the prompt"
    );
    let by_prefix = || metric("cohort_assign_reason_total{reason=\"prefix\"}");
    let prefix_before = by_prefix();
    assert_eq!(
        served_by(envoy.listen_port, &chat(&system, "And the third one?")),
        other,
        "the engines' account (evicted on {home}, held on {other}) decides, not the model\n{}",
        batcher.log()
    );
    assert_eq!(
        by_prefix(),
        prefix_before + 1.0,
        "chosen for the longer prefix: what `home` was sent counts no more (pending_ms)"
    );

    // 3. `other` resets its prefix cache: the next decision forgets what the batcher had
    // recorded there (the request's blocks, and the one before).
    assert!(modelled(other) > 0.0);
    let reset = client::request(sim.ports[other], "POST", "/reset_prefix_cache", &[], b"")
        .expect("reset_prefix_cache");
    assert_eq!(reset.status, 200);
    wait("AllBlocksCleared reached the batcher", &batcher, || {
        held(other) == 0.0
    });
    served_by(envoy.listen_port, &chat("Short.", "hi"));
    assert!(
        modelled(other) <= 1.0,
        "replica-{other}'s modelled blocks after its engine cleared: {}",
        modelled(other)
    );
    drop(envoy);
    drop(batcher);
    let _ = std::fs::remove_file(&config);
}
