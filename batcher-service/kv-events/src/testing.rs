//! Test support for the crates that follow KV events (feature `testing`): the real vLLM
//! recording this crate keeps (`tests/fixtures/vllm/`, recorded by `scripts/vllm-kv-events`)
//! as frames, and, with `subscriber`, a publisher's pieces that behave like vLLM's (a
//! multipart message from frames; the replay service of a ROUTER socket). One copy, so the
//! crate's own tests, `cohort serve`'s and the end-to-end ones replay the same thing.

use std::path::PathBuf;

/// The messages of a recording file of `tests/fixtures/vllm/` (`stream.jsonl`,
/// `replay.jsonl`, `array-tagged.jsonl`), each the list of its frames, in order. Each line
/// of the file is `{"frames": ["hex", …]}`.
///
/// # Panics
/// On a missing or malformed file: it is test data kept in this crate.
pub fn recording(name: &str) -> Vec<Vec<Vec<u8>>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vllm")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    text.lines()
        .map(|line| {
            let inner = line
                .split_once('[')
                .and_then(|(_, rest)| rest.rsplit_once(']'))
                .map(|(inner, _)| inner)
                .unwrap_or_else(|| panic!("{path:?}: no frames array in {line:?}"));
            inner
                .split(',')
                .map(|hex| {
                    let hex = hex.trim().trim_matches('"');
                    (0..hex.len())
                        .step_by(2)
                        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// The payloads of the recording's live stream (`stream.jsonl`), by sequence number.
pub fn live_payloads() -> Vec<Vec<u8>> {
    recording("stream.jsonl")
        .into_iter()
        .map(|mut frames| frames.remove(2))
        .collect()
}

/// A ZeroMQ multipart message of `frames` (at least one).
#[cfg(feature = "subscriber")]
pub fn zmq_message(frames: Vec<Vec<u8>>) -> zeromq::ZmqMessage {
    let mut frames = frames.into_iter();
    let mut message = zeromq::ZmqMessage::from(frames.next().unwrap_or_default());
    for frame in frames {
        message.push_back(frame.into());
    }
    message
}

/// vLLM's replay service (≥ 0.26) on `router`: for a request `["", start]`, every kept
/// message from index `start` on, then the end marker, each as
/// `[identity, "", topic, seq, payload]`. Ends when the socket fails.
#[cfg(feature = "subscriber")]
pub async fn serve_replays(mut router: zeromq::RouterSocket, kept: Vec<Vec<Vec<u8>>>) {
    use zeromq::{SocketRecv, SocketSend};
    while let Ok(request) = router.recv().await {
        let frames = request.into_vec();
        let [identity, _, start] = &frames[..] else {
            continue;
        };
        let Ok(start) = <[u8; 8]>::try_from(&start[..]).map(u64::from_be_bytes) else {
            continue;
        };
        let end = vec![
            Vec::new(),
            crate::stream::END_OF_REPLAY.to_be_bytes().to_vec(),
            Vec::new(),
        ];
        for kept in kept.iter().skip(start as usize).chain([&end]) {
            let mut reply = vec![identity.to_vec(), Vec::new()];
            reply.extend(kept.iter().cloned());
            if router.send(zmq_message(reply)).await.is_err() {
                return;
            }
        }
    }
}

/// SplitMix64: deterministic, dependency-free random numbers for the simulations and the
/// benchmark.
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n` (at least 1).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}
