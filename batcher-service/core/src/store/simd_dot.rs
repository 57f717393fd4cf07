//! The scoring kernel of the CPU store: int8 dot products of a page of sketches against a
//! batch of queries.
//!
//! Layout: sketches are stored in *tiles* of 8 entries, dimension-pair-major:
//! `tile.0[p]` holds, for entries j = 0..8, dims `2p` and `2p + 1` as bytes `2j`, `2j + 1`.
//! One 16-byte row sign-extends (`vpmovsxbw`) into a register of 8 entries × 2 dims, and
//! `vpmaddwd` against the query's dims `2p, 2p + 1` broadcast gives 8 partial dot
//! products in 8 `i32` lanes: no horizontal sums, so each loaded row serves several
//! queries and each broadcast query pair serves several tiles (4 queries × 2 tiles of
//! accumulators in registers). Products of int8 and sums of 32 of them fit `i16`/`i32`
//! exactly, so the AVX2 path and the portable path give identical scores.
//!
//! Batches of 8 or more queries are scored in two halves: dims 0..16 first, then, by
//! Cauchy–Schwarz, the rest can add at most ‖q_hi‖·‖e_hi‖; a block of 4 queries × 16
//! entries none of whose live entries can reach its query's current k-th best score is
//! dropped without the second half. This is exact (only blocks that cannot contain a
//! candidate are skipped) and saves about a third of the work on clustered sketches.
//!
//! AVX2 is chosen at run time (`is_x86_feature_detected!`, cached by std); anything else
//! runs the portable loops, which the compiler vectorises with the baseline SIMD.

// The AVX2 path calls `std::arch` intrinsics behind a run-time feature check (each
// call commented).
#![allow(unsafe_code)]

/// Entries per tile.
pub(crate) const TILE: usize = 8;

/// Eight sketches, dimension-pair-major (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C, align(16))]
pub(crate) struct Tile(pub(crate) [[i8; 2 * TILE]; 16]);

impl Tile {
    pub(crate) fn set(&mut self, j: usize, sketch: &super::SketchBytes) {
        let j = j % TILE;
        for (p, row) in self.0.iter_mut().enumerate() {
            row[2 * j] = sketch[2 * p];
            row[2 * j + 1] = sketch[2 * p + 1];
        }
    }

    pub(crate) fn get(&self, j: usize) -> super::SketchBytes {
        let j = j % TILE;
        let mut out = [0i8; super::DIMS];
        for (p, row) in self.0.iter().enumerate() {
            out[2 * p] = row[2 * j];
            out[2 * p + 1] = row[2 * j + 1];
        }
        out
    }
}

/// Batches at least this large score the lower half of the dims first and prune (see
/// `avx2::tile_block_pruned`); smaller ones would pay more for the entry norms than they save.
pub(crate) const PRUNE_MIN_QUERIES: usize = 8;
/// Added to the Cauchy–Schwarz bound to cover f32 rounding (whose error is below 0.1).
pub(crate) const PRUNE_SLACK: f32 = 2.0;

/// A query as 16 words of two `i16` dims each (dim 2p low, 2p + 1 high).
pub(crate) type QueryPairs = [i32; 16];

pub(crate) fn pack_query(q: &super::SketchBytes) -> QueryPairs {
    let mut out = [0i32; 16];
    for (p, w) in out.iter_mut().enumerate() {
        let lo = i16::from(q[2 * p]) as u16 as u32;
        let hi = i16::from(q[2 * p + 1]) as u16 as u32;
        *w = (lo | (hi << 16)) as i32;
    }
    out
}

