//! One replica's scheduler state, pure: its prefix cache, its prefill lane, how many
//! requests wait and run, and its counters. The HTTP layer calls it under a lock with the
//! current time (milliseconds since the replica started) and sleeps as it says; slots
//! themselves are a FIFO semaphore in that layer, this state only counts them.
//!
//! A request's life: [`Replica::enqueue`] → (slot granted) [`Replica::start`] →
//! [`Replica::admit`] (cache lookup, prefill scheduled on the lane) → [`Replica::prefill_done`]
//! (its blocks enter the cache) → [`Replica::token`] per decoded token → [`Replica::finish`].

use crate::cache::{CacheChange, PrefixCache};
use crate::cost::CostModel;
use serde::Serialize;

/// Bucket upper bounds (seconds) of `vllm:time_to_first_token_seconds`, vLLM's.
pub const TTFT_BUCKETS_S: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// Counters since start (what `/sim/stats` and `/metrics` report).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Stats {
    /// Completion requests admitted to a prefill.
    pub requests: u64,
    /// Requests that sent their last token.
    pub completed: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// Prompt tokens prefilled (prompt − cached).
    pub computed_tokens: u64,
    pub generation_tokens: u64,
    /// Wall time with at least one request running.
    pub busy_ms: f64,
    /// Time the prefill lane spent prefilling.
    pub prefill_ms: f64,
    pub max_running: usize,
    pub max_waiting: usize,
    pub render_calls: u64,
    pub tokenize_calls: u64,
    /// Requests answered 400.
    pub rejected: u64,
}

/// What admission decided for one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Admission {
    pub cached_tokens: usize,
    pub prefill_start_ms: f64,
    pub prefill_end_ms: f64,
}

pub struct Replica {
    cache: PrefixCache,
    cost: CostModel,
    lane_free_ms: f64,
    running: usize,
    waiting: usize,
    busy_since_ms: Option<f64>,
    stats: Stats,
    ttft_counts: [u64; TTFT_BUCKETS_S.len()],
    ttft_sum_s: f64,
    ttft_count: u64,
}

impl Replica {
    /// `cost` already scaled by the time scale.
    pub fn new(kv_blocks: usize, block_tokens: usize, cost: CostModel) -> Replica {
        Replica {
            cache: PrefixCache::new(kv_blocks, block_tokens),
            cost,
            lane_free_ms: 0.0,
            running: 0,
            waiting: 0,
            busy_since_ms: None,
            stats: Stats::default(),
            ttft_counts: [0; TTFT_BUCKETS_S.len()],
            ttft_sum_s: 0.0,
            ttft_count: 0,
        }
    }

    pub fn cache(&self) -> &PrefixCache {
        &self.cache
    }

    pub fn running(&self) -> usize {
        self.running
    }

    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// A request waits for a slot.
    pub fn enqueue(&mut self) {
        self.waiting += 1;
        self.stats.max_waiting = self.stats.max_waiting.max(self.waiting);
    }

    /// A waiting request left before getting a slot (its client went away).
    pub fn abandon(&mut self) {
        self.waiting = self.waiting.saturating_sub(1);
    }

    /// A waiting request got a slot.
    pub fn start(&mut self, now_ms: f64) {
        self.waiting = self.waiting.saturating_sub(1);
        if self.running == 0 {
            self.busy_since_ms = Some(now_ms);
        }
        self.running += 1;
        self.stats.max_running = self.stats.max_running.max(self.running);
    }

    /// Looks the prompt up in the cache and schedules its prefill on the lane.
    pub fn admit(&mut self, hashes: &[u64], prompt_tokens: usize, now_ms: f64) -> Admission {
        let cached = self.cache.cached_tokens(hashes, prompt_tokens);
        let uncached = prompt_tokens - cached;
        let prefill = self.cost.prefill_ms(uncached, cached);
        let start = now_ms.max(self.lane_free_ms);
        let end = start + prefill;
        self.lane_free_ms = end;
        self.stats.requests += 1;
        self.stats.prompt_tokens += prompt_tokens as u64;
        self.stats.cached_tokens += cached as u64;
        self.stats.computed_tokens += uncached as u64;
        self.stats.prefill_ms += prefill;
        Admission {
            cached_tokens: cached,
            prefill_start_ms: start,
            prefill_end_ms: end,
        }
    }

    /// The prefill finished: its blocks enter the cache; `ttft_ms` is from receipt. Returns
    /// what the cache stored and evicted.
    pub fn prefill_done(&mut self, hashes: &[u64], ttft_ms: f64) -> CacheChange {
        let change = self.cache.insert(hashes);
        let ttft_s = ttft_ms / 1000.0;
        for (count, bound) in self.ttft_counts.iter_mut().zip(TTFT_BUCKETS_S) {
            if ttft_s <= bound {
                *count += 1;
            }
        }
        self.ttft_sum_s += ttft_s;
        self.ttft_count += 1;
        change
    }

    /// Drops the whole prefix cache (vLLM's `reset_prefix_cache`); returns the blocks held.
    pub fn reset_cache(&mut self) -> usize {
        self.cache.clear()
    }

    /// How long the next decode step takes now.
    pub fn decode_token_ms(&self) -> f64 {
        self.cost.decode_token_ms(self.running)
    }

    /// One output token was produced.
    pub fn token(&mut self) {
        self.stats.generation_tokens += 1;
    }

