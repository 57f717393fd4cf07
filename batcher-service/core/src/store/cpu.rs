//! `CpuStore`: the default fingerprint store, sharded by key, scanned with a vectorised
//! int8 kernel.
//!
//! # Cost
//! At batch 1 a query streams the shard's sketches, tenants and expiry times: the scan is
//! bound by memory bandwidth. At batch 64 it is compute bound on `vpmaddwd`, with the
//! Cauchy–Schwarz pruning of the kernel (see `simd_dot`); so few query × tile pairs hold a
//! candidate that the selection pass walks only the tiles the kernel flags (a `u64` per
//! query and page). Without AVX2 the portable kernel gives the same answers more slowly.
//! The layout and kernel were chosen by measurement (about 60 B an entry, index included;
//! over 2,000 queries/s at batch 64 on one core): docs/DECISIONS.md, "`CpuStore`: paged
//! structure of arrays and an `i16` `vpmaddwd` kernel".
//!
//! # Layout
//! Keys hash (splitmix64) to one of N shards, each behind its own `RwLock`: inserts lock
//! one shard for writing, queries lock one shard at a time for reading, so concurrent
//! handlers interleave. A shard holds its entries densely in pages of 512 slots, each page
//! a structure of arrays: sketches in tiles of 8 (dimension-pair-major, see `simd_dot`), then
//! keys, tenants, expiry times, cohorts, replicas and one reference byte each — 55 bytes a
//! slot. Pages are allocated one at a time (at most one partly used page per shard, and no
//! reallocation copies while a lock is held). The key → slot index is an open-addressing
//! table of `u32` slots (4 bytes a bucket, load ≤ 0.8: 5–7.5 bytes an entry); the key
//! itself is stored once, in the page. Removal swaps the last slot into the hole, so scans
//! never meet holes.
//!
//! # Why not `lru::LruCache`
//! An `LruCache<u64, Entry>` allocates one node per entry (key, value, two pointers) plus
//! a hash slot holding a pointer, and its entries are scattered on the heap, so a scan for
//! top-k chases pointers instead of streaming contiguous sketches.
//!
//! # Eviction: CLOCK (second chance), per shard
//! Each slot has a reference byte: set by a refresh (`upsert` of a held key) or a `get`,
//! clear on insert. When a full shard must admit a key, its hand sweeps the slots: an
//! expired entry is taken at once (counted as an expiration); a referenced one loses its
//! reference and is skipped; the first unreferenced one is evicted. The newcomer takes the
//! victim's slot, just behind the hand, so it survives a whole sweep. This approximates LRU
//! (an entry used since the hand last passed always outlives one that was not) for one byte
//! a slot instead of two list pointers (8 bytes), which would break the 64-byte budget.
//! Capacity is split evenly over the shards, so eviction is per shard (as in any sharded
//! cache): with 16 shards of 62.5 K entries the fullest shard holds ~1% more than the mean.
//!
//! # Top-k
//! Per shard and page: one pass computes which slots are live entries of the tenant (a
//! bitmask per tile), the kernel scores the page against up to 64 queries at a time and
//! flags, per query, the tiles holding candidates (scores at or above the query's current
//! k-th best), and a selection pass offers only those to a bounded heap ([`TopK`]). Every
//! page is read once per batch, which is where batching pays: at batch 1 a scan is bound
//! by memory bandwidth, at batch 64 by `vpmaddwd`.

use super::clock_sweep::{clock_victim, shard_capacities, shard_of, Victim};
use super::index::SlotIndex;
use super::simd_dot::{self, pack_query, QueryPairs, Tile, TILE};
use super::{EntryMeta, Hit, SketchBytes, Store, StoreStats, TopK};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Slots per page.
pub const PAGE: usize = 512;
const TILES_PER_PAGE: usize = PAGE / TILE;
// `kernel::scores` reports candidate tiles in a `u64` per query.
const _: () = assert!(TILES_PER_PAGE <= 64);
/// Queries scored together against one page (the score buffer is this × `PAGE` × 4 bytes).
const QUERY_GROUP: usize = 64;
/// Bytes an entry is planned at when the capacity is given in bytes (55 in the page, ≤ 7.5
/// in the index, the rest covers the partly used page of each shard).
pub const PLANNED_BYTES_PER_ENTRY: usize = 64;

