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
//! Each block also has an expiry: the request's `cache-ttl` knob (300–3600 s,
//! docs/CONTRACT.md: how long a cohort's prefix is considered resident on its replica) after the last
//! request that brought it. An expired block no longer counts as held, even while the LRU
//! still has room for it: an engine's cache turns over in that time, and a prefix nobody
//! sent for longer than its TTL should not keep attracting requests. A later request
//! refreshes it (the later of the two expiries).
//!
//! Order of touches: a request's blocks are touched from the last to the first, so a
//! prefix is always at least as recent as any of its extensions and eviction takes the
//! leaves (the tail of an old conversation) before the trunk (the shared system prompt),
//! as engines do (vLLM frees a sequence's blocks tail first).

use std::num::NonZeroUsize;

use lru::LruCache;

/// What is known of one held block.
#[derive(Debug, Clone, Copy)]
struct Held {
    /// Requests recorded with it.
    uses: u32,
    /// It counts as held while `now_ms < expires_ms`.
    expires_ms: u64,
    /// When a request last brought it (what [`PrefixState::matched_since`] reads).
    recorded_ms: u64,
}

/// One replica's approximate prefix-block state: a capped LRU set of block hashes.
#[derive(Debug)]
pub struct PrefixState {
    blocks: LruCache<u64, Held>,
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

    /// Number of leading blocks of `blocks` held here at `now_ms` (longest cached prefix).
    pub fn matched(&self, blocks: &[u64], now_ms: u64) -> usize {
        self.matched_uses(blocks, now_ms).0
    }

    /// Number of leading blocks of `blocks` held here at `now_ms`, and how many recorded
    /// requests carried the last of them (0 when none is held).
    pub fn matched_uses(&self, blocks: &[u64], now_ms: u64) -> (usize, u32) {
        let mut uses = 0;
        let mut n = 0;
        for b in blocks {
            match self.blocks.peek(b) {
                Some(held) if now_ms < held.expires_ms => {
                    uses = held.uses;
                    n += 1;
                }
                _ => break,
            }
        }
        (n, uses)
    }

    /// Number of leading blocks of `blocks` that a request brought here at or after
    /// `since_ms` (and still held at `now_ms`): what was just sent, which an engine that
    /// publishes its cache may not have stored yet.
    pub fn matched_since(&self, blocks: &[u64], since_ms: u64, now_ms: u64) -> usize {
        blocks
            .iter()
            .take_while(|b| {
                self.blocks
                    .peek(b)
                    .is_some_and(|held| now_ms < held.expires_ms && held.recorded_ms >= since_ms)
            })
            .count()
    }

    /// Forgets every block: the engine's cache was cleared (its KV events said so).
    pub fn clear(&mut self) {
        self.blocks.clear();
    }

    /// Whether one block hash is held at `now_ms` (no recency change).
    pub fn contains(&self, block: u64, now_ms: u64) -> bool {
        self.blocks
            .peek(&block)
            .is_some_and(|held| now_ms < held.expires_ms)
    }

    /// Records that this replica now holds `blocks` (touched last to first) until
    /// `expires_ms` at least; returns the number of blocks evicted to make room. A block
    /// recorded again after it expired starts counting its uses afresh.
    pub fn record(&mut self, blocks: &[u64], now_ms: u64, expires_ms: u64) -> u64 {
        let mut evicted = 0;
        for &b in blocks.iter().rev() {
            if let Some(held) = self.blocks.get_mut(&b) {
                if now_ms < held.expires_ms {
                    held.uses = held.uses.saturating_add(1);
                } else {
                    held.uses = 1;
                }
                held.expires_ms = held.expires_ms.max(expires_ms);
                held.recorded_ms = held.recorded_ms.max(now_ms);
            } else if self
                .blocks
                .push(
                    b,
                    Held {
                        uses: 1,
                        expires_ms,
                        recorded_ms: now_ms,
                    },
                )
                .is_some()
            {
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

    /// Blocks that count as held at `now_ms` (their TTL has not run out): the blocks the
    /// replica is believed to hold now. Walks every block, so it costs what the state
    /// holds (for the inspector, not for decisions).
    pub fn resident(&self, now_ms: u64) -> usize {
        self.blocks
            .iter()
            .filter(|(_, held)| now_ms < held.expires_ms)
            .count()
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

    const NEVER: u64 = u64::MAX;

    #[test]
    fn longest_prefix_and_bound() {
        let mut s = PrefixState::new(4);
        assert_eq!(s.matched(&[1, 2, 3], 0), 0);
        s.record(&[1, 2, 3], 0, NEVER);
        assert_eq!(s.matched(&[1, 2, 9], 0), 2);
        assert_eq!(s.matched(&[9, 2, 3], 0), 0);
        // Two more blocks: the oldest leaf (3) goes, the trunk stays.
        assert_eq!(s.record(&[1, 7, 8], 0, NEVER), 1);
        assert_eq!(s.len(), 4);
        assert!(s.contains(1, 0) && !s.contains(3, 0));
        assert_eq!(s.evictions(), 1);
        // Block 1 came with both requests, 2 with the first only.
        assert_eq!(s.matched_uses(&[1, 2, 9], 0), (2, 1));
        assert_eq!(s.matched_uses(&[1, 9], 0), (1, 2));
        assert_eq!(s.matched_uses(&[9], 0), (0, 0));
        let z = PrefixState::new(0);
        assert_eq!(z.capacity(), 1);
    }

    #[test]
    fn blocks_stop_counting_when_their_ttl_runs_out_and_a_later_request_refreshes_them() {
        let mut s = PrefixState::new(16);
        // A system prompt (1, 2) sent at 0 with a 300 s TTL, then a longer one at 100 s.
        s.record(&[1, 2], 0, 300_000);
        s.record(&[1, 2, 3], 100_000, 400_000);
        assert_eq!(s.matched_uses(&[1, 2, 3], 299_999), (3, 1));
        // At 300 s every block is still held: 1 and 2 were refreshed to 400 s.
        assert_eq!(s.matched(&[1, 2, 3], 300_000), 3);
        // At 400 s none is, though the LRU has room for all of them.
        assert_eq!(s.matched(&[1, 2, 3], 400_000), 0);
        assert!(!s.contains(1, 400_000));
        assert_eq!(s.len(), 3);
        assert_eq!(s.resident(399_999), 3);
        assert_eq!(s.resident(400_000), 0);
        // Sent again: held again, its count of uses starts over.
        s.record(&[1], 500_000, 800_000);
        assert_eq!(s.matched_uses(&[1, 2], 500_000), (1, 1));
        assert_eq!(s.resident(500_000), 1);
    }

    #[test]
    fn matched_since_counts_the_leading_blocks_sent_recently() {
        let mut s = PrefixState::new(16);
        s.record(&[1, 2], 1_000, NEVER);
        s.record(&[1, 2, 3], 5_000, NEVER);
        s.record(&[4], 6_000, NEVER);
        // Blocks 1 and 2 were refreshed at 5 s, 3 came then.
        assert_eq!(s.matched_since(&[1, 2, 3], 5_000, 6_000), 3);
        assert_eq!(s.matched_since(&[1, 2, 3], 5_001, 6_000), 0);
        assert_eq!(s.matched_since(&[4, 1], 6_000, 6_000), 1);
        s.clear();
        assert_eq!(s.matched(&[1, 2, 3], 6_000), 0);
        assert!(s.is_empty());
    }
}
