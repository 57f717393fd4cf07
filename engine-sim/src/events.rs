//! The simulator's KV cache events, in vLLM's wire format, so that a consumer of vLLM's
//! stream (`cohort-kv-events`, docs/KV-EVENTS.md) can follow a simulated replica's cache
//! exactly, and benchmarks and CI can test it without vLLM.
//!
//! Pure: a cache change ([`CacheChange`]) becomes events ([`events_for`]), events become one
//! msgpack payload ([`encode`]), payloads get sequence numbers and are kept for replays
//! ([`ReplayBuffer`]), and the ZeroMQ frames are built and read here ([`live_frames`],
//! [`replay_request`], [`replay_replies`]). The sockets are in `server::kv_events`.
//!
//! What vLLM 0.32.0 sends, and so what this sends:
//! - the payload is an array `[ts, events, data_parallel_rank]` (rank 0), each event a map
//!   tagged by `"type"`;
//! - `BlockStored`: `block_hashes`, `parent_block_hash` (nil for a prompt's first block),
//!   `token_ids` (every stored block's tokens), `block_size`, `lora_id` (nil), `medium`
//!   (`"GPU"`), `lora_name` (nil), `extra_keys` (per block: nil, or `[cache_salt]` for a
//!   salted prompt's first block), `group_idx` (0), `kv_cache_spec_kind`
//!   (`"full_attention"`);
//! - `BlockRemoved`: `block_hashes` (one block per event, as vLLM frees them), `medium`,
//!   `group_idx`;
//! - `AllBlocksCleared`, on a cache reset.
//!
//! The block hashes are the simulator's own chained hashes ([`crate::cache::block_hashes`]),
//! sent as unsigned integers.

use crate::cache::CacheChange;
use bytes::Bytes;
use rmpv::Value;
use std::collections::VecDeque;

/// The tier the simulator's cache is (vLLM reports `"GPU"` for its own cache on any device).
pub const MEDIUM: &str = "GPU";

/// The attention kind of the simulator's one KV cache group.
pub const SPEC_KIND: &str = "full_attention";

/// The sequence number of the replay's end marker (−1 as a signed 64-bit integer).
pub const END_OF_REPLAY: u64 = u64::MAX;

/// One KV cache event.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A run of consecutive blocks newly held, in prefix order.
    Stored {
        block_hashes: Vec<u64>,
        /// The hash of the block before the run; `None` when the run starts the prompt.
        parent: Option<u64>,
        /// The run's tokens: `block_hashes.len() × block_size`.
        token_ids: Vec<u32>,
        block_size: usize,
        /// The prompt's `cache_salt`, when the run starts the prompt (vLLM's extra key of
        /// a salted prompt's first block).
        salt: Option<String>,
    },
    /// One block evicted.
    Removed { block_hash: u64 },
    /// The whole cache dropped.
    AllCleared,
}

/// The events of one cache change: a removal per evicted block, in eviction order, then a
/// store per run of new blocks. `hashes` are the inserted prompt's block hashes and
/// `tokens` its tokens (at least `hashes.len() × block_size` of them).
pub fn events_for(
    change: &CacheChange,
    hashes: &[u64],
    tokens: &[u32],
    block_size: usize,
    salt: Option<&str>,
) -> Vec<Event> {
    let removed = change
        .evicted
        .iter()
        .map(|&block_hash| Event::Removed { block_hash });
    let stored = change.stored.iter().map(|run| Event::Stored {
        block_hashes: hashes[run.clone()].to_vec(),
        parent: run.start.checked_sub(1).map(|i| hashes[i]),
        token_ids: tokens[run.start * block_size..run.end * block_size].to_vec(),
        block_size,
        salt: salt.filter(|_| run.start == 0).map(str::to_owned),
    });
    removed.chain(stored).collect()
}

fn text(s: &str) -> Value {
    Value::from(s)
}