/// How much the store may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capacity {
    /// At most this many entries.
    Entries(usize),
    /// About this many bytes (entries = bytes / [`PLANNED_BYTES_PER_ENTRY`]).
    Bytes(usize),
}

impl Capacity {
    pub fn entries(self) -> usize {
        match self {
            Capacity::Entries(n) => n,
            Capacity::Bytes(b) => b / PLANNED_BYTES_PER_ENTRY,
        }
    }
}

/// Construction parameters of a [`CpuStore`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuStoreConfig {
    pub capacity: Capacity,
    /// Number of shards (clamped to 1..=1024).
    pub shards: usize,
}

impl CpuStoreConfig {
    /// The capacity of each shard (1..=1024 shards, keys placed by [`shard_of`]); another
    /// store that follows this plan and [`clock_victim`] holds the same entries.
    pub fn shard_capacities(&self) -> Vec<usize> {
        let n = self.shards.clamp(1, 1024);
        let capacity = self.capacity.entries().min(n * (u32::MAX as usize - 1));
        shard_capacities(capacity, n)
    }
}

impl Default for CpuStoreConfig {
    fn default() -> Self {
        CpuStoreConfig {
            capacity: Capacity::Entries(1 << 20),
            shards: 16,
        }
    }
}

/// One page of slots, structure of arrays.
struct Page {
    tiles: [Tile; TILES_PER_PAGE],
    keys: [u64; PAGE],
    tenants: [u32; PAGE],
    expires: [u32; PAGE],
    cohorts: [u32; PAGE],
    replicas: [u16; PAGE],
    refs: [AtomicU8; PAGE],
}

impl Page {
    fn boxed() -> Box<Page> {
        Box::new(Page {
            tiles: [Tile::default(); TILES_PER_PAGE],
            keys: [0; PAGE],
            tenants: [0; PAGE],
            expires: [0; PAGE],
            cohorts: [0; PAGE],
            replicas: [0; PAGE],
            refs: [const { AtomicU8::new(0) }; PAGE],
        })
    }

    fn meta(&self, e: usize) -> EntryMeta {
        EntryMeta {
            tenant: self.tenants[e],
            cohort: self.cohorts[e],
            replica: self.replicas[e],
            expires_at_s: self.expires[e],
        }
    }
}

#[inline]
fn key_in(pages: &[Box<Page>], slot: u32) -> u64 {
    let slot = slot as usize;
    pages[slot / PAGE].keys[slot % PAGE]
}

struct Shard {
    pages: Vec<Box<Page>>,
    len: usize,
    cap: usize,
    hand: usize,
    index: SlotIndex,
    evictions: u64,
    expirations: u64,
}

impl Shard {
    fn new(cap: usize) -> Shard {
        Shard {
            pages: Vec::new(),
            len: 0,
            cap,
            hand: 0,
            index: SlotIndex::default(),
            evictions: 0,
            expirations: 0,
        }
    }

    fn find(&self, key: u64) -> Option<usize> {
        let pages = &self.pages;
        self.index
            .find(key, |s| key_in(pages, s))
            .map(|s| s as usize)
    }

    fn page(&self, slot: usize) -> (&Page, usize) {
        (&self.pages[slot / PAGE], slot % PAGE)
    }

    fn write(
        &mut self,
        slot: usize,
        key: u64,
        sketch: &SketchBytes,
        meta: EntryMeta,
        referenced: bool,
    ) {
        let page = &mut self.pages[slot / PAGE];
        let e = slot % PAGE;
        page.tiles[e / TILE].set(e % TILE, sketch);
        page.keys[e] = key;
        page.tenants[e] = meta.tenant;
        page.expires[e] = meta.expires_at_s;
        page.cohorts[e] = meta.cohort;
        page.replicas[e] = meta.replica;
        page.refs[e].store(u8::from(referenced), Ordering::Relaxed);
    }

    fn read(&self, slot: usize) -> (u64, SketchBytes, EntryMeta, bool) {
        let (page, e) = self.page(slot);
        (
            page.keys[e],
            page.tiles[e / TILE].get(e % TILE),
            page.meta(e),
            page.refs[e].load(Ordering::Relaxed) != 0,
        )
    }