/// Bit j of `out[t]` set when entry `t * 8 + j` (< `n`) belongs to `tenant` and is live
/// at `now_s`. `tenants` and `expires` hold at least `out.len() * 8` entries.
pub(crate) fn live_masks(
    tenants: &[u32],
    expires: &[u32],
    n: usize,
    tenant: u32,
    now_s: u32,
    out: &mut [u8],
) {
    let tiles = out
        .len()
        .min(tenants.len() / TILE)
        .min(expires.len() / TILE);
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is available; `tiles` is bounded by every slice's length.
            unsafe {
                avx2::live_masks(
                    &tenants[..tiles * TILE],
                    &expires[..tiles * TILE],
                    tenant,
                    now_s,
                    &mut out[..tiles],
                )
            };
            clip(n, out);
            return;
        }
    }
    for (t, m) in out[..tiles].iter_mut().enumerate() {
        let mut bits = 0u8;
        for j in 0..TILE {
            let e = t * TILE + j;
            bits |= u8::from(tenants[e] == tenant && now_s < expires[e]) << j;
        }
        *m = bits;
    }
    clip(n, out);
}

/// Clear the bits of entries at or past `n`.
fn clip(n: usize, out: &mut [u8]) {
    for (t, m) in out.iter_mut().enumerate() {
        let start = t * TILE;
        if start >= n {
            *m = 0;
        } else if n - start < TILE {
            *m &= (1u8 << (n - start)) - 1;
        }
    }
}

/// Scores of every entry of `tiles` against every query: `scores[q * stride + e]` for
/// entry `e = tile * 8 + j`; candidate masks `cands[q * cand_stride + tile]`: the bits of
/// `live[tile]` whose score is ≥ `floors[q]`; and `tile_masks[q]`: bit `tile` set when
/// that tile has a candidate. Only candidates' scores are guaranteed to be written.
/// Returns false (and writes nothing) when a buffer is too small or there are more than
/// 64 tiles.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scores(
    tiles: &[Tile],
    queries: &[QueryPairs],
    floors: &[i32],
    live: &[u8],
    scores: &mut [i32],
    stride: usize,
    cands: &mut [u8],
    cand_stride: usize,
    tile_masks: &mut [u64],
) -> bool {
    let nt = tiles.len();
    let width = nt * TILE;
    if queries.is_empty() || tiles.is_empty() {
        return true;
    }
    let nq = queries.len();
    if stride < width
        || scores.len() < (nq - 1) * stride + width
        || cand_stride < nt
        || cands.len() < (nq - 1) * cand_stride + nt
        || floors.len() < nq
        || live.len() < nt
        || tile_masks.len() < nq
        || nt > 64
    {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is available (checked just above); the lengths were checked.
            unsafe {
                avx2::scores(
                    tiles,
                    queries,
                    floors,
                    live,
                    scores,
                    stride,
                    cands,
                    cand_stride,
                )
            };
            for (q, m) in tile_masks[..nq].iter_mut().enumerate() {
                // SAFETY: AVX2 is available; the row is within `cands` (checked above).
                *m = unsafe { avx2::nonzero_mask(&cands[q * cand_stride..q * cand_stride + nt]) };
            }
            return true;
        }
    }
    scores_portable(
        tiles,
        queries,
        floors,
        live,
        scores,
        stride,
        cands,
        cand_stride,
    );
    for (q, m) in tile_masks[..nq].iter_mut().enumerate() {
        *m = nonzero_mask(&cands[q * cand_stride..q * cand_stride + nt]);
    }
    true
}

/// Bit i set when `row[i]` is not zero (`row` holds at most 64 bytes).
fn nonzero_mask(row: &[u8]) -> u64 {
    row.iter()
        .take(64)
        .enumerate()
        .fold(0, |m, (i, &c)| m | u64::from(c != 0) << i)
}

