//! The device layout and launch plan shared by the CUDA backend and its CPU emulation:
//! one place for the constants that `kernels/store.cu` also defines.
//!
//! An entry takes 48 device bytes by construction: its 32-byte sketch (in tiles of 16
//! entries, in the register order of the `mma.m16n8k32` A operand), its key (8), tenant (4)
//! and expiry (4). Cohort and replica stay in the host mirror, which the device never needs.

use cohort_batcher_core::store::SketchBytes;

/// Entries a tile (the M of one `mma.m16n8k32`).
pub const ROWS: usize = 16;
/// `u32` words of one sketch.
pub const WORDS: usize = 8;
/// Queries one warp holds (four N-tiles of 8).
pub const WARP_Q: usize = 32;
/// Warps of a `topk_scan` block.
pub const WARPS: usize = 4;
/// The largest k the device answers; larger k are answered from the host mirror.
pub const KMAX: usize = 16;
/// Marks an empty list place.
pub const NO_SLOT: u32 = u32::MAX;
/// Device bytes one entry takes (sketch, key, tenant, expiry).
pub const DEVICE_BYTES_PER_ENTRY: usize = 32 + 8 + 4 + 4;
/// Queries sent to the device in one launch (bounds the scratch buffers).
pub const MAX_LAUNCH_QUERIES: usize = 8192;

/// Index (in `u32` words) inside a tile of word `word` of entry `row`: lane
/// `(row % 8) * 4 + word % 4` holds it in register `row / 8 + 2 * (word / 4)`.
#[inline]
pub fn frag_word(row: usize, word: usize) -> usize {
    let lane = (row & 7) * 4 + (word & 3);
    let reg = (row >> 3) + 2 * (word >> 2);
    lane * 4 + reg
}

/// The sketch as 8 words, dims `4w..4w+3` little-endian in word `w`.
pub fn pack_words(sketch: &SketchBytes) -> [u32; WORDS] {
    std::array::from_fn(|w| {
        u32::from_le_bytes([
            sketch[4 * w] as u8,
            sketch[4 * w + 1] as u8,
            sketch[4 * w + 2] as u8,
            sketch[4 * w + 3] as u8,
        ])
    })
}

/// Slots a device allocates for `slots` entries (whole tiles).
pub fn padded_slots(slots: usize) -> usize {
    slots.div_ceil(ROWS).max(1) * ROWS
}

/// The grid of one `topk_scan` launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanPlan {
    /// Parts the tiles are split into (grid x).
    pub parts: usize,
    /// Tiles a part scans.
    pub part_tiles: usize,
    /// Query groups of `WARP_Q * WARPS` (grid y).
    pub query_blocks: usize,
}

/// Enough blocks to give every multiprocessor about 16 (small batches are latency bound:
/// a warp walks its part tile after tile, so more, shorter parts answer sooner), parts of at
/// least 64 tiles (1,024 entries) so that a part's list set-up and output stay small.
pub fn plan_scan(n_tiles: usize, queries: usize, sms: usize) -> ScanPlan {
    let query_blocks = queries.div_ceil(WARP_Q * WARPS).max(1);
    let want_parts = (16 * sms.max(1)).div_ceil(query_blocks).max(1);
    let max_parts = n_tiles.div_ceil(64).max(1);
    let parts = want_parts.min(max_parts);
    let part_tiles = n_tiles.div_ceil(parts).max(1);
    let parts = n_tiles.div_ceil(part_tiles).max(1);
    ScanPlan {
        parts,
        part_tiles,
        query_blocks,
    }
}

/// The query words of a launch, padded with zero queries to a multiple of `WARP_Q`.
pub fn pack_queries(queries: &[SketchBytes]) -> Vec<u32> {
    let padded = queries.len().div_ceil(WARP_Q) * WARP_Q;
    let mut words = vec![0u32; padded * WORDS];
    for (q, sketch) in queries.iter().enumerate() {
        words[q * WORDS..(q + 1) * WORDS].copy_from_slice(&pack_words(sketch));
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragment_order_is_a_permutation_of_a_tile() {
        let mut seen = [false; ROWS * WORDS];
        for row in 0..ROWS {
            for word in 0..WORDS {
                let i = frag_word(row, word);
                assert!(!seen[i]);
                seen[i] = true;
            }
        }
    }

    #[test]
    fn plans_cover_every_tile() {
        for (tiles, queries, sms) in [
            (1, 1, 132),
            (312_500, 1, 132),
            (62_500, 4096, 132),
            (7, 64, 1),
        ] {
            let p = plan_scan(tiles, queries, sms);
            assert!(p.parts * p.part_tiles >= tiles);
            assert!((p.parts - 1) * p.part_tiles < tiles);
            assert!(p.query_blocks * WARP_Q * WARPS >= queries);
        }
    }
}