    fn expired(&self, slot: usize, now_s: u32) -> bool {
        let (page, e) = self.page(slot);
        now_s >= page.expires[e]
    }

    fn upsert(&mut self, key: u64, sketch: &SketchBytes, meta: EntryMeta, now_s: u32) {
        if let Some(slot) = self.find(key) {
            self.write(slot, key, sketch, meta, true);
            return;
        }
        if self.cap == 0 {
            return;
        }
        if self.len < self.cap {
            let slot = self.len;
            if slot / PAGE >= self.pages.len() {
                self.pages.push(Page::boxed());
            }
            let pages = &self.pages;
            self.index.reserve(slot + 1, self.cap, |s| key_in(pages, s));
            self.write(slot, key, sketch, meta, false);
            self.index.insert(key, slot as u32);
            self.len += 1;
            return;
        }
        let victim = self.clock_victim(now_s);
        let old = key_in(&self.pages, victim as u32);
        let pages = &self.pages;
        self.index.remove(old, |s| key_in(pages, s));
        self.write(victim, key, sketch, meta, false);
        self.index.insert(key, victim as u32);
        self.hand = victim + 1;
    }

    /// The slot to reuse in a full shard (see the module doc and [`clock_victim`]); counts
    /// the drop.
    fn clock_victim(&mut self, now_s: u32) -> usize {
        let pages = &self.pages;
        let victim = clock_victim(
            &mut self.hand,
            self.len,
            |slot| now_s >= pages[slot / PAGE].expires[slot % PAGE],
            |slot| pages[slot / PAGE].refs[slot % PAGE].swap(0, Ordering::Relaxed) != 0,
        );
        match victim {
            Victim::Expired(_) => self.expirations += 1,
            Victim::Evicted(_) => self.evictions += 1,
        }
        victim.slot()
    }

    /// Remove the entry in `slot` (its key already out of the index) by moving the last
    /// slot into it.
    fn swap_remove(&mut self, slot: usize) {
        let last = self.len - 1;
        if slot != last {
            let (key, sketch, meta, referenced) = self.read(last);
            self.write(slot, key, &sketch, meta, referenced);
            let pages = &self.pages;
            self.index.repoint(key, slot as u32, |s| key_in(pages, s));
        }
        self.len = last;
        let pages = &self.pages;
        self.index.shrink(last, |s| key_in(pages, s));
        // Keep at most one empty page beyond the used ones.
        while self.pages.len() > self.len.div_ceil(PAGE) + 1 {
            self.pages.pop();
        }
        if self.hand > self.len {
            self.hand = 0;
        }
    }

    fn remove(&mut self, key: u64) -> bool {
        let pages = &self.pages;
        match self.index.remove(key, |s| key_in(pages, s)) {
            Some(slot) => {
                self.swap_remove(slot as usize);
                true
            }
            None => false,
        }
    }

    fn expire(&mut self, now_s: u32) -> usize {
        let mut dropped = 0;
        let mut slot = 0;
        while slot < self.len {
            if self.expired(slot, now_s) {
                let key = key_in(&self.pages, slot as u32);
                let pages = &self.pages;
                self.index.remove(key, |s| key_in(pages, s));
                self.swap_remove(slot);
                dropped += 1;
            } else {
                slot += 1;
            }
        }
        self.expirations += dropped as u64;
        dropped
    }

    fn bytes(&self) -> usize {
        self.pages.capacity() * std::mem::size_of::<Box<Page>>()
            + self.pages.len() * std::mem::size_of::<Page>()
            + self.index.bytes()
    }

