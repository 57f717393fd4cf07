//! The simulator's KV events end to end: a replica with events on, fed chat requests over
//! HTTP, followed by `cohort-kv-events`' own ZeroMQ subscriber. The residency index built
//! from the stream must agree with the simulator: the blocks it holds (`/sim/stats`), the
//! cached tokens it answers (each request's `usage`, predicted from the index beforehand),
//! a shared prefix held once stored and gone once the LRU evicts it, and a cache reset.
//! A replay from 0 returns every kept batch, then the end marker.

mod common;

use cohort_engine_sim::cost::CostModel;
use cohort_engine_sim::render::render_messages;
use cohort_engine_sim::server::{bind_with, KvEventsConfig, SimConfig};
use cohort_engine_sim::tokenizer::tokenize;
use cohort_kv_events::decode::decode;
use cohort_kv_events::frames;
use cohort_kv_events::replica::{ReplicaConfig, ReplicaEvents};
use cohort_kv_events::residency::prefix_keys;
use cohort_kv_events::stream::END_OF_REPLAY;
use cohort_kv_events::subscriber::{run, FrameCounters, SubscriberConfig};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

const BLOCK: usize = 4;
const KV_BLOCKS: usize = 24;
const TOPIC: &str = "sim";

const COST: CostModel = CostModel {
    prefill_base_ms: 1.0,
    prefill_ms_per_token: 0.01,
    prefill_attention_ms: 0.0,
    decode_ms_per_token: 0.5,
    decode_batch_slowdown: 0.0,
};

const SYSTEM: &str = "You are the assistant of the refunds desk. Answer in one short sentence, \
     name the order number, never promise a date, and point to the refunds page when unsure.";

fn config(buffer_steps: usize) -> (SimConfig, KvEventsConfig) {
    let sim = SimConfig {
        replicas: 1,
        host: "127.0.0.1".to_owned(),
        base_port: 0,
        kv_blocks: KV_BLOCKS,
        block_tokens: BLOCK,
        slots: 4,
        model: "sim-model".to_owned(),
        max_model_len: 8192,
        time_scale: 1.0,
        cost: COST,
        calibration: json!({"source": "test"}),
    };
    let events = KvEventsConfig {
        base_port: 0,
        topic: TOPIC.to_owned(),
        buffer_steps,
    };
    (sim, events)
}

/// One HTTP/1.0 exchange: the status and the JSON body (null when it is not JSON).
async fn call(port: u16, method: &str, path: &str, body: &str) -> (u16, Value) {
    let reply = common::call(port, method, path, body).await;
    (
        reply.status,
        serde_json::from_str(&reply.body).unwrap_or(Value::Null),
    )
}

fn messages(user: &str) -> Value {
    json!([{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}])
}

/// The prompt's tokens as the simulator sees them, and their block keys as a router would
/// compute them.
fn keys(user: &str) -> (Vec<u32>, Vec<u64>) {
    let tokens = tokenize(&render_messages(&messages(user)).unwrap());
    let keys = prefix_keys(&tokens, BLOCK);
    (tokens, keys)
}