fn event_value(event: &Event) -> Value {
    let entries = match event {
        Event::Stored {
            block_hashes,
            parent,
            token_ids,
            block_size,
            salt,
        } => {
            let extra_keys = (0..block_hashes.len())
                .map(|i| match salt {
                    Some(s) if i == 0 => Value::Array(vec![text(s)]),
                    _ => Value::Nil,
                })
                .collect();
            vec![
                (text("type"), text("BlockStored")),
                (text("block_hashes"), hashes_value(block_hashes)),
                (
                    text("parent_block_hash"),
                    parent.map_or(Value::Nil, Value::from),
                ),
                (
                    text("token_ids"),
                    Value::Array(token_ids.iter().map(|&t| Value::from(t)).collect()),
                ),
                (text("block_size"), Value::from(*block_size as u64)),
                (text("lora_id"), Value::Nil),
                (text("medium"), text(MEDIUM)),
                (text("lora_name"), Value::Nil),
                (text("extra_keys"), Value::Array(extra_keys)),
                (text("group_idx"), Value::from(0)),
                (text("kv_cache_spec_kind"), text(SPEC_KIND)),
            ]
        }
        Event::Removed { block_hash } => vec![
            (text("type"), text("BlockRemoved")),
            (text("block_hashes"), hashes_value(&[*block_hash])),
            (text("medium"), text(MEDIUM)),
            (text("group_idx"), Value::from(0)),
        ],
        Event::AllCleared => vec![(text("type"), text("AllBlocksCleared"))],
    };
    Value::Map(entries)
}

fn hashes_value(hashes: &[u64]) -> Value {
    Value::Array(hashes.iter().map(|&h| Value::from(h)).collect())
}

/// One batch's msgpack payload: `[ts, events, 0]`, `ts` in seconds since the epoch.
pub fn encode(ts: f64, events: &[Event]) -> Vec<u8> {
    let batch = Value::Array(vec![
        Value::F64(ts),
        Value::Array(events.iter().map(event_value).collect()),
        Value::from(0),
    ]);
    let mut out = Vec::new();
    // Writing to a Vec cannot fail.
    let _ = rmpv::encode::write_value(&mut out, &batch);
    out
}

/// The publisher's sequence numbers and its last `capacity` payloads, for replays.
#[derive(Debug)]
pub struct ReplayBuffer {
    next_seq: u64,
    kept: VecDeque<(u64, Bytes)>,
    capacity: usize,
}

impl ReplayBuffer {
    /// A buffer keeping the last `capacity` payloads (0 keeps none).
    pub fn new(capacity: usize) -> Self {
        ReplayBuffer {
            next_seq: 0,
            kept: VecDeque::with_capacity(capacity.min(1024)),
            capacity,
        }
    }

    /// Numbers a payload (from 0) and keeps it, dropping the oldest beyond the capacity.
    pub fn push(&mut self, payload: Bytes) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.capacity > 0 {
            if self.kept.len() == self.capacity {
                self.kept.pop_front();
            }
            self.kept.push_back((seq, payload));
        }
        seq
    }

    /// Every kept payload numbered `start` or later, in order.
    pub fn from(&self, start: u64) -> Vec<(u64, Bytes)> {
        let first = self.kept.partition_point(|(seq, _)| *seq < start);
        self.kept.range(first..).cloned().collect()
    }

    /// The number the next payload gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }
}

fn seq_frame(seq: u64) -> Bytes {
    Bytes::copy_from_slice(&seq.to_be_bytes())
}

/// A live message on the PUB socket: `[topic, seq, payload]`.
pub fn live_frames(topic: &Bytes, seq: u64, payload: Bytes) -> Vec<Bytes> {
    vec![topic.clone(), seq_frame(seq), payload]
}

/// A replay request as the ROUTER socket receives it, `[identity, "", start]` (start: 8
/// bytes big-endian): the identity and the start. `None` for anything else, which vLLM's
/// publisher ignores too.
pub fn replay_request(frames: &[Bytes]) -> Option<(Bytes, u64)> {
    match frames {
        [identity, delimiter, start] if delimiter.is_empty() => {
            let start: [u8; 8] = start.as_ref().try_into().ok()?;
            Some((identity.clone(), u64::from_be_bytes(start)))
        }
        _ => None,
    }
}

