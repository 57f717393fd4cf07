//! A replica's prefix KV cache, modelled like vLLM's automatic prefix caching: whole blocks
//! of `block_tokens` tokens, identified by chained hashes, kept in an LRU of `capacity`
//! blocks.
//!
//! - Chaining: block i's hash covers block i−1's hash and its own token ids, so equal blocks
//!   under different prefixes never match; `cache_salt` seeds the chain (vLLM mixes the salt
//!   into the first block).
//! - Lookup ([`PrefixCache::cached_tokens`]): the longest run of leading blocks present,
//!   capped so at least one prompt token is computed, in whole blocks (vLLM v1 caps a hit at
//!   `prompt − 1` tokens and rounds down to blocks). Lookups do not touch.
//! - Insert ([`PrefixCache::insert`]): after a prefill, every full block is inserted or
//!   touched, tail first, so the head blocks are the most recent: under pressure a prefix
//!   loses its tail before its head, and a shared head survives longest. It returns what
//!   changed ([`CacheChange`]): the runs of newly held blocks and the blocks evicted, which
//!   the KV events ([`crate::events`]) publish.
//! - Since a block is always touched after its descendants, it is evicted after them: the
//!   blocks held form prefix-closed chains (a held block's parent is held), as in vLLM.
//!
//! The same code serves the replicas and `bound` (one pooled cache).

use lru::LruCache;
use std::collections::HashSet;
use std::num::NonZeroUsize;
use std::ops::Range;
use xxhash_rust::xxh3::xxh3_64;

/// The chained hashes of the full blocks of `tokens`.
pub fn block_hashes(tokens: &[u32], block_tokens: usize, salt: Option<&str>) -> Vec<u64> {
    let block_tokens = block_tokens.max(1);
    let mut previous = salt.map_or(0, |s| xxh3_64(s.as_bytes()));
    let mut buffer = Vec::with_capacity(8 + 4 * block_tokens);
    tokens
        .chunks_exact(block_tokens)
        .map(|block| {
            buffer.clear();
            buffer.extend_from_slice(&previous.to_le_bytes());
            for token in block {
                buffer.extend_from_slice(&token.to_le_bytes());
            }
            previous = xxh3_64(&buffer);
            previous
        })
        .collect()
}

/// What one [`PrefixCache::insert`] changed, as the difference between the blocks held
/// before and after it (a block evicted and inserted again within the call is neither).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheChange {
    /// The newly held blocks, as runs of consecutive indices into the inserted hashes, in
    /// prefix order. Each run's parent (the hash before it) is held, or the run starts the
    /// prompt.
    pub stored: Vec<Range<usize>>,
    /// The blocks no longer held, in the order they were evicted.
    pub evicted: Vec<u64>,
}

impl CacheChange {
    /// Whether nothing was stored or evicted.
    pub fn is_empty(&self) -> bool {
        self.stored.is_empty() && self.evicted.is_empty()
    }
}

/// An LRU of block hashes. Capacity 0 caches nothing.
pub struct PrefixCache {
    blocks: Option<LruCache<u64, ()>>,
    block_tokens: usize,
}

