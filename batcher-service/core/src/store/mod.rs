//! The fingerprint store: int8 sketches with compact metadata, TTL and bounded memory,
//! queried by top-k dot product within one tenant.
//!
//! The batcher keeps every recent request's 32-dimension sketch (and every cohort centroid,
//! see [`crate::cohorts`]) in a store, and asks it "which entries of this tenant are most
//! similar to these sketches?". The [`Store`] trait is deliberately small and batch-shaped
//! so that the CUDA store of a later issue can implement it with one kernel launch per
//! batch; [`CpuStore`] is the default, sharded implementation.
//!
//! Shared contract of every implementation:
//! - an entry is live while `now_s < meta.expires_at_s`; expired entries are never
//!   returned, even before [`Store::expire`] drops them;
//! - the score of a hit is the exact int8 dot product (an `i32`, no overflow possible:
//!   |score| ≤ 32 · 128 · 128);
//! - results are ordered by score descending, ties broken by the smaller key; keys are
//!   unique, so the answer is fully determined and [`reference_top_k`] states it.

mod index;
mod simd_dot;

pub mod clock_sweep;
pub mod coalesce;
pub mod cpu;

pub use coalesce::Coalesced;
pub use cpu::{Capacity, CpuStore, CpuStoreConfig};

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Number of dimensions of a sketch.
pub const DIMS: usize = 32;

/// The bytes of one sketch (`cohort_fingerprint::sketch::Sketch.0`).
pub type SketchBytes = [i8; DIMS];

/// Compact metadata kept with every entry (14 bytes of payload).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryMeta {
    pub tenant: u32,
    pub cohort: u32,
    pub replica: u16,
    /// Absolute expiry time in seconds; the entry is live while `now_s < expires_at_s`.
    pub expires_at_s: u32,
}

/// One result of a top-k query; `score` is the int8 dot product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hit {
    pub key: u64,
    pub score: i32,
    pub meta: EntryMeta,
}

/// Counters and the memory the store holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Entries held (expired ones not yet dropped included).
    pub entries: u64,
    /// Bytes of heap and struct memory the store holds (allocated capacity, not length).
    pub bytes: u64,
    /// Live entries dropped to make room (capacity pressure).
    pub evictions: u64,
    /// Expired entries dropped (by [`Store::expire`] or reclaimed when making room).
    pub expirations: u64,
}

/// A fingerprint store. Every method takes `&self`: implementations synchronise inside, so
/// concurrent gRPC handlers may insert while others query.
pub trait Store: Send + Sync {
    /// Insert or refresh `key` (refresh = new sketch/meta, counts as recently used).
    fn upsert(&self, key: u64, sketch: &SketchBytes, meta: EntryMeta, now_s: u32);
    /// The live entry of `key` (counts as recently used).
    fn get(&self, key: u64, now_s: u32) -> Option<(SketchBytes, EntryMeta)>;
    /// Remove `key`; true when it was held.
    fn remove(&self, key: u64) -> bool;
    /// Up to k live (not expired) entries of `tenant`, highest dot product first; ties broken by smaller key.
    fn top_k(&self, tenant: u32, query: &SketchBytes, k: usize, now_s: u32) -> Vec<Hit> {
        self.top_k_batch(tenant, std::slice::from_ref(query), k, now_s)
            .pop()
            .unwrap_or_default()
    }
    /// Same for many queries (this is where throughput comes from: each entry is read once per batch).
    fn top_k_batch(
        &self,
        tenant: u32,
        queries: &[SketchBytes],
        k: usize,
        now_s: u32,
    ) -> Vec<Vec<Hit>>;
    /// Up to k live entries of `tenant` among `keys` (candidates chosen elsewhere, e.g. the
    /// recent members of the nearest cohorts: [`crate::neighbours`]), with their sketches,
    /// highest dot product first, ties by smaller key; keys not held, expired or of another
    /// tenant are skipped. Reading counts as a use, as [`Store::get`] does.
    fn top_k_among(
        &self,
        tenant: u32,
        query: &SketchBytes,
        keys: &[u64],
        k: usize,
        now_s: u32,
    ) -> Vec<(Hit, SketchBytes)> {
        let mut keys = keys.to_vec();
        keys.sort_unstable();
        keys.dedup();
        let mut hits: Vec<(Hit, SketchBytes)> = keys
            .into_iter()
            .filter_map(|key| {
                let (sketch, meta) = self.get(key, now_s)?;
                let score = dot(query, &sketch);
                (meta.tenant == tenant).then_some((Hit { key, score, meta }, sketch))
            })
            .collect();
        hits.sort_by(|a, b| b.0.score.cmp(&a.0.score).then(a.0.key.cmp(&b.0.key)));
        hits.truncate(k);
        hits
    }
    /// Drop expired entries; returns how many.
    fn expire(&self, now_s: u32) -> usize;
    fn stats(&self) -> StoreStats;
}

/// A boxed store is a store (the batcher holds the one `--store` chose as `Box<dyn Store>`).
impl<S: Store + ?Sized> Store for Box<S> {
    fn upsert(&self, key: u64, sketch: &SketchBytes, meta: EntryMeta, now_s: u32) {
        (**self).upsert(key, sketch, meta, now_s)
    }
    fn get(&self, key: u64, now_s: u32) -> Option<(SketchBytes, EntryMeta)> {
        (**self).get(key, now_s)
    }
    fn remove(&self, key: u64) -> bool {
        (**self).remove(key)
    }
    fn top_k(&self, tenant: u32, query: &SketchBytes, k: usize, now_s: u32) -> Vec<Hit> {
        (**self).top_k(tenant, query, k, now_s)
    }
    fn top_k_batch(
        &self,
        tenant: u32,
        queries: &[SketchBytes],
        k: usize,
        now_s: u32,
    ) -> Vec<Vec<Hit>> {
        (**self).top_k_batch(tenant, queries, k, now_s)
    }
    fn top_k_among(
        &self,
        tenant: u32,
        query: &SketchBytes,
        keys: &[u64],
        k: usize,
        now_s: u32,
    ) -> Vec<(Hit, SketchBytes)> {
        (**self).top_k_among(tenant, query, keys, k, now_s)
    }
    fn expire(&self, now_s: u32) -> usize {
        (**self).expire(now_s)
    }
    fn stats(&self) -> StoreStats {
        (**self).stats()
    }
}