/// The portable kernel (also the reference of the AVX2 one).
#[allow(clippy::too_many_arguments)]
pub(crate) fn scores_portable(
    tiles: &[Tile],
    queries: &[QueryPairs],
    floors: &[i32],
    live: &[u8],
    scores: &mut [i32],
    stride: usize,
    cands: &mut [u8],
    cand_stride: usize,
) {
    for (q, qp) in queries.iter().enumerate() {
        let row = &mut scores[q * stride..];
        for (t, tile) in tiles.iter().enumerate() {
            let mut acc = [0i32; TILE];
            for (p, bytes) in tile.0.iter().enumerate() {
                let qa = i32::from(qp[p] as i16);
                let qb = i32::from((qp[p] >> 16) as i16);
                for (j, a) in acc.iter_mut().enumerate() {
                    *a += i32::from(bytes[2 * j]) * qa + i32::from(bytes[2 * j + 1]) * qb;
                }
            }
            let mut bits = 0u8;
            for (j, &a) in acc.iter().enumerate() {
                bits |= u8::from(a >= floors[q]) << j;
            }
            cands[q * cand_stride + t] = bits & live[t];
            row[t * TILE..(t + 1) * TILE].copy_from_slice(&acc);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{QueryPairs, Tile, PRUNE_MIN_QUERIES, PRUNE_SLACK, TILE};
    use std::arch::x86_64::*;

    /// Output buffers of one scoring call.
    struct Out<'a> {
        floors: &'a [i32],
        live: &'a [u8],
        scores: &'a mut [i32],
        stride: usize,
        cands: &'a mut [u8],
        cand_stride: usize,
    }

    /// # Safety
    /// AVX2 must be available; the slices must have the lengths `super::scores` checks.
    #[target_feature(enable = "avx2")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn scores(
        tiles: &[Tile],
        queries: &[QueryPairs],
        floors: &[i32],
        live: &[u8],
        scores: &mut [i32],
        stride: usize,
        cands: &mut [u8],
        cand_stride: usize,
    ) {
        let mut out = Out {
            floors,
            live,
            scores,
            stride,
            cands,
            cand_stride,
        };
        let mut q = 0;
        if queries.len() >= PRUNE_MIN_QUERIES {
            let norms = hi_norms(tiles);
            let qnorms: Vec<f32> = queries.iter().map(query_hi_norm).collect();
            while q + 4 <= queries.len() {
                let mut t = 0;
                while t + 2 <= tiles.len() {
                    tile_block_pruned::<4, 2>(tiles, queries, q, t, &norms, &qnorms, &mut out);
                    t += 2;
                }
                while t < tiles.len() {
                    tile_block::<4, 1>(tiles, queries, q, t, &mut out);
                    t += 1;
                }
                q += 4;
            }
        }
        while q + 4 <= queries.len() {
            block::<4, 2>(tiles, queries, q, &mut out);
            q += 4;
        }
        while q < queries.len() {
            block::<1, 4>(tiles, queries, q, &mut out);
            q += 1;
        }
    }

    /// QB queries × TB tiles of accumulators; remainder tiles one at a time.
    #[target_feature(enable = "avx2")]
    unsafe fn block<const QB: usize, const TB: usize>(
        tiles: &[Tile],
        queries: &[QueryPairs],
        q0: usize,
        out: &mut Out<'_>,
    ) {
        let mut t = 0;
        while t + TB <= tiles.len() {
            tile_block::<QB, TB>(tiles, queries, q0, t, out);
            t += TB;
        }
        while t < tiles.len() {
            tile_block::<QB, 1>(tiles, queries, q0, t, out);
            t += 1;
        }
    }

    #[target_feature(enable = "avx2")]
    #[allow(clippy::needless_range_loop)] // fixed-size register tiles, indexed on purpose
    unsafe fn tile_block<const QB: usize, const TB: usize>(
        tiles: &[Tile],
        queries: &[QueryPairs],
        q0: usize,
        t0: usize,
        out: &mut Out<'_>,
    ) {
        let tiles = &tiles[t0..t0 + TB];
        let queries = &queries[q0..q0 + QB];
        let mut acc = [[_mm256_setzero_si256(); TB]; QB];
        for p in 0..16 {
            let mut b = [_mm256_setzero_si256(); TB];
            for u in 0..TB {
                b[u] =
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(tiles[u].0[p].as_ptr() as *const __m128i));
            }
            for q in 0..QB {
                let w = _mm256_set1_epi32(queries[q][p]);
                for u in 0..TB {
                    acc[q][u] = _mm256_add_epi32(acc[q][u], _mm256_madd_epi16(b[u], w));
                }
            }
        }
        finish::<QB, TB>(&acc, q0, t0, out);
    }

    /// Per tile, the L2 norms of the entries' upper 16 dims (pairs 8..16).
    #[target_feature(enable = "avx2")]
    unsafe fn hi_norms(tiles: &[Tile]) -> Vec<__m256> {
        tiles
            .iter()
            .map(|tile| {
                let mut acc = _mm256_setzero_si256();
                for row in &tile.0[8..] {
                    let b = _mm256_cvtepi8_epi16(_mm_loadu_si128(row.as_ptr() as *const __m128i));
                    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(b, b));
                }
                _mm256_sqrt_ps(_mm256_cvtepi32_ps(acc))
            })
            .collect()
    }

    fn query_hi_norm(q: &QueryPairs) -> f32 {
        let sum: i32 = q[8..]
            .iter()
            .map(|&w| {
                let (a, b) = (i32::from(w as i16), i32::from((w >> 16) as i16));
                a * a + b * b
            })
            .sum();
        (sum as f32).sqrt()
    }

    /// Like `tile_block`, but scores the lower 16 dims first and finishes only when some
    /// live entry can still reach its query's floor: by Cauchy–Schwarz the upper half adds
    /// at most ‖q_hi‖·‖e_hi‖ (plus `PRUNE_SLACK` for f32 rounding, whose error here is
    /// below 0.1). A block that cannot reach any floor has no candidates, exactly as if it
    /// had been scored in full; its scores are not written.
    #[target_feature(enable = "avx2")]
    #[allow(clippy::needless_range_loop, clippy::too_many_arguments)] // register tiles
    unsafe fn tile_block_pruned<const QB: usize, const TB: usize>(
        tiles: &[Tile],
        queries: &[QueryPairs],
        q0: usize,
        t0: usize,
        norms: &[__m256],
        qnorms: &[f32],
        out: &mut Out<'_>,
    ) {
        let tiles = &tiles[t0..t0 + TB];
        let queries = &queries[q0..q0 + QB];
        let mut acc = [[_mm256_setzero_si256(); TB]; QB];
        for p in 0..8 {
            let mut b = [_mm256_setzero_si256(); TB];
            for u in 0..TB {
                b[u] =
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(tiles[u].0[p].as_ptr() as *const __m128i));
            }
            for q in 0..QB {
                let w = _mm256_set1_epi32(queries[q][p]);
                for u in 0..TB {
                    acc[q][u] = _mm256_add_epi32(acc[q][u], _mm256_madd_epi16(b[u], w));
                }
            }
        }
        let slack = _mm256_set1_ps(PRUNE_SLACK);
        let mut reach = 0u32;
        for q in 0..QB {
            let floor = _mm256_set1_ps(out.floors[q0 + q] as f32);
            let qn = _mm256_set1_ps(qnorms[q0 + q]);
            for u in 0..TB {
                let lo = _mm256_add_ps(_mm256_cvtepi32_ps(acc[q][u]), slack);
                let bound = _mm256_add_ps(lo, _mm256_mul_ps(norms[t0 + u], qn));
                let ok = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(bound, floor)) as u32;
                reach |= ok & u32::from(out.live[t0 + u]);
            }
        }
        if reach == 0 {
            for q in 0..QB {
                for u in 0..TB {
                    out.cands[(q0 + q) * out.cand_stride + t0 + u] = 0;
                }
            }
            return;
        }
        for p in 8..16 {
            let mut b = [_mm256_setzero_si256(); TB];
            for u in 0..TB {
                b[u] =
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(tiles[u].0[p].as_ptr() as *const __m128i));
            }
            for q in 0..QB {
                let w = _mm256_set1_epi32(queries[q][p]);
                for u in 0..TB {
                    acc[q][u] = _mm256_add_epi32(acc[q][u], _mm256_madd_epi16(b[u], w));
                }
            }
        }
        finish::<QB, TB>(&acc, q0, t0, out);
    }

    /// Bit i set when `row[i]` is not zero (`row` holds at most 64 bytes).
    ///
    /// # Safety
    /// AVX2 must be available.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn nonzero_mask(row: &[u8]) -> u64 {
        let n = row.len().min(64);
        let mut m = 0u64;
        let mut i = 0;
        let zero = _mm256_setzero_si256();
        while i + 32 <= n {
            let v = _mm256_loadu_si256(row[i..].as_ptr() as *const __m256i);
            let z = _mm256_movemask_epi8(_mm256_cmpeq_epi8(v, zero)) as u32;
            m |= u64::from(!z) << i;
            i += 32;
        }
        while i < n {
            m |= u64::from(row[i] != 0) << i;
            i += 1;
        }
        m
    }

    /// Store scores and candidate masks of a finished block.
    #[target_feature(enable = "avx2")]
    unsafe fn finish<const QB: usize, const TB: usize>(
        acc: &[[__m256i; TB]; QB],
        q0: usize,
        t0: usize,
        out: &mut Out<'_>,
    ) {
        for (q, row) in acc.iter().enumerate() {
            let floor = _mm256_set1_epi32(out.floors[q0 + q]);
            for (u, v) in row.iter().enumerate() {
                let at = (q0 + q) * out.stride + (t0 + u) * TILE;
                let dst = &mut out.scores[at..at + TILE];
                _mm256_storeu_si256(dst.as_mut_ptr() as *mut __m256i, *v);
                let below =
                    _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(floor, *v))) as u8;
                out.cands[(q0 + q) * out.cand_stride + t0 + u] = !below & out.live[t0 + u];
            }
        }
    }

    /// # Safety
    /// AVX2 must be available; `tenants` and `expires` hold `out.len() * 8` entries.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn live_masks(
        tenants: &[u32],
        expires: &[u32],
        tenant: u32,
        now_s: u32,
        out: &mut [u8],
    ) {
        let want = _mm256_set1_epi32(tenant as i32);
        let bias = _mm256_set1_epi32(i32::MIN);
        let now = _mm256_xor_si256(_mm256_set1_epi32(now_s as i32), bias);
        for (t, m) in out.iter_mut().enumerate() {
            let tn = &tenants[t * TILE..(t + 1) * TILE];
            let ex = &expires[t * TILE..(t + 1) * TILE];
            let tn = _mm256_loadu_si256(tn.as_ptr() as *const __m256i);
            let ex = _mm256_xor_si256(_mm256_loadu_si256(ex.as_ptr() as *const __m256i), bias);
            // Unsigned now < expires, as a signed compare of biased values.
            let live = _mm256_and_si256(_mm256_cmpeq_epi32(tn, want), _mm256_cmpgt_epi32(ex, now));
            *m = _mm256_movemask_ps(_mm256_castsi256_ps(live)) as u8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(x: &mut u64) -> i8 {
        *x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*x >> 56) as u8 as i8
    }

    #[test]
    fn tile_roundtrip() {
        let mut tile = Tile::default();
        let s: [i8; 32] = std::array::from_fn(|i| i as i8 - 16);
        tile.set(5, &s);
        assert_eq!(tile.get(5), s);
        assert_eq!(tile.get(4), [0; 32]);
    }

    #[test]
    fn dispatched_kernel_matches_portable_and_dot() {
        let mut x = 7u64;
        for (nt, nq) in [(1, 1), (3, 5), (7, 4), (64, 9), (2, 0), (64, 64), (5, 13)] {
            let mut sketches = Vec::new();
            let mut tiles = vec![Tile::default(); nt];
            for e in 0..nt * TILE {
                let mut s = [0i8; 32];
                for v in s.iter_mut() {
                    *v = lcg(&mut x);
                }
                if e % 5 == 0 {
                    s = [-128; 32];
                }
                tiles[e / TILE].set(e % TILE, &s);
                sketches.push(s);
            }
            let raw: Vec<[i8; 32]> = (0..nq)
                .map(|q| {
                    if q == 0 {
                        [-128; 32]
                    } else {
                        std::array::from_fn(|_| lcg(&mut x))
                    }
                })
                .collect();
            let qs: Vec<QueryPairs> = raw.iter().map(pack_query).collect();
            let stride = nt * TILE + 3;
            let floors: Vec<i32> = (0..nq)
                .map(|q| [i32::MIN, 0, 5000, -3000, 40_000, 90_000, 600_000][q % 7])
                .collect();
            let live: Vec<u8> = (0..nt).map(|t| [0xff, 0x5a, 0, 0x81][t % 4]).collect();
            let mut fast = vec![0; nq * stride];
            let mut slow = vec![0; nq * stride];
            let mut fast_c = vec![0u8; nq * nt];
            let mut slow_c = vec![0u8; nq * nt];
            let mut fast_m = vec![0u64; nq];
            assert!(scores(
                &tiles,
                &qs,
                &floors,
                &live,
                &mut fast,
                stride,
                &mut fast_c,
                nt,
                &mut fast_m
            ));
            for q in 0..nq {
                let want = (0..nt).fold(0u64, |m, t| m | u64::from(fast_c[q * nt + t] != 0) << t);
                assert_eq!(fast_m[q], want);
            }
            scores_portable(
                &tiles,
                &qs,
                &floors,
                &live,
                &mut slow,
                stride,
                &mut slow_c,
                nt,
            );
            // Same candidates; same scores wherever a candidate is (pruned blocks of the
            // AVX2 path leave their scores unwritten).
            assert_eq!(fast_c, slow_c);
            for q in 0..nq {
                for t in 0..nt {
                    for j in 0..TILE {
                        if slow_c[q * nt + t] >> j & 1 == 1 {
                            let e = q * stride + t * TILE + j;
                            assert_eq!(fast[e], slow[e]);
                        }
                    }
                }
            }
            for (q, query) in raw.iter().enumerate() {
                for (e, s) in sketches.iter().enumerate() {
                    assert_eq!(slow[q * stride + e], super::super::dot(s, query));
                }
            }
        }
        assert!(!scores(
            &[Tile::default()],
            &[[0; 16]],
            &[0],
            &[0],
            &mut [0; 4],
            8,
            &mut [0],
            1,
            &mut [0]
        ));
    }

    #[test]
    fn nonzero_masks_match_portable() {
        let mut x = 3u64;
        for n in [0, 1, 31, 32, 33, 63, 64] {
            let row: Vec<u8> = (0..n)
                .map(|_| if lcg(&mut x) < 0 { 0 } else { 1 << (x % 8) })
                .collect();
            let want = (0..n).fold(0u64, |m, i| m | u64::from(row[i] != 0) << i);
            assert_eq!(nonzero_mask(&row), want);
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: AVX2 is available.
                assert_eq!(unsafe { avx2::nonzero_mask(&row) }, want);
            }
        }
    }

    #[test]
    fn live_masks_match_portable() {
        let tenants: Vec<u32> = (0..64u32).map(|i| i % 3).collect();
        let expires: Vec<u32> = (0..64u32)
            .map(|i| if i % 5 == 0 { u32::MAX } else { i * 10 })
            .collect();
        for (n, now) in [(64, 0), (61, 200), (3, 0), (0, 0), (64, u32::MAX - 1)] {
            let mut got = [0u8; 8];
            live_masks(&tenants, &expires, n, 1, now, &mut got);
            for e in 0..64 {
                let want = e < n && tenants[e] == 1 && now < expires[e];
                assert_eq!(
                    got[e / 8] >> (e % 8) & 1 == 1,
                    want,
                    "n {n} now {now} e {e}"
                );
            }
        }
    }
}
