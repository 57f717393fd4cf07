//! The ZeroMQ subscriber against a publisher that behaves like vLLM's (a PUB socket and a
//! ROUTER replay socket keeping every batch): a batch held back from the live stream is
//! replayed and applied in order, and a restart (the sequence back at 0) drops the
//! residency. Both sides use the pure-Rust `zeromq` crate; pyzmq is not in this
//! repository's Python environment, so the test against vLLM's own publisher runs with the
//! vLLM fleet.
#![cfg(all(feature = "subscriber", feature = "testing"))]

mod common;

use cohort_kv_events::replica::{Outcome, ReplicaConfig, ReplicaEvents};
use cohort_kv_events::residency::prefix_keys;
use cohort_kv_events::stream::ResetReason;
use cohort_kv_events::subscriber::{run, FrameCounters, SubscriberConfig};
use cohort_kv_events::testing::zmq_message as message;
use common::*;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend};

const BS: u32 = 4;

type Buffer = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;

/// vLLM's replay service: every kept batch from the requested number on, then the end
/// marker, as `[identity, "", seq, payload]`.
async fn serve_replays(mut router: RouterSocket, buffer: Buffer) {
    while let Ok(request) = router.recv().await {
        let frames = request.into_vec();
        let [identity, _, start] = &frames[..] else {
            continue;
        };
        let start = u64::from_be_bytes(start[..].try_into().unwrap());
        let batches: Vec<(u64, Vec<u8>)> = buffer
            .lock()
            .unwrap()
            .iter()
            .filter(|(seq, _)| *seq >= start)
            .cloned()
            .collect();
        for (seq, payload) in batches.into_iter().chain([(u64::MAX, Vec::new())]) {
            let reply = message(vec![
                identity.to_vec(),
                Vec::new(),
                seq.to_be_bytes().to_vec(),
                payload,
            ]);
            router.send(reply).await.unwrap();
        }
    }
}

/// Waits until `done` holds of the replica, for at most 10 s.
async fn until(replica: &Mutex<ReplicaEvents>, done: impl Fn(&ReplicaEvents) -> bool) {
    let start = Instant::now();
    while !done(&replica.lock().unwrap()) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out: {:?}",
            replica.lock().unwrap().counters()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn hit(r: &ReplicaEvents, i: u32) -> usize {
    r.residency()
        .held_prefix_blocks(&prefix_keys(&prompt(i, BS), BS as usize))
}

#[tokio::test]
async fn a_held_back_batch_is_replayed_and_a_restart_drops_the_residency() {
    let mut publisher = PubSocket::new();
    let endpoint = publisher.bind("tcp://127.0.0.1:0").await.unwrap();
    let mut router = RouterSocket::new();
    let replay_endpoint = router.bind("tcp://127.0.0.1:0").await.unwrap();
    let buffer: Buffer = Arc::default();
    tokio::spawn(serve_replays(router, buffer.clone()));

    let replica = Arc::new(Mutex::new(ReplicaEvents::new(
        &ReplicaConfig::new(BS),
        Instant::now(),
    )));
    let counters = Arc::new(Mutex::new(FrameCounters::default()));
    let outcomes: Arc<Mutex<Vec<Outcome>>> = Arc::default();
    let config = SubscriberConfig {
        endpoint: endpoint.to_string(),
        replay_endpoint: Some(replay_endpoint.to_string()),
        topic: String::new(),
        tick: Duration::from_millis(50),
    };
    {
        let (replica, counters, outcomes) = (replica.clone(), counters.clone(), outcomes.clone());
        tokio::spawn(async move {
            run(&config, replica, counters, |o| {
                outcomes.lock().unwrap().push(o.clone())
            })
            .await
        });
    }
    // Let the subscription reach the publisher (a PUB drops what it sends before).
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Batches 0, 1 and 3 go out live; 2 only into the replay buffer.
    for seq in 0..4u64 {
        let payload = store(seq as u32, BS);
        buffer.lock().unwrap().push((seq, payload.clone()));
        if seq != 2 {
            let frames = vec![Vec::new(), seq.to_be_bytes().to_vec(), payload];
            publisher.send(message(frames)).await.unwrap();
        }
    }
    until(&replica, |r| (0..4).all(|i| hit(r, i) == 2)).await;
    {
        let r = replica.lock().unwrap();
        assert!(r.counters().replays >= 1, "{:?}", r.counters());
        assert_eq!(r.counters().gaps_lost, 0);
        assert!(r.complete());
        assert!(r.health().is_healthy());
    }
    assert!(outcomes
        .lock()
        .unwrap()
        .iter()
        .any(|o| o.replay_from == Some(2) || o.replay_from == Some(0)));

    // The engine restarts: its sequence starts again at 0, with a new cache.
    buffer.lock().unwrap().clear();
    buffer.lock().unwrap().push((0, store(7, BS)));
    publisher
        .send(message(vec![
            Vec::new(),
            0u64.to_be_bytes().to_vec(),
            store(7, BS),
        ]))
        .await
        .unwrap();
    until(&replica, |r| hit(r, 7) == 2).await;
    let r = replica.lock().unwrap();
    assert_eq!((hit(&r, 0), hit(&r, 3)), (0, 0));
    assert_eq!(r.counters().restarts, 1);
    assert!(outcomes
        .lock()
        .unwrap()
        .iter()
        .any(|o| o.resets.contains(&ResetReason::Restart)));
    assert_eq!(*counters.lock().unwrap(), FrameCounters::default());
}

#[tokio::test]
async fn a_replay_socket_that_is_down_loses_the_gap_without_holding_the_stream() {
    let mut publisher = PubSocket::new();
    let endpoint = publisher.bind("tcp://127.0.0.1:0").await.unwrap();
    // Nothing listens there: zeromq would keep trying to connect for 30 s.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let replay_endpoint = format!("tcp://{}", closed.local_addr().unwrap());
    drop(closed);
    let replica = Arc::new(Mutex::new(ReplicaEvents::new(
        &ReplicaConfig::new(BS),
        Instant::now(),
    )));
    let counters = Arc::new(Mutex::new(FrameCounters::default()));
    let config = SubscriberConfig {
        endpoint: endpoint.to_string(),
        replay_endpoint: Some(replay_endpoint),
        topic: String::new(),
        tick: Duration::from_millis(50),
    };
    {
        let (replica, counters) = (replica.clone(), counters.clone());
        tokio::spawn(async move { run(&config, replica, counters, |_| {}).await });
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    // Batch 1 never comes: the gap asks the (dead) replay socket.
    for seq in [0u64, 2, 3] {
        let frames = vec![
            Vec::new(),
            seq.to_be_bytes().to_vec(),
            store(seq as u32, BS),
        ];
        publisher.send(message(frames)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    until(&replica, |r| r.counters().gaps_lost >= 1 && hit(r, 3) == 2).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the live stream waited {:?}",
        started.elapsed()
    );
    assert!(counters.lock().unwrap().replay_failures >= 1);
}
