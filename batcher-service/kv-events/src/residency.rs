//! One replica's exact block residency, built from its KV events, in Cohort's own keys.
//!
//! The engine names a block by its own hash (by default the low 64 bits of a sha256 over
//! a pickled tuple, seeded per process), which the router cannot reproduce from a prompt.
//! So at ingest every stored block gets Cohort's key instead: a chained 64-bit xxh3 over
//! the parent block's key and the block's token ids ([`chain`]), computed from the event's
//! `token_ids`. The router computes the same chain from a prompt's tokens with
//! [`prefix_keys`], and [`Residency::held_prefix_blocks`] is the run of its leading keys
//! this replica holds: the prefix the engine would find cached.
//!
//! Two tables, and nothing per token: engine hash → own key (a `BlockRemoved` carries only
//! engine hashes) and the set of own keys held; both hash tables use [`KeyHasher`], since
//! their keys are already uniform hashes. About 26 bytes per slot, 30–60 bytes per block
//! held depending on where the tables' power-of-two growth stands
//! ([`Residency::heap_bytes`]; `examples/residency_bench.rs` measures it).
//!
//! # What counts
//!
//! - **Tier**: only blocks of the engine's main tier (`medium` `"GPU"` by default, which
//!   vLLM reports for its own cache on any device; `None`, from versions without the field,
//!   counts too). Offloaded tiers are skipped and counted.
//! - **KV cache groups**: hybrid models (Gemma 3: sliding-window and full-attention layers)
//!   store the same block once per group. Only full-attention groups count: they hold the
//!   whole prefix, and an engine prefix hit needs them; a sliding-window group keeps only
//!   its window's blocks, and its other blocks are evicted first. A group counts unless its
//!   `BlockStored` says it is sliding (`kv_cache_spec_sliding_window` set, or a kind naming
//!   a sliding or local window); the groups learned to be sliding have their removals
//!   skipped too. Events without group fields count (one group).
//! - **Block size**: a stored block of another size than the configured one cannot be
//!   matched against prompts cut at the configured size: skipped and counted, and the
//!   caller marks the stream degraded.
//! - **Parents**: a stored chain whose parent the index does not hold (evicted, or stored
//!   before the subscription) cannot be keyed: skipped and counted. The router could not
//!   reach those blocks either, since a prefix match runs from the first block.
//!
//! Stores are idempotent (a block stored twice, or once per counted group, is held once),
//! and a removal removes: where two engine hashes share an own key (the same tokens under
//! another `cache_salt`, or a second physical copy of a block) the first removal drops it.
//! The index errs towards claiming less than the engine holds, never more.

use crate::decode::{BlockRemoved, BlockStored, KvEvent};
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The seed of a prompt's first block without a LoRA adapter.
pub const ROOT_SEED: u64 = 0x636f_686f_7274_6b76;

/// The chain's seed: [`ROOT_SEED`] for the base model, a hash of the adapter's name for a
/// LoRA adapter (the engine keys an adapter's blocks apart from the base model's too).
pub fn chain_seed(lora: Option<&str>) -> u64 {
    match lora {
        None => ROOT_SEED,
        Some(name) => xxh3_64_with_seed(name.as_bytes(), ROOT_SEED),
    }
}

/// Cohort's key of one block: xxh3-64 of its token ids (little-endian u32s) seeded with its
/// parent's key (or the chain's seed for a prompt's first block).
pub fn chain(parent: u64, tokens: &[u32], scratch: &mut Vec<u8>) -> u64 {
    scratch.clear();
    for token in tokens {
        scratch.extend_from_slice(&token.to_le_bytes());
    }
    xxh3_64_with_seed(scratch, parent)
}

/// The keys of a prompt's full blocks of `block_size` tokens, each chained to the one
/// before (a trailing partial block has none: engines cache full blocks only).
pub fn prefix_keys(tokens: &[u32], block_size: usize) -> Vec<u64> {
    prefix_keys_from(chain_seed(None), tokens, block_size)
}

/// [`prefix_keys`] from a given seed ([`chain_seed`] of a LoRA adapter).
pub fn prefix_keys_from(seed: u64, tokens: &[u32], block_size: usize) -> Vec<u64> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut scratch = Vec::with_capacity(block_size * 4);
    let mut parent = seed;
    tokens
        .chunks_exact(block_size)
        .map(|block| {
            parent = chain(parent, block, &mut scratch);
            parent
        })
        .collect()
}

/// A `Hasher` for keys that are already uniform 64-bit hashes: one multiply and a fold,
/// so that both the table's index (low bits) and its tag (high bits) see every input bit.
#[derive(Clone, Copy, Debug, Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn finish(&self) -> u64 {
        let h = self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^ (h >> 32)
    }
}

type Build = BuildHasherDefault<KeyHasher>;

/// What applying events did, block by block (events are counted by their blocks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyReport {
    /// Blocks stored (an already-held block stored again counts here too).
    pub stored: u64,
    /// Blocks removed that the index held.
    pub removed: u64,
    /// `AllBlocksCleared` events.
    pub cleared: u64,
    /// `BlockStored` events of the configured block size.
    pub stores_ok: u64,
    /// Blocks of another block size than the configured one.
    pub wrong_block_size: u64,
    /// Blocks whose event's token count is not blocks × block size.
    pub wrong_token_count: u64,
    /// Blocks whose parent the index does not hold.
    pub orphans: u64,
    /// Blocks of another tier than the main one.
    pub other_medium: u64,
    /// Blocks of a sliding-window group.
    pub sliding_group: u64,
}

