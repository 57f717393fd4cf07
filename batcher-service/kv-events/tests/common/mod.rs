//! Payload builders for the tests: every event in both of vLLM's encodings, every batch
//! shape, written with rmpv's encoder.
#![allow(dead_code)]

use rmpv::Value;

/// Which event encoding.
#[derive(Clone, Copy, Debug)]
pub enum Tagging {
    /// vLLM <= 0.23: `["BlockStored", field, field, …]`.
    Array,
    /// vLLM >= 0.24: `{"type": "BlockStored", "field": …}`.
    Map,
}

/// Which batch shape.
#[derive(Clone, Copy, Debug)]
pub enum Shape {
    /// `[ts, events, rank]`.
    Triple,
    /// `[ts, events]`.
    Pair,
    /// `{"ts", "events", "data_parallel_rank"}`.
    Map,
}

pub fn s(text: &str) -> Value {
    Value::from(text)
}

fn event(tagging: Tagging, kind: &str, fields: Vec<(&str, Value)>) -> Value {
    match tagging {
        Tagging::Array => {
            let mut items = vec![s(kind)];
            items.extend(fields.into_iter().map(|(_, v)| v));
            Value::Array(items)
        }
        Tagging::Map => {
            let mut entries = vec![(s("type"), s(kind))];
            entries.extend(fields.into_iter().map(|(k, v)| (s(k), v)));
            Value::Map(entries)
        }
    }
}

/// A `BlockStored` of full-attention group 0 on the GPU tier.
pub fn stored(
    tagging: Tagging,
    hashes: &[u64],
    parent: Option<u64>,
    tokens: &[u32],
    block_size: u32,
) -> Value {
    stored_in(
        tagging,
        hashes,
        parent,
        tokens,
        block_size,
        "GPU",
        0,
        "full_attention",
    )
}

#[allow(clippy::too_many_arguments)]
pub fn stored_in(
    tagging: Tagging,
    hashes: &[u64],
    parent: Option<u64>,
    tokens: &[u32],
    block_size: u32,
    medium: &str,
    group: u32,
    kind: &str,
) -> Value {
    let sliding = if kind == "sliding_window" {
        Value::from(512)
    } else {
        Value::Nil
    };
    event(
        tagging,
        "BlockStored",
        vec![
            (
                "block_hashes",
                Value::Array(hashes.iter().map(|h| Value::from(*h)).collect()),
            ),
            ("parent_block_hash", parent.map_or(Value::Nil, Value::from)),
            (
                "token_ids",
                Value::Array(tokens.iter().map(|t| Value::from(*t)).collect()),
            ),
            ("block_size", Value::from(block_size)),
            ("lora_id", Value::Nil),
            ("medium", s(medium)),
            ("lora_name", Value::Nil),
            ("extra_keys", Value::Nil),
            ("group_idx", Value::from(group)),
            ("kv_cache_spec_kind", s(kind)),
            ("kv_cache_spec_sliding_window", sliding),
        ],
    )
}

/// A `BlockRemoved` of group 0 on the GPU tier.
pub fn removed(tagging: Tagging, hashes: &[u64]) -> Value {
    removed_in(tagging, hashes, 0)
}

pub fn removed_in(tagging: Tagging, hashes: &[u64], group: u32) -> Value {
    event(
        tagging,
        "BlockRemoved",
        vec![
            (
                "block_hashes",
                Value::Array(hashes.iter().map(|h| Value::from(*h)).collect()),
            ),
            ("medium", s("GPU")),
            ("group_idx", Value::from(group)),
        ],
    )
}

pub fn cleared(tagging: Tagging) -> Value {
    event(tagging, "AllBlocksCleared", Vec::new())
}

pub fn batch_value(shape: Shape, ts: f64, events: Vec<Value>, rank: Option<i64>) -> Value {
    let rank = rank.map_or(Value::Nil, Value::from);
    match shape {
        Shape::Triple => Value::Array(vec![Value::F64(ts), Value::Array(events), rank]),
        Shape::Pair => Value::Array(vec![Value::F64(ts), Value::Array(events)]),
        Shape::Map => Value::Map(vec![
            (s("ts"), Value::F64(ts)),
            (s("events"), Value::Array(events)),
            (s("data_parallel_rank"), rank),
        ]),
    }
}

pub fn encode(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, value).unwrap();
    out
}

/// A `[ts, events, 0]` payload.
pub fn payload(events: Vec<Value>) -> Vec<u8> {
    encode(&batch_value(Shape::Triple, 1.5, events, Some(0)))
}

/// `n` blocks of `block_size` distinct tokens starting at token `first`.
pub fn tokens(first: u32, n: usize, block_size: u32) -> Vec<u32> {
    (0..(n as u32) * block_size).map(|i| first + i).collect()
}

/// Prompt `i`: 2 blocks of `block_size` tokens of its own.
pub fn prompt(i: u32, block_size: u32) -> Vec<u32> {
    tokens(1000 * i, 2, block_size)
}

/// The payload storing prompt `i` (engine hashes 10i, 10i+1), map-tagged.
pub fn store(i: u32, block_size: u32) -> Vec<u8> {
    let h = u64::from(i) * 10;
    payload(vec![stored(
        Tagging::Map,
        &[h, h + 1],
        None,
        &prompt(i, block_size),
        block_size,
    )])
}
