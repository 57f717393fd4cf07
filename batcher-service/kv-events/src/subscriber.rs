//! One replica's KV events subscription over ZeroMQ (feature `subscriber`): a SUB socket on
//! the engine's events endpoint, a DEALER on its replay endpoint when a gap needs one, and
//! a timer, all feeding one [`ReplicaEvents`].
//!
//! The socket code only moves frames: [`crate::frames`] reads them, [`ReplicaEvents`]
//! decides. A replay request is bounded by [`REPLAY_REQUEST_TIMEOUT`], so a replay socket
//! that is down costs the gap, never the live stream. The residency sits behind a mutex the router reads
//! ([`ReplicaEvents::residency`]); the lock is held only while one message is applied,
//! never across an await. Each [`Outcome`] goes to the caller's `notify` (health changes and
//! resets, to count and log). The `zeromq` crate is pure Rust on tokio, so the batcher's
//! image needs no libzmq.

use crate::frames;
use crate::replica::{Outcome, ReplicaEvents};
use crate::stream::END_OF_REPLAY;
use std::future::pending;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

/// The longest a replay request (connecting the DEALER, sending) may hold the live stream:
/// past it the gap is lost (the residency dropped) and the stream goes on.
pub const REPLAY_REQUEST_TIMEOUT: Duration = Duration::from_millis(500);

/// Where one replica publishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriberConfig {
    /// The PUB endpoint, such as `tcp://10.0.0.5:5557` (vLLM's `endpoint`, its port plus
    /// the data-parallel rank).
    pub endpoint: String,
    /// The ROUTER replay endpoint (vLLM's `replay_endpoint`); without one, gaps are lost.
    pub replay_endpoint: Option<String>,
    /// The topic prefix to subscribe to (vLLM's `topic`, empty by default).
    pub topic: String,
    /// How often time is passed to the replica (replay timeouts, silence).
    pub tick: Duration,
}

/// Why the subscription stopped.
#[derive(Debug, thiserror::Error)]
pub enum SubscribeError {
    /// The SUB socket could not connect or receive.
    #[error("events socket {endpoint}: {source}")]
    Events {
        endpoint: String,
        source: zeromq::ZmqError,
    },
}

/// What the subscription saw that the replica does not count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameCounters {
    /// Live messages whose frames were not `[topic, seq, payload]`.
    pub bad_live_frames: u64,
    /// Replay replies whose frames were not a reply.
    pub bad_replay_frames: u64,
    /// Replay requests that could not be sent.
    pub replay_failures: u64,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while applying leaves a consistent index (each call mutates then returns):
    // keep following the stream rather than stopping.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Follows one replica's stream until the events socket fails; `notify` gets every
/// outcome that asks for something or changes something.
pub async fn run(
    config: &SubscriberConfig,
    replica: Arc<Mutex<ReplicaEvents>>,
    counters: Arc<Mutex<FrameCounters>>,
    mut notify: impl FnMut(&Outcome),
) -> Result<(), SubscribeError> {
    let events_error = |source| SubscribeError::Events {
        endpoint: config.endpoint.clone(),
        source,
    };
    let mut sub = SubSocket::new();
    sub.connect(&config.endpoint).await.map_err(events_error)?;
    sub.subscribe(&config.topic).await.map_err(events_error)?;
    let mut dealer: Option<DealerSocket> = None;
    let mut ticks = tokio::time::interval(config.tick);
    loop {
        let outcome = tokio::select! {
            message = sub.recv() => {
                let message = message.map_err(events_error)?;
                let frames = message.into_vec();
                match frames::live(&frames) {
                    Ok((seq, payload)) => {
                        lock(&replica).on_live(seq, payload.to_vec(), Instant::now())
                    }
                    Err(_) => {
                        lock(&counters).bad_live_frames += 1;
                        continue;
                    }
                }
            }
            reply = async {
                match dealer.as_mut() {
                    Some(d) => d.recv().await,
                    None => pending().await,
                }
            } => {
                match reply {
                    Ok(message) => {
                        let frames = message.into_vec();
                        match frames::replay(&frames) {
                            Ok((seq, payload)) => {
                                let payload = if seq == END_OF_REPLAY {
                                    Vec::new()
                                } else {
                                    payload.to_vec()
                                };
                                lock(&replica).on_replay(seq, payload, Instant::now())
                            }
                            Err(_) => {
                                lock(&counters).bad_replay_frames += 1;
                                continue;
                            }
                        }
                    }
                    // The replay socket failed: drop it; the replica's replay timeout
                    // loses the gap, and the next gap connects again.
                    Err(_) => {
                        dealer = None;
                        lock(&counters).replay_failures += 1;
                        continue;
                    }
                }
            }
            _ = ticks.tick() => lock(&replica).tick(Instant::now()),
        };
        notify_if_any(&mut notify, &outcome);
        if let Some(from) = outcome.replay_from {
            // Bounded: the live stream waits for nothing longer than this (an engine whose
            // replay socket is down would otherwise hold it for zeromq's connect timeout).
            let asked = tokio::time::timeout(
                REPLAY_REQUEST_TIMEOUT,
                request_replay(config, &mut dealer, from),
            )
            .await;
            let sent = asked.unwrap_or_else(|_| {
                dealer = None;
                false
            });
            if !sent {
                lock(&counters).replay_failures += 1;
                let lost = lock(&replica).replay_unavailable();
                notify_if_any(&mut notify, &lost);
            }
        }
    }
}

fn notify_if_any(notify: &mut impl FnMut(&Outcome), outcome: &Outcome) {
    if outcome.replay_from.is_some() || outcome.health.is_some() || !outcome.resets.is_empty() {
        notify(outcome);
    }
}

/// Sends a replay request from `from`, connecting the DEALER first if needed; `false` when
/// there is no replay endpoint or the request could not be sent.
async fn request_replay(
    config: &SubscriberConfig,
    dealer: &mut Option<DealerSocket>,
    from: u64,
) -> bool {
    let Some(endpoint) = &config.replay_endpoint else {
        return false;
    };
    if dealer.is_none() {
        let mut socket = DealerSocket::new();
        if socket.connect(endpoint).await.is_err() {
            return false;
        }
        *dealer = Some(socket);
    }
    let Some(socket) = dealer.as_mut() else {
        return false;
    };
    let [delimiter, start] = frames::replay_request(from);
    let mut message = ZmqMessage::from(delimiter);
    message.push_back(start.into());
    if socket.send(message).await.is_err() {
        *dealer = None;
        return false;
    }
    true
}