    /// A running request released its slot (`completed`: it sent its last token).
    pub fn finish(&mut self, now_ms: f64, completed: bool) {
        self.running = self.running.saturating_sub(1);
        if completed {
            self.stats.completed += 1;
        }
        if self.running == 0 {
            if let Some(since) = self.busy_since_ms.take() {
                self.stats.busy_ms += (now_ms - since).max(0.0);
            }
        }
    }

    pub fn count_render(&mut self) {
        self.stats.render_calls += 1;
    }

    pub fn count_tokenize(&mut self) {
        self.stats.tokenize_calls += 1;
    }

    pub fn count_rejected(&mut self) {
        self.stats.rejected += 1;
    }

    /// The counters as of `now_ms` (busy time includes a busy period still open).
    pub fn stats(&self, now_ms: f64) -> Stats {
        let mut stats = self.stats.clone();
        if let Some(since) = self.busy_since_ms {
            stats.busy_ms += (now_ms - since).max(0.0);
        }
        stats
    }

    /// TTFT histogram: cumulative bucket counts, sum (s), count.
    pub fn ttft_histogram(&self) -> (&[u64], f64, u64) {
        (&self.ttft_counts, self.ttft_sum_s, self.ttft_count)
    }

    /// Fraction of the KV cache in use (0–1).
    pub fn kv_usage(&self) -> f64 {
        match self.cache.capacity() {
            0 => 0.0,
            cap => self.cache.len() as f64 / cap as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::block_hashes;

    const COST: CostModel = CostModel {
        prefill_base_ms: 5.0,
        prefill_ms_per_token: 1.0,
        prefill_attention_ms: 0.0,
        decode_ms_per_token: 2.0,
        decode_batch_slowdown: 0.5,
    };

    #[test]
    fn prefills_queue_on_one_lane_and_a_repeat_is_cheaper() {
        let mut r = Replica::new(100, 4, COST);
        let tokens: Vec<u32> = (0..40).collect();
        let h = block_hashes(&tokens, 4, None);
        r.enqueue();
        r.enqueue();
        assert_eq!(r.waiting(), 2);
        r.start(0.0);
        r.start(0.0);
        assert_eq!(r.running(), 2);
        let a = r.admit(&h, 40, 0.0);
        assert_eq!(a.cached_tokens, 0);
        assert_eq!((a.prefill_start_ms, a.prefill_end_ms), (0.0, 45.0));
        // The second waits for the lane; it is admitted before the first's prefill ended,
        // so it finds nothing cached.
        let b = r.admit(&h, 40, 1.0);
        assert_eq!(
            (b.cached_tokens, b.prefill_start_ms, b.prefill_end_ms),
            (0, 45.0, 90.0)
        );
        let change = r.prefill_done(&h, 45.0);
        assert_eq!(change.stored, vec![0..10], "all 10 blocks are new");
        assert!(change.evicted.is_empty());
        assert_eq!(r.decode_token_ms(), 3.0, "two running: 2 ms × (1 + 0.5)");
        r.finish(100.0, true);
        r.finish(120.0, true);
        // A later repeat: 36 of 40 tokens cached (the last block is recomputed).
        r.enqueue();
        r.start(200.0);
        let c = r.admit(&h, 40, 200.0);
        assert_eq!(c.cached_tokens, 36);
        assert_eq!(c.prefill_end_ms, 200.0 + 5.0 + 4.0);
        r.token();
        r.finish(210.0, false);
        let s = r.stats(300.0);
        assert_eq!(s.requests, 3);
        assert_eq!(s.completed, 2);
        assert_eq!(s.prompt_tokens, 120);
        assert_eq!(s.cached_tokens, 36);
        assert_eq!(s.computed_tokens, 84);
        assert_eq!(s.generation_tokens, 1);
        assert_eq!(s.max_running, 2);
        assert_eq!(s.max_waiting, 2);
        assert_eq!(s.busy_ms, 120.0 + 10.0);
        assert!(r.kv_usage() > 0.0 && r.kv_usage() <= 1.0);
    }

    #[test]
    fn ttft_histogram_is_cumulative() {
        let mut r = Replica::new(0, 16, COST);
        r.prefill_done(&[], 30.0);
        r.prefill_done(&[], 3000.0);
        let (counts, sum, n) = r.ttft_histogram();
        assert_eq!(n, 2);
        assert!((sum - 3.03).abs() < 1e-9);
        assert_eq!(counts[3], 0, "≤ 20 ms");
        assert_eq!(counts[4], 1, "≤ 40 ms");
        assert_eq!(counts[13], 2, "≤ 5 s");
    }

    #[test]
    fn a_cache_reset_drops_every_block() {
        let mut r = Replica::new(100, 4, COST);
        let h = block_hashes(&(0..40).collect::<Vec<u32>>(), 4, None);
        r.prefill_done(&h, 1.0);
        assert_eq!(r.reset_cache(), 10);
        assert_eq!(r.kv_usage(), 0.0);
        assert_eq!(r.admit(&h, 40, 2.0).cached_tokens, 0);
    }

    #[test]
    fn busy_time_counts_an_open_period() {
        let mut r = Replica::new(0, 16, COST);
        r.enqueue();
        r.start(10.0);
        assert_eq!(r.stats(25.0).busy_ms, 15.0);
        r.abandon();
        assert_eq!(r.waiting(), 0);
    }
}