    /// Offer this shard's live entries of `tenant` to every query's collector.
    fn scan(
        &self,
        tenant: u32,
        packed: &[QueryPairs],
        tops: &mut [TopK],
        now_s: u32,
        buf: &mut ScanBuffers,
    ) {
        for (p, page) in self.pages.iter().enumerate() {
            let n = self.len.saturating_sub(p * PAGE).min(PAGE);
            if n == 0 {
                break;
            }
            let mut masks = [0u8; TILES_PER_PAGE];
            simd_dot::live_masks(&page.tenants, &page.expires, n, tenant, now_s, &mut masks);
            let Some(first) = masks.iter().position(|&m| m != 0) else {
                continue;
            };
            let end = masks.iter().rposition(|&m| m != 0).map_or(first, |l| l + 1);
            let tiles = &page.tiles[first..end];
            let live = &masks[first..end];
            for (queries, tops) in packed.chunks(QUERY_GROUP).zip(tops.chunks_mut(QUERY_GROUP)) {
                buf.floors.clear();
                buf.floors.extend(tops.iter().map(TopK::floor));
                let ok = simd_dot::scores(
                    tiles,
                    queries,
                    &buf.floors,
                    live,
                    &mut buf.scores,
                    PAGE,
                    &mut buf.cands,
                    TILES_PER_PAGE,
                    &mut buf.tile_masks,
                );
                if !ok {
                    continue;
                }
                for (q, top) in tops.iter_mut().enumerate() {
                    let cands = &buf.cands[q * TILES_PER_PAGE..q * TILES_PER_PAGE + tiles.len()];
                    let row = &buf.scores[q * PAGE..q * PAGE + tiles.len() * TILE];
                    select(page, cands, buf.tile_masks[q], first, row, top);
                }
            }
        }
    }
}

/// Scratch of one top-k call.
struct ScanBuffers {
    floors: Vec<i32>,
    scores: Vec<i32>,
    cands: Vec<u8>,
    /// Per query, bit t set when tile t has a candidate.
    tile_masks: Vec<u64>,
}

impl ScanBuffers {
    fn new(queries: usize) -> ScanBuffers {
        let group = queries.min(QUERY_GROUP);
        ScanBuffers {
            floors: Vec::with_capacity(group),
            scores: vec![0; group * PAGE],
            cands: vec![0; group * TILES_PER_PAGE],
            tile_masks: vec![0; group],
        }
    }
}

/// Offer the candidates of one page row (scores ≥ the floor when the page was scored)
/// that can still enter `top`; `tiles` has bit t set when `cands[t]` is not zero.
#[inline]
fn select(page: &Page, cands: &[u8], tiles: u64, first_tile: usize, row: &[i32], top: &mut TopK) {
    let mut tiles = tiles;
    while tiles != 0 {
        let t = tiles.trailing_zeros() as usize;
        tiles &= tiles - 1;
        let mut bits = cands[t];
        while bits != 0 {
            let j = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let score = row[t * TILE + j];
            if score < top.floor() {
                continue;
            }
            let e = (first_tile + t) * TILE + j;
            top.offer(Hit {
                key: page.keys[e],
                score,
                meta: page.meta(e),
            });
        }
    }
}

/// The sharded CPU store (see the module doc).
pub struct CpuStore {
    shards: Vec<RwLock<Shard>>,
    capacity: usize,
}

impl CpuStore {
    pub fn new(config: CpuStoreConfig) -> CpuStore {
        let caps = config.shard_capacities();
        let capacity = caps.iter().sum();
        let shards = caps
            .into_iter()
            .map(|cap| RwLock::new(Shard::new(cap)))
            .collect();
        CpuStore { shards, capacity }
    }

    /// A store of at most `entries` entries over 16 shards.
    pub fn with_capacity(entries: usize) -> CpuStore {
        CpuStore::new(CpuStoreConfig {
            capacity: Capacity::Entries(entries),
            ..CpuStoreConfig::default()
        })
    }

    /// Entry capacity (summed over the shards).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    fn shard_of(&self, key: u64) -> &RwLock<Shard> {
        &self.shards[shard_of(key, self.shards.len())]
    }

    fn read(lock: &RwLock<Shard>) -> RwLockReadGuard<'_, Shard> {
        lock.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(lock: &RwLock<Shard>) -> RwLockWriteGuard<'_, Shard> {
        lock.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Every held entry (expired ones included), for tests and snapshots.
    pub fn entries(&self) -> Vec<(u64, SketchBytes, EntryMeta)> {
        let mut out = Vec::new();
        for lock in &self.shards {
            let shard = Self::read(lock);
            for slot in 0..shard.len {
                let (key, sketch, meta, _) = shard.read(slot);
                out.push((key, sketch, meta));
            }
        }
        out
    }
}

