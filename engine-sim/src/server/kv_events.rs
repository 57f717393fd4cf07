//! One replica's KV cache events on ZeroMQ (`--kv-events-port`), as vLLM publishes them: a
//! PUB socket sending every batch live, and a ROUTER socket answering replay requests from
//! the last batches kept. The formats and the buffer are in [`crate::events`]; this is the
//! glue between them, the request handlers and the sockets.
//!
//! A handler publishes under its replica's lock ([`Publisher::publish`]): the batch is
//! numbered and kept there, in the order the cache changed, and queued for the socket task
//! without waiting. A full queue (a subscriber slower than the engine: the `zeromq` crate's
//! PUB send waits for each subscriber) drops the live message, which the subscriber then
//! sees as a gap and replays, so the HTTP side never waits on a subscriber. One task per
//! replica moves the queue to the PUB socket and answers replays; it ends, closing both
//! sockets, when the server shuts down.

use super::SimError;
use crate::events::{encode, live_frames, replay_replies, replay_request, Event, ReplayBuffer};
use bytes::Bytes;
use serde_json::{json, Value};
use std::future::pending;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{mpsc, watch};
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// Live batches queued for the PUB socket before new ones are dropped.
const LIVE_QUEUE: usize = 1024;

/// The events' configuration, for every replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEventsConfig {
    /// Replica i publishes on `base_port + 2i` and answers replays on `base_port + 2i + 1`;
    /// 0 binds ephemeral ports ([`super::BoundSim::kv_events_ports`] says which).
    pub base_port: u16,
    /// The topic frame of every live message (vLLM's `topic`, empty by default).
    pub topic: String,
    /// Batches kept for replays (vLLM's `buffer_steps`).
    pub buffer_steps: usize,
}

impl KvEventsConfig {
    /// Batches kept for replays unless configured.
    pub const DEFAULT_BUFFER_STEPS: usize = 1000;

    /// Events on `base_port`, the empty topic, the default buffer.
    pub fn new(base_port: u16) -> Self {
        KvEventsConfig {
            base_port,
            topic: String::new(),
            buffer_steps: Self::DEFAULT_BUFFER_STEPS,
        }
    }
}

/// Where one replica's events are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvEventsPorts {
    /// The PUB socket's port.
    pub publish: u16,
    /// The ROUTER replay socket's port.
    pub replay: u16,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// One replica's side of the stream that the handlers see.
pub(crate) struct Publisher {
    topic: Bytes,
    buffer: Mutex<ReplayBuffer>,
    live: mpsc::Sender<(u64, Bytes)>,
    live_dropped: AtomicU64,
    replays: AtomicU64,
    ports: KvEventsPorts,
    host: String,
    buffer_steps: usize,
}

