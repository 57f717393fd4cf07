//! Which batcher shard owns a request: jump consistent hashing (Lamping & Veach, 2014) of
//! its [`shard_key`].
//!
//! Batchers share no state; each owns the keys that hash to it. The filter picks the shard
//! for `Assign` and `Observe` as `jump_hash(shard_key(blocks, SHARD_KEY_DEPTH), shards)`
//! over the configured shard clusters, and the trace replay uses the same functions, so
//! what is measured is what runs. Going from `n` to `n + 1` shards moves only
//! `1 / (n + 1)` of the keys, all of them to the new shard.

/// The shard in `0..shards` that owns `key`; `0` when `shards` is 0 or 1.
pub fn jump_hash(key: u64, shards: u32) -> u32 {
    if shards <= 1 {
        return 0;
    }
    let mut key = key;
    let mut bucket: i64 = -1;
    let mut next: i64 = 0;
    while next < i64::from(shards) {
        bucket = next;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        next = ((bucket + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    bucket as u32
}

/// Depth, in the filter's 256-byte blocks (≈ 64 tokens each), of the batcher shard key.
///
/// With several batcher shards, each request goes to the shard
/// `jump_hash(shard_key(blocks, D), shards)`. The key must be the same for every turn of a
/// conversation (so one shard sees all of it and its prefix view of that conversation is
/// complete) and must differ between conversations (so shards share the load). The
/// chained hash at depth `min(len, D)` names the first `D` blocks: everything that shares
/// them shares a shard. `D` has to reach past the shared trunk (system prompt, tools) into
/// the conversation's own first turn, and not past its first request's full blocks.
/// The replay measures it on Mooncake at 2 of its 512-token blocks (block 0 is the trunk
/// every request shares, block 1 starts the conversation), 1,024 tokens ≈ 4 KiB ≈ 16 of
/// the filter's blocks; hence 16. A first request shorter than `D` blocks keys on its own
/// last block and its next turn may change shard: one extra miss, on a short prompt.
/// A trunk longer than `D` blocks sends all its traffic to one shard: the hit ratio is
/// unharmed (that shard sees it all) but the shard load is not spread; raise `D` then.
pub const SHARD_KEY_DEPTH: usize = 16;

/// The batcher shard key of a request: its chained block hash at depth `min(len, depth)`
/// (0 for an empty request; `depth` 0 is treated as 1).
pub fn shard_key(blocks: &[u64], depth: usize) -> u64 {
    let d = depth.max(1).min(blocks.len());
    match d.checked_sub(1).and_then(|i| blocks.get(i)) {
        Some(&h) => h,
        None => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::jump_hash;

    #[test]
    fn stays_in_range_and_is_stable() {
        for shards in 1..20 {
            for key in 0..2000u64 {
                let k = key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let s = jump_hash(k, shards);
                assert!(s < shards);
                assert_eq!(s, jump_hash(k, shards));
            }
        }
        assert_eq!(jump_hash(42, 0), 0);
    }

    #[test]
    fn adding_a_shard_moves_only_its_share_to_it() {
        let keys: Vec<u64> = (0..20_000u64)
            .map(|k| k.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        for n in 1..8u32 {
            let mut moved = 0;
            for &k in &keys {
                let (before, after) = (jump_hash(k, n), jump_hash(k, n + 1));
                if before != after {
                    assert_eq!(after, n, "a moved key goes to the new shard");
                    moved += 1;
                }
            }
            let share = moved as f64 / keys.len() as f64;
            let expected = 1.0 / f64::from(n + 1);
            assert!(
                (share - expected).abs() < 0.02,
                "n={n} moved {share} expected {expected}"
            );
        }
    }

    #[test]
    fn spreads_evenly() {
        let mut counts = [0u32; 4];
        for k in 0..40_000u64 {
            counts[jump_hash(k.wrapping_mul(0x9E37_79B9_7F4A_7C15), 4) as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
    }
}