/// The ROUTER's answer to `identity`: `[identity, "", topic, seq, payload]` per batch, then
/// the end marker `[identity, "", "", 0xff × 8, ""]` (vLLM's form since 0.26).
pub fn replay_replies(
    identity: &Bytes,
    topic: &Bytes,
    batches: &[(u64, Bytes)],
) -> Vec<Vec<Bytes>> {
    let reply = |topic: &Bytes, seq: u64, payload: &Bytes| {
        vec![
            identity.clone(),
            Bytes::new(),
            topic.clone(),
            seq_frame(seq),
            payload.clone(),
        ]
    };
    batches
        .iter()
        .map(|(seq, payload)| reply(topic, *seq, payload))
        .chain([reply(&Bytes::new(), END_OF_REPLAY, &Bytes::new())])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{block_hashes, PrefixCache};
    use cohort_kv_events::decode::{decode, BlockRemoved, BlockStored, KvEvent, Skipped};
    use cohort_kv_events::residency::{prefix_keys, ApplyReport, Residency};

    fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32], bs: u32) -> KvEvent {
        KvEvent::Stored(BlockStored {
            block_hashes: hashes.to_vec(),
            parent,
            token_ids: tokens.to_vec(),
            block_size: bs,
            lora_id: None,
            lora_name: None,
            medium: Some("GPU".to_owned()),
            group_idx: Some(0),
            spec_kind: Some("full_attention".to_owned()),
            sliding_window: None,
        })
    }

    fn removed(hash: u64) -> KvEvent {
        KvEvent::Removed(BlockRemoved {
            block_hashes: vec![hash],
            medium: Some("GPU".to_owned()),
            group_idx: Some(0),
        })
    }

    #[test]
    fn a_payload_decodes_as_vllm_0_32_with_nothing_skipped() {
        let events = [
            Event::Removed { block_hash: 7 },
            Event::Stored {
                block_hashes: vec![u64::MAX, 1],
                parent: Some(1 << 63),
                token_ids: vec![1, 2, 3, 0x7fff_ffff],
                block_size: 2,
                salt: None,
            },
            Event::AllCleared,
        ];
        let batch = decode(&encode(1_796_637_791.25, &events)).unwrap();
        assert_eq!(batch.ts, 1_796_637_791.25);
        assert_eq!(batch.dp_rank, Some(0));
        assert_eq!(
            batch.skipped,
            Skipped::default(),
            "every field is one vLLM sends"
        );
        assert_eq!(
            batch.events,
            vec![
                removed(7),
                stored(&[u64::MAX, 1], Some(1 << 63), &[1, 2, 3, 0x7fff_ffff], 2),
                KvEvent::AllCleared,
            ]
        );
    }

    #[test]
    fn the_payload_is_an_array_batch_of_map_tagged_events_in_vllm_field_order() {
        let events = [Event::Stored {
            block_hashes: vec![5],
            parent: None,
            token_ids: vec![9, 9],
            block_size: 2,
            salt: Some("tenant".to_owned()),
        }];
        let value = rmpv::decode::read_value(&mut &encode(1.0, &events)[..]).unwrap();
        let batch = value.as_array().unwrap();
        assert_eq!(batch.len(), 3);
        let event = batch[1].as_array().unwrap()[0].as_map().unwrap();
        let keys: Vec<&str> = event.iter().map(|(k, _)| k.as_str().unwrap()).collect();
        assert_eq!(
            keys,
            [
                "type",
                "block_hashes",
                "parent_block_hash",
                "token_ids",
                "block_size",
                "lora_id",
                "medium",
                "lora_name",
                "extra_keys",
                "group_idx",
                "kv_cache_spec_kind"
            ]
        );
        assert_eq!(
            event[8].1,
            Value::Array(vec![Value::Array(vec![Value::from("tenant")])]),
            "the salt is the first block's extra key"
        );
    }

    #[test]
    fn a_change_becomes_removals_then_stores_with_parents_and_tokens() {
        let mut cache = PrefixCache::new(3, 2);
        let a: Vec<u32> = (0..6).collect();
        let ha = block_hashes(&a, 2, None);
        let first = cache.insert(&ha);
        assert_eq!(
            events_for(&first, &ha, &a, 2, Some("s")),
            vec![Event::Stored {
                block_hashes: ha.clone(),
                parent: None,
                token_ids: a.clone(),
                block_size: 2,
                salt: Some("s".to_owned()),
            }]
        );
        // a's head and two new blocks: a's two tail blocks are evicted (3 blocks, 5 wanted),
        // in the order the LRU evicts them, and the new run's parent is a's head.
        let b: Vec<u32> = [0, 1, 7, 7, 8, 8, 9].to_vec();
        let hb = block_hashes(&b, 2, None);
        let change = cache.insert(&hb);
        assert_eq!(
            events_for(&change, &hb, &b, 2, Some("s")),
            vec![
                Event::Removed { block_hash: ha[2] },
                Event::Removed { block_hash: ha[1] },
                Event::Stored {
                    block_hashes: hb[1..].to_vec(),
                    parent: Some(hb[0]),
                    token_ids: b[2..6].to_vec(),
                    block_size: 2,
                    salt: None,
                },
            ]
        );
    }

    #[test]
    fn a_consumer_residency_built_from_the_payloads_follows_the_cache() {
        let bs = 4;
        let mut cache = PrefixCache::new(12, bs);
        let mut residency = Residency::new(bs as u32, "GPU");
        let mut report = ApplyReport::default();
        let prompts: Vec<Vec<u32>> = (0..8u32)
            .map(|i| {
                (0..20)
                    .map(|t| if t < 8 { t } else { i * 100 + t })
                    .collect()
            })
            .collect();
        for (n, tokens) in prompts.iter().enumerate() {
            let hashes = block_hashes(tokens, bs, None);
            let change = cache.insert(&hashes);
            let payload = encode(n as f64, &events_for(&change, &hashes, tokens, bs, None));
            for event in &decode(&payload).unwrap().events {
                residency.apply(event, &mut report);
            }
            assert_eq!(residency.len(), cache.len(), "after prompt {n}");
            for earlier in &prompts[..=n] {
                let keys = prefix_keys(earlier, bs);
                let hashes = block_hashes(earlier, bs, None);
                assert_eq!(
                    residency.held_prefix_blocks(&keys),
                    cache.leading_hits(&hashes)
                );
            }
        }
        assert!(report.removed > 0, "the cache evicted");
        assert_eq!(report.orphans, 0);
    }

    #[test]
    fn the_buffer_numbers_from_zero_and_keeps_the_last_batches() {
        let mut buffer = ReplayBuffer::new(3);
        for i in 0..5u8 {
            assert_eq!(buffer.push(Bytes::from(vec![i])), u64::from(i));
        }
        assert_eq!(buffer.next_seq(), 5);
        let seqs = |from| {
            buffer
                .from(from)
                .iter()
                .map(|(s, _)| *s)
                .collect::<Vec<_>>()
        };
        assert_eq!(seqs(0), [2, 3, 4], "0 and 1 are gone");
        assert_eq!(seqs(3), [3, 4]);
        assert!(seqs(5).is_empty());
        assert_eq!(buffer.from(4)[0].1, Bytes::from(vec![4]));
        let mut none = ReplayBuffer::new(0);
        assert_eq!(none.push(Bytes::new()), 0);
        assert!(none.from(0).is_empty());
    }

    #[test]
    fn frames_read_back_with_the_consumer_frame_parsers() {
        use cohort_kv_events::frames;
        let topic = Bytes::from_static(b"kv");
        let live = live_frames(&topic, 258, Bytes::from_static(b"p"));
        assert_eq!(frames::live(&live), Ok((258, &b"p"[..])));

        let [delimiter, start] = frames::replay_request(9);
        let identity = Bytes::from_static(b"\0peer");
        let request = [identity.clone(), Bytes::from(delimiter), Bytes::from(start)];
        assert_eq!(replay_request(&request), Some((identity.clone(), 9)));
        assert_eq!(replay_request(&request[1..]), None);
        assert_eq!(
            replay_request(&[identity.clone(), Bytes::new(), Bytes::new()]),
            None
        );

        let batches = [
            (9, Bytes::from_static(b"a")),
            (10, Bytes::from_static(b"b")),
        ];
        let replies = replay_replies(&identity, &topic, &batches);
        assert_eq!(replies.len(), 3);
        // The DEALER sees each reply without the identity the ROUTER routes it by.
        let read: Vec<(u64, &[u8])> = replies
            .iter()
            .map(|reply| {
                assert_eq!(reply[0], identity);
                frames::replay(&reply[1..]).unwrap()
            })
            .collect();
        assert_eq!(
            read,
            [(9, &b"a"[..]), (10, &b"b"[..]), (END_OF_REPLAY, &b""[..])]
        );
        assert_eq!(replies[0][2], topic);
        assert!(
            replies[2][2].is_empty(),
            "the end marker's topic is empty, as vLLM's"
        );
        assert_eq!(END_OF_REPLAY, cohort_kv_events::stream::END_OF_REPLAY);
    }
}