/// Sends one chat request; returns its cached tokens.
async fn chat(port: u16, user: &str) -> u64 {
    let body = json!({"messages": messages(user), "max_tokens": 2}).to_string();
    let (status, reply) = call(port, "POST", "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{reply}");
    reply["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap()
}

async fn server_info(port: u16) -> Value {
    call(port, "GET", "/server_info", "").await.1
}

async fn blocks_used(port: u16) -> usize {
    let stats = call(port, "GET", "/sim/stats", "").await.1;
    stats["replicas"][0]["kv_blocks_used"].as_u64().unwrap() as usize
}

/// Waits until the subscriber has applied every batch the replica published.
async fn caught_up(port: u16, replica: &Mutex<ReplicaEvents>) {
    let published = server_info(port).await["kv_events"]["published"]
        .as_u64()
        .unwrap();
    let start = Instant::now();
    while replica.lock().unwrap().counters().applied < published {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{published} published, not applied in 10 s: {:?}",
            replica.lock().unwrap().counters()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What the index says a prompt would find cached: its held leading blocks, capped as the
/// engine caps a hit (at least one token computed, whole blocks).
fn predicted_cached(replica: &Mutex<ReplicaEvents>, tokens: &[u32], keys: &[u64]) -> u64 {
    let held = replica.lock().unwrap().residency().held_prefix_blocks(keys) * BLOCK;
    let cap = (tokens.len() - 1) / BLOCK * BLOCK;
    held.min(cap) as u64
}

#[tokio::test]
async fn the_residency_built_from_the_stream_agrees_with_the_simulator() {
    let (sim_config, events_config) = config(1000);
    let sim = bind_with(sim_config, Some(events_config)).await.unwrap();
    let port = sim.ports()[0];
    let events_ports = sim.kv_events_ports()[0];
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(sim.serve(async move {
        let _ = stop_rx.await;
    }));
    let info = server_info(port).await;
    assert_eq!(
        info["kv_events"]["endpoint"],
        format!("tcp://127.0.0.1:{}", events_ports.publish)
    );

    let replica = Arc::new(Mutex::new(ReplicaEvents::new(
        &ReplicaConfig::new(BLOCK as u32),
        Instant::now(),
    )));
    let counters = Arc::new(Mutex::new(FrameCounters::default()));
    let subscriber = {
        let config = SubscriberConfig {
            endpoint: format!("tcp://127.0.0.1:{}", events_ports.publish),
            replay_endpoint: Some(format!("tcp://127.0.0.1:{}", events_ports.replay)),
            topic: TOPIC.to_owned(),
            tick: Duration::from_millis(50),
        };
        let (replica, counters) = (Arc::clone(&replica), Arc::clone(&counters));
        tokio::spawn(async move { run(&config, replica, counters, |_| {}).await })
    };

    // A PUB socket drops what it sends before the subscription reaches it: reset the empty
    // cache (one `AllBlocksCleared` batch each) until one is applied. Those sent earlier come
    // back through the replay a late join asks for.
    let start = Instant::now();
    while replica.lock().unwrap().counters().applied == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never subscribed"
        );
        let (status, _) = call(port, "POST", "/reset_prefix_cache", "").await;
        assert_eq!(status, 200);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    caught_up(port, &replica).await;

    // Two prompts sharing a long system prompt: the second finds the shared blocks cached,
    // as the index predicts.
    let (a_tokens, a_keys) = keys("Where is my refund for order 1?");
    let (b_tokens, b_keys) = keys("Where is my refund for order 2?");
    let shared = a_keys
        .iter()
        .zip(&b_keys)
        .take_while(|(a, b)| a == b)
        .count();
    assert!(
        shared >= 10 && a_keys.len() < KV_BLOCKS,
        "{shared} shared blocks"
    );
    assert_eq!(predicted_cached(&replica, &a_tokens, &a_keys), 0);
    assert_eq!(chat(port, "Where is my refund for order 1?").await, 0);
    caught_up(port, &replica).await;
    {
        let r = replica.lock().unwrap();
        assert_eq!(r.residency().held_prefix_blocks(&a_keys), a_keys.len());
        assert_eq!(r.residency().held_prefix_blocks(&b_keys), shared);
    }
    let predicted = predicted_cached(&replica, &b_tokens, &b_keys);
    assert_eq!(predicted, (shared * BLOCK) as u64);
    assert_eq!(
        chat(port, "Where is my refund for order 2?").await,
        predicted
    );
    caught_up(port, &replica).await;
    assert_eq!(
        replica
            .lock()
            .unwrap()
            .residency()
            .held_prefix_blocks(&b_keys),
        b_keys.len()
    );
    let used = blocks_used(port).await;
    assert_eq!(replica.lock().unwrap().residency().len(), used);

    // Distinct prompts fill the cache: the LRU evicts the shared prefix, tail first.
    let mut evicted_some = false;
    for i in 0..4 {
        let user = format!("Unrelated question {i}");
        let distinct = format!("{i}{i}{i}{i} {}", SYSTEM.to_uppercase());
        let body = [("system", distinct.as_str()), ("user", user.as_str())];
        let msgs: Vec<Value> = body
            .iter()
            .map(|(role, content)| json!({"role": role, "content": content}))
            .collect();
        let request = json!({"messages": msgs, "max_tokens": 2}).to_string();
        let (status, _) = call(port, "POST", "/v1/chat/completions", &request).await;
        assert_eq!(status, 200);
        caught_up(port, &replica).await;
        let used = blocks_used(port).await;
        let r = replica.lock().unwrap();
        assert_eq!(r.residency().len(), used);
        let held = r.residency().held_prefix_blocks(&a_keys);
        evicted_some |= held < a_keys.len();
    }
    assert!(evicted_some);
    {
        let r = replica.lock().unwrap();
        assert_eq!(
            r.residency().held_prefix_blocks(&a_keys),
            0,
            "the shared prefix is gone"
        );
        assert!(r.counters().blocks.removed > 0);
        assert_eq!(r.counters().gaps_lost, 0);
        assert_eq!(r.counters().malformed, 0);
        assert_eq!(r.counters().blocks.orphans, 0);
        assert!(r.complete());
        assert!(r.health().is_healthy());
    }
    // The simulator agrees: A again finds nothing cached.
    assert_eq!(predicted_cached(&replica, &a_tokens, &a_keys), 0);
    assert_eq!(chat(port, "Where is my refund for order 1?").await, 0);
    caught_up(port, &replica).await;

    // A reset clears both.
    let (status, body) = call(port, "POST", "/reset_prefix_cache", "").await;
    assert_eq!((status, body), (200, json!({"success": true})));
    caught_up(port, &replica).await;
    assert!(replica.lock().unwrap().residency().is_empty());
    assert_eq!(blocks_used(port).await, 0);
    assert_eq!(*counters.lock().unwrap(), FrameCounters::default());

    // A replay from 0 returns every batch, in order, then the end marker.
    let published = server_info(port).await["kv_events"]["published"]
        .as_u64()
        .unwrap();
    let replies = replay(events_ports.replay, 0).await;
    let (end, batches) = replies.split_last().unwrap();
    assert_eq!(
        end,
        &vec![Vec::new(), Vec::new(), vec![0xff; 8], Vec::new()],
        "the end marker"
    );
    let seqs: Vec<u64> = batches
        .iter()
        .map(|frames| {
            assert_eq!(frames[1], TOPIC.as_bytes());
            let (seq, payload) = frames::replay(frames).unwrap();
            decode(payload).unwrap();
            seq
        })
        .collect();
    assert_eq!(seqs, (0..published).collect::<Vec<_>>());

    // Shutdown ends the sockets' task with a subscriber still connected.
    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the server and its sockets stop")
        .unwrap()
        .unwrap();
    subscriber.abort();
}

/// Asks the replay socket for every kept batch from `start`; returns the replies' frames
/// as the DEALER sees them, through the end marker.
async fn replay(port: u16, start: u64) -> Vec<Vec<Vec<u8>>> {
    let mut dealer = DealerSocket::new();
    dealer
        .connect(&format!("tcp://127.0.0.1:{port}"))
        .await
        .unwrap();
    let [delimiter, first] = frames::replay_request(start);
    let mut request = ZmqMessage::from(delimiter);
    request.push_back(first.into());
    dealer.send(request).await.unwrap();
    let mut replies = Vec::new();
    loop {
        let reply = tokio::time::timeout(Duration::from_secs(10), dealer.recv())
            .await
            .expect("a replay reply in 10 s")
            .unwrap();
        let frames: Vec<Vec<u8>> = reply.into_vec().iter().map(|f| f.to_vec()).collect();
        let seq = frames::replay(&frames).unwrap().0;
        replies.push(frames);
        if seq == END_OF_REPLAY {
            return replies;
        }
    }
}

#[tokio::test]
async fn a_replay_returns_only_the_batches_kept() {
    let (sim_config, events_config) = config(3);
    let sim = bind_with(sim_config, Some(events_config)).await.unwrap();
    let port = sim.ports()[0];
    let replay_port = sim.kv_events_ports()[0].replay;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(sim.serve(async move {
        let _ = stop_rx.await;
    }));
    for _ in 0..5 {
        let (status, _) = call(port, "POST", "/reset_prefix_cache", "").await;
        assert_eq!(status, 200);
    }
    let seqs = |replies: &[Vec<Vec<u8>>]| -> Vec<u64> {
        replies
            .iter()
            .map(|frames| frames::replay(frames).unwrap().0)
            .collect()
    };
    assert_eq!(
        seqs(&replay(replay_port, 0).await),
        [2, 3, 4, END_OF_REPLAY]
    );
    assert_eq!(seqs(&replay(replay_port, 4).await), [4, END_OF_REPLAY]);
    assert_eq!(seqs(&replay(replay_port, 9).await), [END_OF_REPLAY]);
    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the server and its sockets stop")
        .unwrap()
        .unwrap();
}
