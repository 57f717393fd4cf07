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
//!   loses its tail before its head, and a shared head survives longest.
//!
//! The same code serves the replicas and `bound` (one pooled cache).

use lru::LruCache;
use std::num::NonZeroUsize;
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

    /// Inserts or touches every block, tail first (the head ends most recent).
    pub fn insert(&mut self, hashes: &[u64]) {
        if let Some(blocks) = &mut self.blocks {
            for hash in hashes.iter().rev() {
                blocks.put(*hash, ());
            }
        }
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
