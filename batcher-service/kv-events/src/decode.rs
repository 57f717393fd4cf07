//! One msgpack payload of vLLM's KV events stream, decoded into an [`EventBatch`].
//!
//! vLLM's encoding of the same events differs by version, and a consumer in front of a
//! mixed fleet meets all of them, so every shape is read and decodes to the same values:
//!
//! - the batch is an array `[ts, events, data_parallel_rank]`, an older two-element array
//!   `[ts, events]`, or a map `{"ts", "events", "data_parallel_rank"}`;
//! - each event is array-tagged (`["BlockStored", block_hashes, parent_block_hash, …]`, its
//!   fields by position, trailing ones optional) or map-tagged (`{"type": "BlockStored",
//!   "block_hashes": …}`, fields by name);
//! - a block hash is an unsigned integer of any width, a negative int64 (older versions), or
//!   raw bytes (the digest), normalised to a `u64` by [`normalise_hash`].
//!
//! Unknown event types and unknown fields are skipped and counted in [`Skipped`], never an
//! error: a newer vLLM adds fields. A known event whose known fields have the wrong type is
//! an error for the whole payload ([`DecodeError`]): its blocks would otherwise be silently
//! lost, and the caller must know that the residency it keeps may be wrong.
//!
//! The decoder is pure and allocation-bounded (msgpack lengths do not preallocate beyond a
//! small cap, nesting is capped at [`MAX_DEPTH`]); `fuzz/targets/src/kv_events.rs` runs it
//! on arbitrary bytes.

use rmpv::Value;

/// The deepest msgpack nesting a payload may have. A batch is at most five levels deep
/// (batch, events, event, `extra_keys`, one key tuple); anything deeper is not vLLM's.
pub const MAX_DEPTH: usize = 16;

/// One decoded payload.
#[derive(Clone, Debug, PartialEq)]
pub struct EventBatch {
    /// The engine's wall-clock time of the scheduler step, in seconds since the epoch.
    pub ts: f64,
    /// The events, in the order the engine emitted them.
    pub events: Vec<KvEvent>,
    /// The data-parallel rank that published the batch, when the engine says.
    pub dp_rank: Option<i64>,
    /// What the decoder did not understand and skipped.
    pub skipped: Skipped,
}

/// What a payload carried that the decoder skipped: counted, never an error.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Events of a type this decoder does not know.
    pub unknown_events: u32,
    /// Fields of known events (or of the batch) that this decoder does not know.
    pub unknown_fields: u32,
}

/// One KV cache event.
#[derive(Clone, Debug, PartialEq)]
pub enum KvEvent {
    /// Blocks newly cached, in prefix order.
    Stored(BlockStored),
    /// Blocks evicted.
    Removed(BlockRemoved),
    /// The whole prefix cache dropped (the engine's `reset_prefix_cache`).
    AllCleared,
}

/// `BlockStored`: a chain of full blocks newly held, each the child of the one before.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BlockStored {
    /// The engine's hashes of the stored blocks, in prefix order, normalised.
    pub block_hashes: Vec<u64>,
    /// The engine's hash of the first block's parent; `None` for a prompt's first block.
    pub parent: Option<u64>,
    /// The token ids of all the stored blocks, in order: `block_hashes.len() × block_size`.
    pub token_ids: Vec<u32>,
    /// Tokens per block.
    pub block_size: u32,
    /// The LoRA adapter's id (older versions' key).
    pub lora_id: Option<i64>,
    /// The LoRA adapter's name (newer versions' key).
    pub lora_name: Option<String>,
    /// The tier that holds the blocks (`"GPU"` for the engine's own cache, whatever the
    /// device; offloading connectors report theirs, such as `"CPU"`).
    pub medium: Option<String>,
    /// The KV cache group the blocks belong to (hybrid models have several).
    pub group_idx: Option<u32>,
    /// The group's attention kind, such as `"full_attention"` or `"sliding_window"`.
    pub spec_kind: Option<String>,
    /// The group's sliding window in tokens, for sliding-window groups.
    pub sliding_window: Option<u64>,
}

/// `BlockRemoved`: blocks evicted from a tier.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BlockRemoved {
    /// The engine's hashes of the evicted blocks, normalised.
    pub block_hashes: Vec<u64>,
    /// The tier they left.
    pub medium: Option<String>,
    /// The KV cache group they left.
    pub group_idx: Option<u32>,
}

