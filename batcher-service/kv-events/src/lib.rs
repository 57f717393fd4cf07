//! # cohort-kv-events — vLLM's KV cache events, as an exact per-replica residency
//!
//! vLLM (`--kv-events-config`) publishes every block its prefix cache stores or evicts on
//! a ZeroMQ PUB socket: multipart `[topic, seq, payload]`, the sequence number 8 bytes
//! big-endian from 0, the payload a msgpack event batch. This crate is the pure part of
//! consuming it, without sockets or async, one module per concern, and an optional
//! subscriber:
//!
//! - [`frames`]: ZeroMQ frames to a sequence number and a payload, and the replay request;
//! - [`decode`]: a payload to an [`decode::EventBatch`], every encoding vLLM has used;
//! - [`stream`]: sequence numbers to apply / skip / replay / reset steps;
//! - [`residency`]: the blocks a replica holds, in Cohort's own keys, and the prefix of a
//!   prompt it would hit ([`residency::prefix_keys`], [`residency::Residency::held_prefix_blocks`]);
//! - [`health`]: whether a stream can be trusted, and why not;
//! - [`replica`]: the four composed for one replica's stream;
//! - `subscriber` (feature `subscriber`): the ZeroMQ SUB and replay DEALER sockets feeding
//!   a [`replica::ReplicaEvents`], on tokio with the pure-Rust `zeromq` crate;
//! - `testing` (feature `testing`): the real vLLM recording kept here, and a vLLM-like
//!   replay service, for the tests of the crates that follow KV events.
//!
//! The wire format, the keying, which KV cache groups count, the replay rules and the
//! measured memory and speed are in docs/KV-EVENTS.md.

pub mod decode;
pub mod frames;
pub mod health;
pub mod replica;
pub mod residency;
pub mod stream;
#[cfg(feature = "subscriber")]
pub mod subscriber;
#[cfg(feature = "testing")]
pub mod testing;
