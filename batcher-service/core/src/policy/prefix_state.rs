//! A bounded, approximate picture of one replica's KV cache, in prefix blocks.
//!
//! Why approximate: in assign mode the batcher never sees the engine's cache. It sees what
//! it sent where, and the engine caches (roughly) what it was sent, so "the blocks of the
//! requests this replica served recently" is a good proxy for "the blocks in its KV cache".
//!
//! What is kept: a set of chained block hashes with least-recently-used eviction and a hard
//! cap (`capacity` blocks). Block hashes are chained (each names its whole prefix), so the
//! longest cached prefix of a request is the longest run of its leading hashes present here:
//! no tree is needed and no tree can grow. The cap is enforced on every insert, not by a
//! periodic sweep, which is the fix for SGLang's radix tree growing without bound between
//! eviction ticks.
//!
//! Each block also counts the requests that brought it here (`uses`): the last block of
//! a request's match tells whether that prefix is shared (an application's system prompt,
//! sent by many requests) or private (a conversation's history, sent by its previous turn
//! alone). The policy holds a private prefix harder (`live_slack_private`).
//!
//! Order of touches: a request's blocks are touched from the last to the first, so a
//! prefix is always at least as recent as any of its extensions and eviction takes the
//! leaves (the tail of an old conversation) before the trunk (the shared system prompt),
//! as engines do (vLLM frees a sequence's blocks tail first).

use std::num::NonZeroUsize;

use lru::LruCache;

/// One replica's approximate prefix-block state: a capped LRU set of block hashes.
#[derive(Debug)]
pub struct PrefixState {
    /// Block hash → requests recorded with it.
    blocks: LruCache<u64, u32>,
    evictions: u64,
}

impl PrefixState {
    /// An empty state holding at most `capacity` blocks (at least one).
    pub fn new(capacity: usize) -> Self {
        let cap = NonZeroUsize::new(capacity.max(1)).unwrap_or(NonZeroUsize::MIN);
        Self {
            blocks: LruCache::new(cap),
            evictions: 0,
        }
    }

    /// Number of leading blocks of `blocks` held here (longest cached prefix).
    pub fn matched(&self, blocks: &[u64]) -> usize {
        blocks
            .iter()
            .take_while(|b| self.blocks.contains(*b))
            .count()
    }

    /// Number of leading blocks of `blocks` held here, and how many recorded requests
    /// carried the last of them (0 when none is held).
    pub fn matched_uses(&self, blocks: &[u64]) -> (usize, u32) {
        let mut uses = 0;
        let mut n = 0;
        for b in blocks {
            match self.blocks.peek(b) {
                Some(&u) => {
                    uses = u;
                    n += 1;
                }
                None => break,
            }
        }
        (n, uses)
    }

    /// Whether one block hash is held (no recency change).
    pub fn contains(&self, block: u64) -> bool {
        self.blocks.contains(&block)
    }

    /// Records that this replica now holds `blocks` (touched last to first); returns the
    /// number of blocks evicted to make room.
    pub fn record(&mut self, blocks: &[u64]) -> u64 {
        let mut evicted = 0;
        for &b in blocks.iter().rev() {
            if let Some(uses) = self.blocks.get_mut(&b) {
                *uses = uses.saturating_add(1);
            } else if self.blocks.push(b, 1).is_some() {
                evicted += 1;
            }
        }
        self.evictions += evicted;
        evicted
    }

    /// Blocks held now (never above the capacity).
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether no block is held.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// The cap in blocks.
    pub fn capacity(&self) -> usize {
        self.blocks.cap().get()
    }

    /// Blocks evicted since creation.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }
}

#[cfg(test)]
mod tests {
    use super::PrefixState;

    #[test]
    fn longest_prefix_and_bound() {
        let mut s = PrefixState::new(4);
        assert_eq!(s.matched(&[1, 2, 3]), 0);
        s.record(&[1, 2, 3]);
        assert_eq!(s.matched(&[1, 2, 9]), 2);
        assert_eq!(s.matched(&[9, 2, 3]), 0);
        // Two more blocks: the oldest leaf (3) goes, the trunk stays.
        assert_eq!(s.record(&[1, 7, 8]), 1);
        assert_eq!(s.len(), 4);
        assert!(s.contains(1) && !s.contains(3));
        assert_eq!(s.evictions(), 1);
        // Block 1 came with both requests, 2 with the first only.
        assert_eq!(s.matched_uses(&[1, 2, 9]), (2, 1));
        assert_eq!(s.matched_uses(&[1, 9]), (1, 2));
        assert_eq!(s.matched_uses(&[9]), (0, 0));
        let z = PrefixState::new(0);
        assert_eq!(z.capacity(), 1);
    }
}