/// Why a payload could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The bytes are not one msgpack value.
    #[error("not msgpack: {0}")]
    Msgpack(String),
    /// One msgpack value, followed by more bytes.
    #[error("{0} bytes after the batch")]
    Trailing(usize),
    /// The batch is neither an array nor a map.
    #[error("the batch is not an array or a map")]
    BatchShape,
    /// A field of the batch is missing or has the wrong type.
    #[error("batch field {field}: {why}")]
    BatchField {
        field: &'static str,
        why: &'static str,
    },
    /// A known event's field is missing or has the wrong type.
    #[error("event {index} ({kind}): field {field}: {why}")]
    Event {
        index: usize,
        kind: &'static str,
        field: &'static str,
        why: &'static str,
    },
    /// An event is neither an array nor a map with a string tag.
    #[error("event {index} has no type tag")]
    Untagged { index: usize },
}

/// A block hash as the engine sent it, normalised to the `u64` that vLLM's integer form keeps
/// (`int.from_bytes(digest, "big") & (2**64 - 1)`):
///
/// - an unsigned integer of any width: itself;
/// - a negative integer (older versions sent Python's signed 64-bit `hash()`): its two's
///   complement, the same low 64 bits;
/// - bytes (the digest itself, 32 bytes for sha256): the last 8 bytes, big-endian; shorter
///   bytes are left-padded with zeros, as their integer value would be.
///
/// `None` for anything else (floats, strings, empty bytes).
pub fn normalise_hash(value: &Value) -> Option<u64> {
    match value {
        Value::Integer(n) => n.as_u64().or_else(|| n.as_i64().map(|v| v as u64)),
        Value::Binary(bytes) if !bytes.is_empty() => {
            let tail = &bytes[bytes.len().saturating_sub(8)..];
            Some(tail.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
        }
        _ => None,
    }
}

/// Decodes one payload.
pub fn decode(payload: &[u8]) -> Result<EventBatch, DecodeError> {
    let mut rest = payload;
    let value = rmpv::decode::read_value_with_max_depth(&mut rest, MAX_DEPTH)
        .map_err(|e| DecodeError::Msgpack(e.to_string()))?;
    if !rest.is_empty() {
        return Err(DecodeError::Trailing(rest.len()));
    }
    let mut skipped = Skipped::default();
    let (ts, events, rank) = match &value {
        Value::Array(items) => {
            if items.len() < 2 {
                return Err(DecodeError::BatchField {
                    field: "events",
                    why: "missing",
                });
            }
            skipped.unknown_fields += count(items.len().saturating_sub(3));
            (Some(&items[0]), Some(&items[1]), items.get(2))
        }
        Value::Map(entries) => {
            let (mut ts, mut events, mut rank) = (None, None, None);
            for (key, value) in entries {
                match key.as_str() {
                    Some("ts") => ts = Some(value),
                    Some("events") => events = Some(value),
                    Some("data_parallel_rank") => rank = Some(value),
                    _ => skipped.unknown_fields += 1,
                }
            }
            (ts, events, rank)
        }
        _ => return Err(DecodeError::BatchShape),
    };
    let ts = match ts {
        Some(Value::F64(t)) => *t,
        Some(Value::F32(t)) => f64::from(*t),
        Some(Value::Integer(n)) => n.as_f64().unwrap_or(0.0),
        None => {
            return Err(DecodeError::BatchField {
                field: "ts",
                why: "missing",
            })
        }
        Some(_) => {
            return Err(DecodeError::BatchField {
                field: "ts",
                why: "not a number",
            })
        }
    };
    let dp_rank = match rank {
        None | Some(Value::Nil) => None,
        Some(Value::Integer(n)) => n.as_i64(),
        Some(_) => {
            return Err(DecodeError::BatchField {
                field: "data_parallel_rank",
                why: "not an integer",
            })
        }
    };
    let Some(Value::Array(raw_events)) = events else {
        return Err(DecodeError::BatchField {
            field: "events",
            why: "missing or not an array",
        });
    };
    let mut events = Vec::with_capacity(raw_events.len());
    for (index, raw) in raw_events.iter().enumerate() {
        if let Some(event) = decode_event(index, raw, &mut skipped)? {
            events.push(event);
        }
    }
    Ok(EventBatch {
        ts,
        events,
        dp_rank,
        skipped,
    })
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The fields of one event, by name: from the map form directly, from the array form by
/// the position each version gives them.
struct Fields<'a> {
    kind: &'static str,
    index: usize,
    named: Vec<(&'static str, &'a Value)>,
}

impl<'a> Fields<'a> {
    fn get(&self, name: &str) -> Option<&'a Value> {
        self.named
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
            .filter(|v| !v.is_nil())
    }

    fn error(&self, field: &'static str, why: &'static str) -> DecodeError {
        DecodeError::Event {
            index: self.index,
            kind: self.kind,
            field,
            why,
        }
    }

    fn hashes(&self, field: &'static str) -> Result<Vec<u64>, DecodeError> {
        let Some(Value::Array(items)) = self.get(field) else {
            return Err(self.error(field, "missing or not an array"));
        };
        items
            .iter()
            .map(|v| normalise_hash(v).ok_or_else(|| self.error(field, "not a block hash")))
            .collect()
    }

    fn opt_hash(&self, field: &'static str) -> Result<Option<u64>, DecodeError> {
        self.get(field)
            .map(|v| normalise_hash(v).ok_or_else(|| self.error(field, "not a block hash")))
            .transpose()
    }

    fn tokens(&self, field: &'static str) -> Result<Vec<u32>, DecodeError> {
        let Some(Value::Array(items)) = self.get(field) else {
            return Err(self.error(field, "missing or not an array"));
        };
        items
            .iter()
            .map(|v| {
                v.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| self.error(field, "not a token id"))
            })
            .collect()
    }

    fn opt_u64(&self, field: &'static str) -> Result<Option<u64>, DecodeError> {
        self.get(field)
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| self.error(field, "not an unsigned integer"))
            })
            .transpose()
    }

    fn opt_u32(&self, field: &'static str) -> Result<Option<u32>, DecodeError> {
        self.opt_u64(field)?
            .map(|n| u32::try_from(n).map_err(|_| self.error(field, "out of range")))
            .transpose()
    }

    fn opt_i64(&self, field: &'static str) -> Result<Option<i64>, DecodeError> {
        self.get(field)
            .map(|v| {
                v.as_i64()
                    .ok_or_else(|| self.error(field, "not an integer"))
            })
            .transpose()
    }

    fn opt_string(&self, field: &'static str) -> Result<Option<String>, DecodeError> {
        self.get(field)
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| self.error(field, "not a string"))
            })
            .transpose()
    }
}