impl Store for CpuStore {
    fn upsert(&self, key: u64, sketch: &SketchBytes, meta: EntryMeta, now_s: u32) {
        Self::write(self.shard_of(key)).upsert(key, sketch, meta, now_s);
    }

    fn get(&self, key: u64, now_s: u32) -> Option<(SketchBytes, EntryMeta)> {
        let shard = Self::read(self.shard_of(key));
        let slot = shard.find(key)?;
        if shard.expired(slot, now_s) {
            return None;
        }
        let (_, sketch, meta, _) = shard.read(slot);
        let (page, e) = shard.page(slot);
        page.refs[e].store(1, Ordering::Relaxed);
        Some((sketch, meta))
    }

    fn remove(&self, key: u64) -> bool {
        Self::write(self.shard_of(key)).remove(key)
    }

    fn top_k_batch(
        &self,
        tenant: u32,
        queries: &[SketchBytes],
        k: usize,
        now_s: u32,
    ) -> Vec<Vec<Hit>> {
        if k == 0 || queries.is_empty() {
            return vec![Vec::new(); queries.len()];
        }
        let packed: Vec<QueryPairs> = queries.iter().map(pack_query).collect();
        let mut tops: Vec<TopK> = (0..queries.len()).map(|_| TopK::new(k)).collect();
        let mut buf = ScanBuffers::new(queries.len());
        for lock in &self.shards {
            Self::read(lock).scan(tenant, &packed, &mut tops, now_s, &mut buf);
        }
        tops.into_iter().map(TopK::into_sorted).collect()
    }

    fn expire(&self, now_s: u32) -> usize {
        self.shards
            .iter()
            .map(|lock| Self::write(lock).expire(now_s))
            .sum()
    }

    fn stats(&self) -> StoreStats {
        let mut stats = StoreStats {
            bytes: (std::mem::size_of::<CpuStore>()
                + self.shards.capacity() * std::mem::size_of::<RwLock<Shard>>())
                as u64,
            ..StoreStats::default()
        };
        for lock in &self.shards {
            let shard = Self::read(lock);
            stats.entries += shard.len as u64;
            stats.bytes += shard.bytes() as u64;
            stats.evictions += shard.evictions;
            stats.expirations += shard.expirations;
        }
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::index::mix;
    use crate::store::reference_top_k;

    fn meta(tenant: u32, expires_at_s: u32) -> EntryMeta {
        EntryMeta {
            tenant,
            cohort: 1,
            replica: 2,
            expires_at_s,
        }
    }

    #[test]
    fn upsert_get_remove() {
        let store = CpuStore::with_capacity(100);
        let s = [3i8; 32];
        store.upsert(7, &s, meta(1, 50), 0);
        assert_eq!(store.get(7, 10), Some((s, meta(1, 50))));
        assert_eq!(store.get(7, 50), None, "expired at expires_at_s");
        assert!(store.remove(7));
        assert!(!store.remove(7));
        assert_eq!(store.stats().entries, 0);
    }

    #[test]
    fn many_pages_match_reference_and_shrink() {
        let store = CpuStore::new(CpuStoreConfig {
            capacity: Capacity::Entries(10_000),
            shards: 2,
        });
        let mut x = 1u64;
        for key in 0..3000u64 {
            x = mix(x);
            let s: SketchBytes = std::array::from_fn(|i| (x >> (i % 8 * 8)) as i8);
            store.upsert(key, &s, meta((key % 3) as u32, 100 + (key % 7) as u32), 0);
        }
        let q: SketchBytes = std::array::from_fn(|i| i as i8 - 10);
        let entries = store.entries();
        for now in [0, 103] {
            let got = store.top_k(1, &q, 20, now);
            let want = reference_top_k(entries.iter().map(|(k, s, m)| (*k, s, *m)), 1, &q, 20, now);
            assert_eq!(got, want);
        }
        let before = store.stats().bytes;
        let due = entries
            .iter()
            .filter(|(_, _, m)| m.expires_at_s <= 104)
            .count();
        assert_eq!(store.expire(104), due);
        assert_eq!(store.stats().expirations, due as u64);
        for key in 0..3000 {
            store.remove(key);
        }
        assert!(store.stats().bytes < before);
        assert_eq!(store.stats().entries, 0);
    }
}