impl PrefixCache {
    pub fn new(capacity_blocks: usize, block_tokens: usize) -> PrefixCache {
        PrefixCache {
            blocks: NonZeroUsize::new(capacity_blocks).map(LruCache::new),
            block_tokens: block_tokens.max(1),
        }
    }

    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.blocks.as_ref().map_or(0, LruCache::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn capacity(&self) -> usize {
        self.blocks.as_ref().map_or(0, |b| b.cap().get())
    }

    /// Leading blocks of `hashes` present in the cache (no touch).
    pub fn leading_hits(&self, hashes: &[u64]) -> usize {
        let Some(blocks) = &self.blocks else { return 0 };
        hashes.iter().take_while(|h| blocks.contains(h)).count()
    }

    /// Cached tokens for a prompt of `prompt_tokens` tokens with full-block `hashes`: the
    /// leading hits, at most `prompt_tokens − 1` tokens, in whole blocks.
    pub fn cached_tokens(&self, hashes: &[u64], prompt_tokens: usize) -> usize {
        let hit = self.leading_hits(hashes) * self.block_tokens;
        let cap = prompt_tokens.saturating_sub(1) / self.block_tokens * self.block_tokens;
        hit.min(cap)
    }

    /// Inserts or touches every block, tail first (the head ends most recent); returns the
    /// blocks newly held and those evicted.
    pub fn insert(&mut self, hashes: &[u64]) -> CacheChange {
        let Some(blocks) = &mut self.blocks else {
            return CacheChange::default();
        };
        let held_before: Vec<bool> = hashes.iter().map(|h| blocks.contains(h)).collect();
        let mut evicted = Vec::new();
        for hash in hashes.iter().rev() {
            // `push` is `put` that also returns the entry it evicted (or the same key's old
            // entry, when the key was present).
            if let Some((old, ())) = blocks.push(*hash, ()) {
                if old != *hash {
                    evicted.push(old);
                }
            }
        }
        if !evicted.is_empty() {
            // A prompt longer than the cache evicts its own blocks: a block of this prompt
            // may be evicted and inserted again (held after: no change), or inserted and
            // evicted (not held before: no change), or both, more than once.
            let new: HashSet<u64> = hashes
                .iter()
                .zip(&held_before)
                .filter(|(_, &held)| !held)
                .map(|(h, _)| *h)
                .collect();
            let mut seen = HashSet::new();
            evicted.retain(|h| !blocks.contains(h) && !new.contains(h) && seen.insert(*h));
        }
        let mut stored: Vec<Range<usize>> = Vec::new();
        for (i, hash) in hashes.iter().enumerate() {
            if held_before[i] || !blocks.contains(hash) {
                continue;
            }
            match stored.last_mut() {
                Some(run) if run.end == i => run.end = i + 1,
                _ => stored.push(i..i + 1),
            }
        }
        CacheChange { stored, evicted }
    }

    /// Drops every block; returns how many were held.
    pub fn clear(&mut self) -> usize {
        let held = self.len();
        if let Some(blocks) = &mut self.blocks {
            blocks.clear();
        }
        held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(n: u32, base: u32) -> Vec<u32> {
        (base..base + n).collect()
    }

    #[test]
    fn hashes_chain_so_a_block_matches_only_under_its_prefix() {
        let a = block_hashes(&[1, 2, 3, 4, 5], 2, None);
        assert_eq!(a.len(), 2, "the partial tail block is not hashed");
        let b = block_hashes(&[9, 9, 3, 4], 2, None);
        assert_ne!(a[1], b[1], "same tokens, different prefix");
        assert_eq!(a, block_hashes(&[1, 2, 3, 4, 7], 2, None)[..2]);
        let salted = block_hashes(&[1, 2, 3, 4], 2, Some("tenant"));
        assert_ne!(salted[0], a[0]);
        assert_ne!(salted[1], a[1]);
    }

    #[test]
    fn a_repeated_prompt_hits_all_but_the_block_holding_its_last_token() {
        let mut cache = PrefixCache::new(100, 4);
        let t = tokens(16, 0);
        let h = block_hashes(&t, 4, None);
        assert_eq!(cache.cached_tokens(&h, 16), 0);
        cache.insert(&h);
        assert_eq!(cache.len(), 4);
        // 16 tokens, 4 blocks cached: at most 15 may be cached, in blocks → 12.
        assert_eq!(cache.cached_tokens(&h, 16), 12);
        // A longer prompt with the same head gets all 16.
        let mut longer = t.clone();
        longer.extend(tokens(5, 100));
        let hl = block_hashes(&longer, 4, None);
        assert_eq!(cache.cached_tokens(&hl, longer.len()), 16);
        // A prompt that diverges in block 2 gets blocks 0 and 1.
        let mut diverged = t.clone();
        diverged[9] = 999;
        diverged.push(1);
        let hd = block_hashes(&diverged, 4, None);
        assert_eq!(cache.cached_tokens(&hd, diverged.len()), 8);
    }

    #[test]
    fn eviction_is_least_recently_used_and_takes_tails_first() {
        let mut cache = PrefixCache::new(4, 1);
        let a = block_hashes(&[1, 2, 3], 1, None);
        cache.insert(&a);
        let b = block_hashes(&[7, 8], 1, None);
        cache.insert(&b); // 5 blocks into 4: a's tail (block 2) goes first.
        assert_eq!(cache.len(), 4);
        assert_eq!(cache.leading_hits(&a), 2);
        assert_eq!(cache.leading_hits(&b), 2);
        // Touch a again: a's head is now newest, so inserting c evicts b's tail, then b's head.
        cache.insert(&a[..2]);
        let c = block_hashes(&[5, 6], 1, None);
        cache.insert(&c);
        assert_eq!(cache.leading_hits(&a), 2);
        assert_eq!(cache.leading_hits(&b), 0);
        assert_eq!(cache.leading_hits(&c), 2);
    }

    #[test]
    fn a_missing_head_block_hides_the_rest_of_the_chain() {
        let mut cache = PrefixCache::new(10, 1);
        let a = block_hashes(&[1, 2, 3], 1, None);
        cache.insert(&a[1..]);
        assert_eq!(cache.leading_hits(&a), 0);
    }

    fn holds(cache: &PrefixCache, hash: u64) -> bool {
        cache.leading_hits(&[hash]) == 1
    }

    #[test]
    fn insert_reports_the_newly_held_run_after_the_held_prefix() {
        let mut cache = PrefixCache::new(10, 1);
        let a = block_hashes(&[1, 2, 3], 1, None);
        let change = cache.insert(&a);
        assert_eq!(change.stored, vec![0..3]);
        assert!(change.evicted.is_empty());
        let longer = block_hashes(&[1, 2, 3, 4, 5], 1, None);
        let change = cache.insert(&longer);
        assert_eq!(
            change.stored,
            vec![3..5],
            "blocks 0–2 were held: only 3 and 4 are new"
        );
        assert!(change.evicted.is_empty());
        assert!(cache.insert(&a).is_empty(), "a repeat only touches");
    }

    #[test]
    fn insert_reports_evictions_in_eviction_order() {
        let mut cache = PrefixCache::new(4, 1);
        let a = block_hashes(&[1, 2, 3], 1, None);
        cache.insert(&a);
        let b = block_hashes(&[7, 8, 9], 1, None);
        // b's tail goes in first and evicts a's tail, then b's middle evicts a's middle.
        let change = cache.insert(&b);
        assert_eq!(change.stored, vec![0..3]);
        assert_eq!(change.evicted, vec![a[2], a[1]]);
        assert!(holds(&cache, a[0]) && !holds(&cache, a[1]));
    }

    #[test]
    fn a_block_evicted_and_inserted_again_in_one_insert_is_unchanged() {
        let mut cache = PrefixCache::new(3, 1);
        let c = block_hashes(&[1, 2, 3], 1, None);
        cache.insert(&c[..1]);
        let y = block_hashes(&[7], 1, None)[0];
        let z = block_hashes(&[8], 1, None)[0];
        cache.insert(&[y]);
        cache.insert(&[z]);
        // c[2] evicts c[0] (the oldest), c[1] evicts y, c[0] comes back and evicts z.
        let change = cache.insert(&c);
        assert_eq!(change.stored, vec![1..3]);
        assert_eq!(change.evicted, vec![y, z]);
        assert!(c.iter().all(|h| holds(&cache, *h)));
    }

    #[test]
    fn a_prompt_longer_than_the_cache_keeps_its_head_and_reports_the_net_change() {
        let mut cache = PrefixCache::new(3, 1);
        let x = block_hashes(&[9], 1, None)[0];
        cache.insert(&[x]);
        let long = block_hashes(&[1, 2, 3, 4, 5], 1, None);
        let change = cache.insert(&long);
        assert_eq!(
            change.stored,
            vec![0..3],
            "the head fits, the tail came and went"
        );
        assert_eq!(
            change.evicted,
            vec![x],
            "blocks stored and evicted in the call are not reported"
        );
        assert_eq!(cache.len(), 3);
    }

    #[test]
    fn changes_replayed_on_a_set_track_the_cache_and_runs_have_held_parents() {
        // Prompts from a few shared heads with random tails, on a small cache: the set of
        // blocks built from the reported changes alone must equal what the cache holds.
        let mut cache = PrefixCache::new(24, 2);
        let mut model: HashSet<u64> = HashSet::new();
        let mut seen: HashSet<u64> = HashSet::new();
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..1000 {
            let head = (next() % 4) as u32;
            let len = 2 + (next() % 40) as usize;
            let tokens: Vec<u32> = (0..len)
                .map(|i| {
                    if i < 8 {
                        head * 100 + i as u32
                    } else {
                        (next() % 3) as u32
                    }
                })
                .collect();
            let hashes = block_hashes(&tokens, 2, None);
            let change = cache.insert(&hashes);
            for h in &change.evicted {
                assert!(model.remove(h), "an evicted block was not held");
            }
            for run in &change.stored {
                if run.start > 0 {
                    assert!(
                        holds(&cache, hashes[run.start - 1]),
                        "a run's parent is held"
                    );
                }
                for h in &hashes[run.clone()] {
                    assert!(model.insert(*h), "a stored block was already held");
                }
            }
            seen.extend(&hashes);
            if round % 50 == 0 {
                for h in &seen {
                    assert_eq!(model.contains(h), holds(&cache, *h));
                }
            }
        }
        assert_eq!(model.len(), cache.len());
    }

    #[test]
    fn clear_drops_everything_and_says_how_much() {
        let mut cache = PrefixCache::new(10, 1);
        cache.insert(&block_hashes(&[1, 2, 3], 1, None));
        assert_eq!(cache.clear(), 3);
        assert!(cache.is_empty());
        assert_eq!(PrefixCache::new(0, 1).clear(), 0);
    }

    #[test]
    fn capacity_zero_caches_nothing() {
        let mut cache = PrefixCache::new(0, 16);
        let h = block_hashes(&tokens(64, 0), 16, None);
        cache.insert(&h);
        assert!(cache.is_empty());
        assert_eq!(cache.cached_tokens(&h, 64), 0);
        assert_eq!(cache.capacity(), 0);
    }
}