impl Publisher {
    /// Publishes one batch (nothing for no events). Called under the replica's lock, so
    /// that batches are numbered in the order the cache changed.
    pub fn publish(&self, events: &[Event]) {
        if events.is_empty() {
            return;
        }
        let payload = Bytes::from(encode(unix_seconds(), events));
        let seq = lock(&self.buffer).push(payload.clone());
        if self.live.try_send((seq, payload)).is_err() {
            self.live_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn ports(&self) -> KvEventsPorts {
        self.ports
    }

    /// What `/server_info` says about the stream.
    pub fn info(&self) -> Value {
        json!({
            "endpoint": endpoint(&self.host, self.ports.publish),
            "replay_endpoint": endpoint(&self.host, self.ports.replay),
            "topic": String::from_utf8_lossy(&self.topic),
            "buffer_steps": self.buffer_steps,
            "published": lock(&self.buffer).next_seq(),
            "live_dropped": self.live_dropped.load(Ordering::Relaxed),
            "replays": self.replays.load(Ordering::Relaxed),
        })
    }
}

fn unix_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn endpoint(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("tcp://[{host}]:{port}")
    } else {
        format!("tcp://{host}:{port}")
    }
}

/// One replica's bound sockets, until the task runs them.
pub(crate) struct Sockets {
    publish: PubSocket,
    replay: RouterSocket,
    live: mpsc::Receiver<(u64, Bytes)>,
}

fn bind_error(endpoint: String) -> impl FnOnce(zeromq::ZmqError) -> SimError {
    move |source| SimError::KvEvents { endpoint, source }
}

fn port_of(endpoint: &zeromq::Endpoint, asked: u16) -> u16 {
    match endpoint {
        zeromq::Endpoint::Tcp(_, port) => *port,
        _ => asked,
    }
}

/// Binds replica `index`'s two sockets.
pub(crate) async fn bind(
    host: &str,
    index: usize,
    config: &KvEventsConfig,
) -> Result<(Arc<Publisher>, Sockets), SimError> {
    let (publish_port, replay_port) = match config.base_port {
        0 => (0, 0),
        base => {
            let publish = u16::try_from(index * 2)
                .ok()
                .and_then(|offset| base.checked_add(offset))
                .filter(|p| *p < u16::MAX)
                .ok_or_else(|| {
                    SimError::Config("kv-events-port + 2 × replicas > 65535".to_owned())
                })?;
            (publish, publish + 1)
        }
    };
    let mut publish = PubSocket::new();
    let at = endpoint(host, publish_port);
    let bound = publish.bind(&at).await.map_err(bind_error(at))?;
    let publish_port = port_of(&bound, publish_port);
    let mut replay = RouterSocket::new();
    let at = endpoint(host, replay_port);
    let bound = replay.bind(&at).await.map_err(bind_error(at))?;
    let replay_port = port_of(&bound, replay_port);
    let (tx, rx) = mpsc::channel(LIVE_QUEUE);
    let publisher = Arc::new(Publisher {
        topic: Bytes::from(config.topic.clone()),
        buffer: Mutex::new(ReplayBuffer::new(config.buffer_steps)),
        live: tx,
        live_dropped: AtomicU64::new(0),
        replays: AtomicU64::new(0),
        ports: KvEventsPorts {
            publish: publish_port,
            replay: replay_port,
        },
        host: host.to_owned(),
        buffer_steps: config.buffer_steps,
    });
    let sockets = Sockets {
        publish,
        replay,
        live: rx,
    };
    Ok((publisher, sockets))
}

fn message(frames: Vec<Bytes>) -> Option<ZmqMessage> {
    ZmqMessage::try_from(frames).ok()
}

/// Publishes the queued batches and answers replays until `stop` turns true, then sends
/// what is still queued and closes both sockets.
pub(crate) async fn run(
    sockets: Sockets,
    publisher: Arc<Publisher>,
    mut stop: watch::Receiver<bool>,
) {
    let Sockets {
        mut publish,
        replay,
        mut live,
    } = sockets;
    // A replay socket that fails to receive is dropped; the live stream goes on.
    let mut replay = Some(replay);
    let stopped = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            () = &mut stopped => break,
            batch = live.recv() => {
                let Some((seq, payload)) = batch else { break };
                if let Some(m) = message(live_frames(&publisher.topic, seq, payload)) {
                    // A subscriber that went away is the PUB socket's business, not ours.
                    let _ = publish.send(m).await;
                }
            }
            request = async {
                match replay.as_mut() {
                    Some(socket) => socket.recv().await,
                    None => pending().await,
                }
            } => {
                let Ok(request) = request else {
                    replay = None;
                    continue;
                };
                let Some((identity, start)) = replay_request(&request.into_vec()) else {
                    continue;
                };
                publisher.replays.fetch_add(1, Ordering::Relaxed);
                let batches = lock(&publisher.buffer).from(start);
                if let Some(socket) = replay.as_mut() {
                    for reply in replay_replies(&identity, &publisher.topic, &batches) {
                        let Some(m) = message(reply) else { continue };
                        if socket.send(m).await.is_err() {
                            break;
                        }
                    }
                }
            }
        }
    }
    // What the last requests published before the stop still goes out.
    while let Ok((seq, payload)) = live.try_recv() {
        if let Some(m) = message(live_frames(&publisher.topic, seq, payload)) {
            let _ = publish.send(m).await;
        }
    }
    let _ = publish.close().await;
    if let Some(socket) = replay {
        let _ = socket.close().await;
    }
}