/// The field names of each known event, in the array form's order (after the tag).
const STORED_FIELDS: &[&str] = &[
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
];
const REMOVED_FIELDS: &[&str] = &["block_hashes", "medium", "group_idx"];
const CLEARED_FIELDS: &[&str] = &[];

fn decode_event(
    index: usize,
    raw: &Value,
    skipped: &mut Skipped,
) -> Result<Option<KvEvent>, DecodeError> {
    let tag = match raw {
        Value::Array(items) => items.first().and_then(Value::as_str),
        Value::Map(entries) => entries
            .iter()
            .find(|(k, _)| k.as_str() == Some("type"))
            .and_then(|(_, v)| v.as_str()),
        _ => None,
    };
    let Some(tag) = tag else {
        return Err(DecodeError::Untagged { index });
    };
    let (kind, names): (&'static str, &[&'static str]) = match tag {
        "BlockStored" => ("BlockStored", STORED_FIELDS),
        "BlockRemoved" => ("BlockRemoved", REMOVED_FIELDS),
        "AllBlocksCleared" => ("AllBlocksCleared", CLEARED_FIELDS),
        _ => {
            skipped.unknown_events += 1;
            return Ok(None);
        }
    };
    let mut fields = Fields {
        kind,
        index,
        named: Vec::with_capacity(names.len()),
    };
    match raw {
        Value::Array(items) => {
            for (position, value) in items.iter().skip(1).enumerate() {
                match names.get(position) {
                    Some(name) => fields.named.push((name, value)),
                    None => skipped.unknown_fields += 1,
                }
            }
        }
        Value::Map(entries) => {
            for (key, value) in entries {
                let key = key.as_str();
                if key == Some("type") {
                    continue;
                }
                match names.iter().find(|n| Some(**n) == key) {
                    Some(name) => fields.named.push((name, value)),
                    None => skipped.unknown_fields += 1,
                }
            }
        }
        _ => unreachable!("the tag was found in an array or a map"),
    }
    Ok(Some(match kind {
        "BlockStored" => {
            let block_size = fields
                .opt_u32("block_size")?
                .ok_or_else(|| fields.error("block_size", "missing"))?;
            KvEvent::Stored(BlockStored {
                block_hashes: fields.hashes("block_hashes")?,
                parent: fields.opt_hash("parent_block_hash")?,
                token_ids: fields.tokens("token_ids")?,
                block_size,
                lora_id: fields.opt_i64("lora_id")?,
                lora_name: fields.opt_string("lora_name")?,
                medium: fields.opt_string("medium")?,
                group_idx: fields.opt_u32("group_idx")?,
                spec_kind: fields.opt_string("kv_cache_spec_kind")?,
                sliding_window: fields.opt_u64("kv_cache_spec_sliding_window")?,
            })
        }
        "BlockRemoved" => KvEvent::Removed(BlockRemoved {
            block_hashes: fields.hashes("block_hashes")?,
            medium: fields.opt_string("medium")?,
            group_idx: fields.opt_u32("group_idx")?,
        }),
        _ => KvEvent::AllCleared,
    }))
}
