//! `cohort serve` following a replica's KV events (docs/BATCHER.md, "KV events"): a
//! publisher built like vLLM's (a ZeroMQ PUB socket and a ROUTER replay socket keeping
//! every message) sends the real vLLM 0.32.0 recording
//! (`batcher-service/kv-events/tests/fixtures/vllm/stream.jsonl`) to the real binary,
//! configured with the endpoints in its TOML. A message held back from the live stream
//! is replayed; `/metrics` and `/ui/api/state` show the stream; a publisher that goes
//! silent turns it unhealthy, logged once.

use cohort_kv_events::testing::{recording as recorded, serve_replays, zmq_message as message};
use cohort_tests::batcher::{Batcher, BatcherSpec};
use cohort_tests::{client, free_port};
use serde_json::Value;
use std::time::{Duration, Instant};
use zeromq::{PubSocket, RouterSocket, Socket, SocketSend};

fn wait(what: &str, batcher: &Batcher, done: impl Fn() -> bool) {
    batcher.wait_until(what, Duration::from_secs(5), done);
}

fn replicas(batcher: &Batcher) -> Vec<Value> {
    let page = client::request(batcher.spec.http_port, "GET", "/ui/api/state", &[], b"")
        .expect("GET /ui/api/state")
        .text();
    let state: Value = serde_json::from_str(&page).unwrap();
    state["replicas"].as_array().unwrap().clone()
}

#[test]
fn cohort_serve_follows_a_replicas_kv_events_and_shows_them() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let recording = recorded("stream.jsonl");
    let (mut publisher, endpoint, replay_endpoint) = runtime.block_on(async {
        let mut publisher = PubSocket::new();
        let endpoint = publisher.bind("tcp://127.0.0.1:0").await.unwrap();
        let mut router = RouterSocket::new();
        let replay = router.bind("tcp://127.0.0.1:0").await.unwrap();
        tokio::spawn(serve_replays(router, recording.clone()));
        (publisher, endpoint.to_string(), replay.to_string())
    });
    let config = std::env::temp_dir().join(format!("cohort-kv-events-{}.toml", free_port()));
    std::fs::write(
        &config,
        format!(
            "drain_delay_ms = 100\n\
             [[replicas]]\nname = \"r0\"\nkv_events = \"{endpoint}\"\nkv_events_replay = \"{replay_endpoint}\"\n\
             [[replicas]]\nname = \"r1\"\n\
             [kv_events]\nblock_size = 128\ntopic = \"kv\"\nsilence_s = 1\n"
        ),
    )
    .unwrap();
    let mut batcher = Batcher::start(BatcherSpec {
        grpc_port: free_port(),
        http_port: free_port(),
        replicas: Vec::new(),
        shard_index: 0,
        shard_count: 1,
        front_port: None,
        picker_port: None,
        extra_args: vec!["--config".into(), config.display().to_string()],
    });
    let applied = || batcher.metric("cohort_kv_events_applied_total{replica=\"r0\"}");
    let mut send = |frames: &Vec<Vec<u8>>| {
        runtime
            .block_on(publisher.send(message(frames.clone())))
            .unwrap()
    };
    // A PUB drops what it sends before the subscription reaches it: message 0 goes out
    // until it is applied.
    let deadline = Instant::now() + Duration::from_secs(5);
    while applied() == 0.0 {
        assert!(
            Instant::now() < deadline,
            "never subscribed:\n{}",
            batcher.log()
        );
        send(&recording[0]);
        std::thread::sleep(Duration::from_millis(100));
    }
    // The rest goes out live but for message 3, which only the replay socket has.
    for (seq, frames) in recording.iter().enumerate().skip(1) {
        if seq != 3 {
            send(frames);
        }
    }
    wait("all nine applied", &batcher, || applied() == 9.0);
    let metric = |series: &str| batcher.metric(&format!("{series}{{replica=\"r0\"}}"));
    assert!(metric("cohort_kv_events_replays_total") >= 1.0);
    assert_eq!(metric("cohort_kv_events_gaps_lost_total"), 0.0);
    assert_eq!(
        metric("cohort_kv_events_blocks_held"),
        3.0,
        "after the reset, the last prompt's blocks"
    );
    assert_eq!(metric("cohort_kv_events_healthy"), 1.0);
    assert!(metric("cohort_kv_events_last_message_age_seconds") < 1.0);
    let page = batcher.metrics();
    assert!(
        !page
            .lines()
            .any(|l| l.starts_with("cohort_kv_events") && l.contains("replica=\"r1\"")),
        "no stream, no series: {page}"
    );
    let rows = replicas(&batcher);
    let (r0, r1) = (&rows[0]["kv_events"], &rows[1]["kv_events"]);
    assert_eq!(r0["health"], "healthy", "{r0}");
    assert_eq!(
        (r0["blocks_held"].as_u64(), r0["totals"]["applied"].as_u64()),
        (Some(3), Some(9)),
        "{r0}"
    );
    assert_eq!(*r1, Value::Null, "r1 has no kv_events endpoint");

    // The publisher goes quiet: past silence_s the stream is unhealthy, logged once.
    wait("silent", &batcher, || {
        metric("cohort_kv_events_healthy") == 0.0
    });
    let rows = replicas(&batcher);
    let r0 = &rows[0]["kv_events"];
    assert_eq!(r0["health"], "degraded (silent)", "{r0}");
    assert!(r0["lag_s"].as_f64().unwrap() >= 1.0, "{r0}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        batcher.log().matches("KV events stream degraded").count(),
        1,
        "{}",
        batcher.log()
    );
    let status = batcher.terminate().expect("it was running");
    assert!(status.success(), "{status:?}\n{}", batcher.log());
    let _ = std::fs::remove_file(config);
}
