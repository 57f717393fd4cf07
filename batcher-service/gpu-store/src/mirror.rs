//! The host mirror of one logical shard: which key holds which slot, the metadata the device
//! does not keep, and eviction. It follows the CPU store's shard line for line (dense slots,
//! append while under capacity, CLOCK victim from `cohort_batcher_core::store::clock_sweep`, swap
//! removal), so a `GpuStore` and a `CpuStore` built from the same configuration hold the
//! same entries after the same calls. Every change yields the device writes it implies.

use crate::backend::SlotWrite;
use crate::layout::pack_words;
use cohort_batcher_core::store::clock_sweep::{clock_victim, Victim};
use cohort_batcher_core::store::{EntryMeta, SketchBytes};
use std::collections::HashMap;

/// One logical shard; `base` is its first slot on its device.
pub struct MirrorShard {
    pub base: u32,
    cap: usize,
    keys: Vec<u64>,
    sketches: Vec<SketchBytes>,
    metas: Vec<EntryMeta>,
    refs: Vec<u8>,
    index: HashMap<u64, u32>,
    hand: usize,
    pub evictions: u64,
    pub expirations: u64,
}

impl MirrorShard {
    pub fn new(base: u32, cap: usize) -> MirrorShard {
        MirrorShard {
            base,
            cap,
            keys: Vec::new(),
            sketches: Vec::new(),
            metas: Vec::new(),
            refs: Vec::new(),
            index: HashMap::new(),
            hand: 0,
            evictions: 0,
            expirations: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The entry in local slot `slot`.
    pub fn entry(&self, slot: usize) -> (u64, &SketchBytes, EntryMeta) {
        (self.keys[slot], &self.sketches[slot], self.metas[slot])
    }

    fn device_write(&self, slot: usize) -> SlotWrite {
        SlotWrite {
            slot: self.base + slot as u32,
            key: self.keys[slot],
            words: pack_words(&self.sketches[slot]),
            tenant: self.metas[slot].tenant,
            expires: self.metas[slot].expires_at_s,
        }
    }

    fn device_clear(&self, slot: usize) -> SlotWrite {
        SlotWrite {
            slot: self.base + slot as u32,
            key: 0,
            words: [0; crate::layout::WORDS],
            tenant: 0,
            expires: 0,
        }
    }

    fn set(&mut self, slot: usize, key: u64, sketch: &SketchBytes, meta: EntryMeta, r: bool) {
        self.keys[slot] = key;
        self.sketches[slot] = *sketch;
        self.metas[slot] = meta;
        self.refs[slot] = u8::from(r);
    }

    pub fn upsert(
        &mut self,
        key: u64,
        sketch: &SketchBytes,
        meta: EntryMeta,
        now_s: u32,
        out: &mut Vec<SlotWrite>,
    ) {
        if let Some(&slot) = self.index.get(&key) {
            self.set(slot as usize, key, sketch, meta, true);
            out.push(self.device_write(slot as usize));
            return;
        }
        if self.cap == 0 {
            return;
        }
        if self.len() < self.cap {
            let slot = self.len();
            self.keys.push(key);
            self.sketches.push(*sketch);
            self.metas.push(meta);
            self.refs.push(0);
            self.index.insert(key, slot as u32);
            out.push(self.device_write(slot));
            return;
        }
        let (metas, refs) = (&self.metas, &mut self.refs);
        let victim = clock_victim(
            &mut self.hand,
            self.keys.len(),
            |s| now_s >= metas[s].expires_at_s,
            |s| std::mem::take(&mut refs[s]) != 0,
        );
        match victim {
            Victim::Expired(_) => self.expirations += 1,
            Victim::Evicted(_) => self.evictions += 1,
        }
        let slot = victim.slot();
        self.index.remove(&self.keys[slot]);
        self.set(slot, key, sketch, meta, false);
        self.index.insert(key, slot as u32);
        self.hand = slot + 1;
        out.push(self.device_write(slot));
    }

    /// The live entry of `key`, marked used.
    pub fn get(&mut self, key: u64, now_s: u32) -> Option<(SketchBytes, EntryMeta)> {
        let slot = *self.index.get(&key)? as usize;
        if now_s >= self.metas[slot].expires_at_s {
            return None;
        }
        self.refs[slot] = 1;
        Some((self.sketches[slot], self.metas[slot]))
    }

    /// Move the last slot into `slot` (whose key is already out of the index).
    fn swap_remove(&mut self, slot: usize, out: &mut Vec<SlotWrite>) {
        let last = self.len() - 1;
        if slot != last {
            self.keys.swap(slot, last);
            self.sketches.swap(slot, last);
            self.metas.swap(slot, last);
            self.refs.swap(slot, last);
            self.index.insert(self.keys[slot], slot as u32);
            out.push(self.device_write(slot));
        }
        out.push(self.device_clear(last));
        self.keys.pop();
        self.sketches.pop();
        self.metas.pop();
        self.refs.pop();
        if self.hand > self.len() {
            self.hand = 0;
        }
    }

    pub fn remove(&mut self, key: u64, out: &mut Vec<SlotWrite>) -> bool {
        match self.index.remove(&key) {
            Some(slot) => {
                self.swap_remove(slot as usize, out);
                true
            }
            None => false,
        }
    }

    pub fn expire(&mut self, now_s: u32, out: &mut Vec<SlotWrite>) -> usize {
        let mut dropped = 0;
        let mut slot = 0;
        while slot < self.len() {
            if now_s >= self.metas[slot].expires_at_s {
                self.index.remove(&self.keys[slot]);
                self.swap_remove(slot, out);
                dropped += 1;
            } else {
                slot += 1;
            }
        }
        self.expirations += dropped as u64;
        dropped
    }

    /// Host bytes held (vectors by capacity, the index by its buckets).
    pub fn bytes(&self) -> usize {
        self.keys.capacity() * 8
            + self.sketches.capacity() * 32
            + self.metas.capacity() * std::mem::size_of::<EntryMeta>()
            + self.refs.capacity()
            + self.index.capacity() * (8 + 4 + 1)
    }
}