/// One replica's residency index.
#[derive(Clone, Debug)]
pub struct Residency {
    block_size: u32,
    main_medium: String,
    /// Engine hash → own key, for every block held.
    own: HashMap<u64, u64, Build>,
    /// Own keys held.
    held: HashSet<u64, Build>,
    /// Groups learned to be sliding-window (bit `i` for group `i` below 64).
    sliding_groups: u64,
    scratch: Vec<u8>,
}

impl Residency {
    /// An empty index for blocks of `block_size` tokens on tier `main_medium` (`"GPU"` for
    /// vLLM's own cache).
    pub fn new(block_size: u32, main_medium: &str) -> Self {
        Residency {
            block_size,
            main_medium: main_medium.to_owned(),
            own: HashMap::default(),
            held: HashSet::default(),
            sliding_groups: 0,
            scratch: Vec::new(),
        }
    }

    /// The configured block size.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Room for `blocks` blocks without growing.
    pub fn reserve(&mut self, blocks: usize) {
        self.own.reserve(blocks);
        self.held.reserve(blocks);
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// No block held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Whether this own key is held.
    pub fn holds(&self, key: u64) -> bool {
        self.held.contains(&key)
    }

    /// The number of leading `keys` (a prompt's [`prefix_keys`]) held: the prefix, in
    /// blocks, the engine would find cached.
    pub fn held_prefix_blocks(&self, keys: &[u64]) -> usize {
        keys.iter().take_while(|k| self.held.contains(k)).count()
    }

    /// Drops everything (`AllBlocksCleared`, a restart, a lost gap). Learned group kinds
    /// stay: they describe the model, not the cache.
    pub fn clear(&mut self) {
        self.own.clear();
        self.held.clear();
    }

    /// The tables' heap size in bytes, from their capacity: hashbrown keeps a power of two
    /// of slots, 7/8 of them usable, each slot its entry plus one control byte, and one
    /// group (16 bytes) of control bytes more.
    pub fn heap_bytes(&self) -> usize {
        fn table(capacity: usize, entry: usize) -> usize {
            if capacity == 0 {
                return 0;
            }
            let slots = if capacity < 8 {
                (capacity + 1).next_power_of_two()
            } else {
                (capacity * 8 / 7).next_power_of_two()
            };
            slots * (entry + 1) + 16
        }
        table(self.own.capacity(), 16) + table(self.held.capacity(), 8)
    }

    /// Applies one event, adding what it did to `report`.
    pub fn apply(&mut self, event: &KvEvent, report: &mut ApplyReport) {
        match event {
            KvEvent::Stored(stored) => self.store(stored, report),
            KvEvent::Removed(removed) => self.remove(removed, report),
            KvEvent::AllCleared => {
                self.clear();
                report.cleared += 1;
            }
        }
    }

    fn is_main(&self, medium: Option<&str>) -> bool {
        medium.is_none_or(|m| m == self.main_medium)
    }

    fn group_is_sliding(&self, group: Option<u32>) -> bool {
        group.is_some_and(|g| g < 64 && self.sliding_groups & (1 << g) != 0)
    }

    fn store(&mut self, event: &BlockStored, report: &mut ApplyReport) {
        let blocks = event.block_hashes.len() as u64;
        if !self.is_main(event.medium.as_deref()) {
            report.other_medium += blocks;
            return;
        }
        let sliding = event.sliding_window.is_some()
            || event
                .spec_kind
                .as_deref()
                .is_some_and(|k| k.contains("sliding") || k.contains("local"));
        if sliding {
            if let Some(g) = event.group_idx.filter(|g| *g < 64) {
                self.sliding_groups |= 1 << g;
            }
            report.sliding_group += blocks;
            return;
        }
        if event.block_size != self.block_size {
            report.wrong_block_size += blocks;
            return;
        }
        report.stores_ok += 1;
        let size = self.block_size as usize;
        if event.token_ids.len() != event.block_hashes.len() * size {
            report.wrong_token_count += blocks;
            return;
        }
        let mut parent = match event.parent {
            None => chain_seed(lora_name(event).as_deref()),
            Some(hash) => match self.own.get(&hash) {
                Some(key) => *key,
                None => {
                    report.orphans += blocks;
                    return;
                }
            },
        };
        for (hash, tokens) in event
            .block_hashes
            .iter()
            .zip(event.token_ids.chunks_exact(size))
        {
            let key = chain(parent, tokens, &mut self.scratch);
            if let Some(old) = self.own.insert(*hash, key) {
                if old != key {
                    self.held.remove(&old);
                }
            }
            self.held.insert(key);
            parent = key;
        }
        report.stored += blocks;
    }

    fn remove(&mut self, event: &BlockRemoved, report: &mut ApplyReport) {
        if !self.is_main(event.medium.as_deref()) {
            report.other_medium += event.block_hashes.len() as u64;
            return;
        }
        if self.group_is_sliding(event.group_idx) {
            report.sliding_group += event.block_hashes.len() as u64;
            return;
        }
        for hash in &event.block_hashes {
            if let Some(key) = self.own.remove(hash) {
                self.held.remove(&key);
                report.removed += 1;
            }
        }
    }
}

/// The adapter a stored chain belongs to: its name, or for versions that send only the id,
/// the id in decimal.
fn lora_name(event: &BlockStored) -> Option<String> {
    event
        .lora_name
        .clone()
        .or_else(|| event.lora_id.map(|id| id.to_string()))
}
