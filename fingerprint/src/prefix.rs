//! Prefix identity: chained block hashes of the canonical prompt, and the stable-prefix hash.
//!
//! The canonical prompt is cut into blocks of [`BLOCK_BYTES`]; block `i`'s hash is
//! `xxh3_64(block_i, seed = hash_{i-1})` with `hash_{-1}` the tenant salt. Chaining makes
//! each hash name the *whole* prefix up to and including its block, exactly like vLLM's
//! and SGLang's KV block hashes, so "longest common prefix" becomes "longest run of equal
//! hashes" — a cheap lookup in the batcher's per-replica prefix state.
//!
//! Block size: engines cache in tokens (vLLM 16-token blocks, SGLang pages of 1–64 tokens,
//! llama.cpp any token prefix, Mooncake traces 512-token blocks). English text with
//! BPE tokenisers averages ~4 bytes per token, so 256 bytes ≈ 64 tokens ≈ 4 vLLM blocks.
//! That is fine enough that a shared system prompt of a few hundred tokens yields several
//! shared blocks, and coarse enough that a 1 MiB body (the filter's default buffer limit)
//! gives at most 4,096 hashes (32 KiB) to ship to the batcher. The last, partial block is
//! hashed too: it makes the final hash the identity of the exact prompt.
//!
//! The stable-prefix hash covers model + system + tools (see [`crate::canonical`]), which
//! all requests of one application share whatever the conversation says.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Bytes of canonical prompt per prefix block (≈ 64 tokens).
pub const BLOCK_BYTES: usize = 256;

/// Domain separator so a stable-prefix hash never equals a block hash of the same bytes.
const STABLE_PREFIX_DOMAIN: u64 = 0x636f_686f_7274_5350; // "cohortSP"

/// Chained hashes of `BLOCK_BYTES` blocks of `canonical`, seeded by `salt`.
pub fn block_hashes(canonical: &[u8], salt: u64) -> Vec<u64> {
    let mut hashes = Vec::with_capacity(canonical.len().div_ceil(BLOCK_BYTES));
    let mut previous = salt;
    for block in canonical.chunks(BLOCK_BYTES) {
        previous = xxh3_64_with_seed(block, previous);
        hashes.push(previous);
    }
    hashes
}

/// Hash of the stable prefix (model + system + tools), seeded by `salt`.
pub fn stable_prefix_hash(stable_prefix: &[u8], salt: u64) -> u64 {
    xxh3_64_with_seed(stable_prefix, salt ^ STABLE_PREFIX_DOMAIN)
}

/// Number of leading blocks two hash chains share.
pub fn common_prefix_blocks(a: &[u64], b: &[u64]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_prefix_shares_leading_hashes() {
        let base = vec![7u8; BLOCK_BYTES * 3];
        let mut longer = base.clone();
        longer.extend_from_slice(b"and then some");
        let a = block_hashes(&base, 1);
        let b = block_hashes(&longer, 1);
        assert_eq!(a.len(), 3);
        assert_eq!(b.len(), 4);
        assert_eq!(common_prefix_blocks(&a, &b), 3);
    }

    #[test]
    fn a_change_early_changes_every_later_hash() {
        let mut a = vec![1u8; BLOCK_BYTES * 4];
        let b = a.clone();
        a[10] = 2;
        assert_eq!(
            common_prefix_blocks(&block_hashes(&a, 0), &block_hashes(&b, 0)),
            0
        );
    }

    #[test]
    fn salt_separates_tenants() {
        let bytes = b"same prompt".repeat(100);
        assert_ne!(block_hashes(&bytes, 1)[0], block_hashes(&bytes, 2)[0]);
        assert_ne!(stable_prefix_hash(&bytes, 1), stable_prefix_hash(&bytes, 2));
    }

    #[test]
    fn empty_input_has_no_blocks() {
        assert!(block_hashes(&[], 0).is_empty());
    }
}