/// Exact int8 dot product.
pub fn dot(a: &SketchBytes, b: &SketchBytes) -> i32 {
    a.iter()
        .zip(b.iter())
        .map(|(&x, &y)| i32::from(x) * i32::from(y))
        .sum()
}

/// Whether an entry with this metadata is live at `now_s`.
#[inline]
pub fn is_live(meta: &EntryMeta, now_s: u32) -> bool {
    now_s < meta.expires_at_s
}

/// The specification of top-k, as a plain sort over all entries: used by the tests of
/// every [`Store`] implementation.
pub fn reference_top_k<'a>(
    entries: impl IntoIterator<Item = (u64, &'a SketchBytes, EntryMeta)>,
    tenant: u32,
    query: &SketchBytes,
    k: usize,
    now_s: u32,
) -> Vec<Hit> {
    let mut hits: Vec<Hit> = entries
        .into_iter()
        .filter(|(_, _, meta)| meta.tenant == tenant && is_live(meta, now_s))
        .map(|(key, sketch, meta)| Hit {
            key,
            score: dot(sketch, query),
            meta,
        })
        .collect();
    hits.sort_by(|a, b| b.score.cmp(&a.score).then(a.key.cmp(&b.key)));
    hits.truncate(k);
    hits
}

/// A hit ordered so that the heap's maximum is the *worst* kept hit (lowest score, then
/// largest key).
#[derive(Clone, Copy, Debug)]
struct Worst(Hit);

impl PartialEq for Worst {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Worst {}
impl PartialOrd for Worst {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Worst {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .0
            .score
            .cmp(&self.0.score)
            .then(self.0.key.cmp(&other.0.key))
    }
}

/// Bounded collector of the k best hits (score descending, key ascending). Implementations
/// scan with [`TopK::floor`] as a cheap pre-filter and [`TopK::offer`] the survivors.
#[derive(Debug, Clone)]
pub struct TopK {
    k: usize,
    heap: BinaryHeap<Worst>,
}

impl TopK {
    pub fn new(k: usize) -> TopK {
        TopK {
            k,
            heap: BinaryHeap::new(),
        }
    }

    /// Scores below this can never enter (`i32::MIN` while fewer than k are kept). A score
    /// equal to it may still enter with a smaller key.
    #[inline]
    pub fn floor(&self) -> i32 {
        if self.heap.len() < self.k {
            i32::MIN
        } else {
            self.heap.peek().map_or(i32::MIN, |w| w.0.score)
        }
    }

    /// Offer a hit; kept if it is among the k best so far.
    pub fn offer(&mut self, hit: Hit) {
        if self.k == 0 {
            return;
        }
        if self.heap.len() < self.k {
            self.heap.push(Worst(hit));
            return;
        }
        if let Some(worst) = self.heap.peek() {
            let better =
                hit.score > worst.0.score || (hit.score == worst.0.score && hit.key < worst.0.key);
            if better {
                self.heap.pop();
                self.heap.push(Worst(hit));
            }
        }
    }

    /// The kept hits, best first.
    pub fn into_sorted(self) -> Vec<Hit> {
        // Ascending in `Worst` order is best first.
        self.heap
            .into_sorted_vec()
            .into_iter()
            .map(|w| w.0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(tenant: u32) -> EntryMeta {
        EntryMeta {
            tenant,
            cohort: 0,
            replica: 0,
            expires_at_s: 100,
        }
    }

    #[test]
    fn dot_extremes_do_not_overflow() {
        assert_eq!(dot(&[-128; DIMS], &[-128; DIMS]), 32 * 128 * 128);
        assert_eq!(dot(&[-128; DIMS], &[127; DIMS]), -32 * 128 * 127);
    }

    #[test]
    fn topk_orders_by_score_then_key() {
        let mut top = TopK::new(3);
        for (key, score) in [(5, 1), (4, 3), (3, 3), (2, 0), (1, 1), (9, 7)] {
            top.offer(Hit {
                key,
                score,
                meta: meta(0),
            });
        }
        let keys: Vec<u64> = top.into_sorted().iter().map(|h| h.key).collect();
        assert_eq!(keys, vec![9, 3, 4]);
    }

    #[test]
    fn topk_zero_and_floor() {
        let mut top = TopK::new(0);
        top.offer(Hit {
            key: 1,
            score: 1,
            meta: meta(0),
        });
        assert!(top.into_sorted().is_empty());
        let mut top = TopK::new(1);
        assert_eq!(top.floor(), i32::MIN);
        top.offer(Hit {
            key: 1,
            score: 5,
            meta: meta(0),
        });
        assert_eq!(top.floor(), 5);
    }

    #[test]
    fn reference_filters_tenant_and_expiry() {
        let a = [1i8; DIMS];
        let mut expired = meta(1);
        expired.expires_at_s = 10;
        let entries = [(1u64, &a, meta(1)), (2, &a, meta(2)), (3, &a, expired)];
        let hits = reference_top_k(entries.iter().copied(), 1, &a, 10, 10);
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].key, 1);
    }
}
