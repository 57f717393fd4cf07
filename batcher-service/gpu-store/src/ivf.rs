//! The approximate IVF path's host side, shared by the CUDA backend and its emulation:
//! k-means over a sample of the sketches (the coarse centroids), the inverted lists as slot
//! numbers into the one copy of the entries (padded to whole tiles), and the work items of
//! a list-restricted scan (`topk_scan_lists`: one warp scans one list for up to 32 of the
//! queries that probe it).
//!
//! Lists hold device slots, not sketches: the index adds 4 device bytes per entry (plus
//! padding to 16 per list and 48 bytes per centroid) to the store's 48. See
//! docs/GPU-STORE.md.

use crate::layout::{NO_SLOT, ROWS, WARP_Q};
use crate::rng::Rng;
use cohort_batcher_core::store::{dot, SketchBytes};

/// The work of one `topk_scan_lists` launch: item `i` is list `list[i]` with the queries
/// `q[i * 32 ..][..32]` (query index, `NO_SLOT` past the last) and their probe ranks `p`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListItems {
    pub list: Vec<u32>,
    pub q: Vec<u32>,
    pub p: Vec<u32>,
}

/// Group the probes (`probes[q][rank]` = list) by list, 32 queries an item, so that every
/// (query, rank) is in exactly one item. Longer lists come first (they take longest).
pub fn plan_items(probes: &[Vec<u32>], list_len: &[usize]) -> ListItems {
    let mut by_list: Vec<Vec<(u32, u32)>> = vec![Vec::new(); list_len.len()];
    for (q, ranks) in probes.iter().enumerate() {
        for (p, &l) in ranks.iter().enumerate() {
            by_list[l as usize].push((q as u32, p as u32));
        }
    }
    let mut order: Vec<usize> = (0..list_len.len()).collect();
    order.sort_by_key(|&l| std::cmp::Reverse(list_len[l]));
    let mut items = ListItems::default();
    for l in order {
        for chunk in by_list[l].chunks(WARP_Q) {
            items.list.push(l as u32);
            for i in 0..WARP_Q {
                let (q, p) = chunk.get(i).copied().unwrap_or((NO_SLOT, 0));
                items.q.push(q);
                items.p.push(p);
            }
        }
    }
    items
}

/// The lists as the device holds them: list `l` is `slots[off[l]..off[l + 1]]`, each padded
/// with `NO_SLOT` to a multiple of 16 slots.
pub fn pack_lists(members: &[Vec<u32>]) -> (Vec<u32>, Vec<u32>) {
    let mut off = Vec::with_capacity(members.len() + 1);
    let mut slots = Vec::new();
    off.push(0);
    for m in members {
        slots.extend_from_slice(m);
        slots.resize(slots.len().div_ceil(ROWS) * ROWS, NO_SLOT);
        off.push(slots.len() as u32);
    }
    (off, slots)
}

/// The `nprobe` best centroids of `query` by inner product (ties: the smaller index), as
/// the exact kernels rank them when the centroid's key is its index.
pub fn probe_lists(centroids: &[SketchBytes], query: &SketchBytes, nprobe: usize) -> Vec<u32> {
    let mut scored: Vec<(i32, u32)> = centroids
        .iter()
        .enumerate()
        .map(|(i, c)| (dot(c, query), i as u32))
        .collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    scored.into_iter().take(nprobe).map(|(_, i)| i).collect()
}

/// The list of an entry: its best centroid by inner product, the rule queries probe by.
pub fn list_of(centroids: &[SketchBytes], sketch: &SketchBytes) -> u32 {
    probe_lists(centroids, sketch, 1)
        .first()
        .copied()
        .unwrap_or(0)
}

/// The centroid nearest to `s` (squared distance; the first on ties).
fn nearest(cents: &[[f32; 32]], s: &SketchBytes) -> usize {
    let x: [f32; 32] = std::array::from_fn(|d| f32::from(s[d]));
    let mut best = (f32::INFINITY, 0);
    for (c, cent) in cents.iter().enumerate() {
        let d2: f32 = x.iter().zip(cent).map(|(a, b)| (a - b) * (a - b)).sum();
        if d2 < best.0 {
            best = (d2, c);
        }
    }
    best.1
}

/// k-means (Lloyd, squared distance) over `sample`: `nlist` centroids started from distinct
/// sample points chosen by `seed`, `iters` rounds; a centroid left empty keeps its place.
/// The result is rounded to int8 (what the device scores with). Deterministic (the
/// assignment step runs on up to 16 threads, each point on its own).
pub fn kmeans(sample: &[SketchBytes], nlist: usize, iters: usize, seed: u64) -> Vec<SketchBytes> {
    if sample.is_empty() || nlist == 0 {
        return Vec::new();
    }
    let nlist = nlist.min(sample.len());
    let mut rng = Rng(seed);
    let mut order: Vec<usize> = (0..sample.len()).collect();
    for i in 0..nlist {
        let j = i + rng.below((order.len() - i) as u64) as usize;
        order.swap(i, j);
    }
    let mut cents: Vec<[f32; 32]> = order[..nlist]
        .iter()
        .map(|&i| std::array::from_fn(|d| f32::from(sample[i][d])))
        .collect();
    let mut assign = vec![0usize; sample.len()];
    for _ in 0..iters {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(16));
        let per = sample.len().div_ceil(threads);
        let cents_ref = &cents;
        std::thread::scope(|sc| {
            for (xs, out) in sample.chunks(per).zip(assign.chunks_mut(per)) {
                sc.spawn(move || {
                    for (s, a) in xs.iter().zip(out.iter_mut()) {
                        *a = nearest(cents_ref, s);
                    }
                });
            }
        });
        let mut sum = vec![[0f32; 32]; nlist];
        let mut count = vec![0u32; nlist];
        for (s, &a) in sample.iter().zip(&assign) {
            count[a] += 1;
            for d in 0..32 {
                sum[a][d] += f32::from(s[d]);
            }
        }
        for c in 0..nlist {
            if count[c] > 0 {
                cents[c] = std::array::from_fn(|d| sum[c][d] / count[c] as f32);
            }
        }
    }
    cents
        .iter()
        .map(|c| std::array::from_fn(|d| c[d].round().clamp(-128.0, 127.0) as i8))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_cover_every_probe_once() {
        let probes = vec![vec![0, 2], vec![2, 1], vec![2, 0]];
        let items = plan_items(&probes, &[16, 0, 48]);
        assert_eq!(items.list, vec![2, 0, 1]);
        let mut seen: Vec<(u32, u32)> = items
            .q
            .iter()
            .zip(&items.p)
            .filter(|(q, _)| **q != NO_SLOT)
            .map(|(&q, &p)| (q, p))
            .collect();
        seen.sort();
        assert_eq!(seen, vec![(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]);
        // The real queries of an item come first.
        assert_eq!(&items.q[..4], &[0, 1, 2, NO_SLOT]);
    }

    #[test]
    fn lists_are_padded_to_tiles() {
        let (off, slots) = pack_lists(&[vec![3, 4], vec![], (0..17).collect()]);
        assert_eq!(off, vec![0, 16, 16, 48]);
        assert_eq!(slots.len(), 48);
        assert_eq!(slots[2], NO_SLOT);
        assert_eq!(slots[16..33].to_vec(), (0..17).collect::<Vec<u32>>());
    }

    /// Sum of squared distances from each point to its nearest centroid.
    fn cost(sample: &[SketchBytes], cents: &[SketchBytes]) -> i64 {
        sample
            .iter()
            .map(|s| {
                cents
                    .iter()
                    .map(|c| {
                        (0..32)
                            .map(|d| (i64::from(s[d]) - i64::from(c[d])).pow(2))
                            .sum::<i64>()
                    })
                    .min()
                    .unwrap_or(0)
            })
            .sum()
    }

    #[test]
    fn kmeans_is_deterministic_and_improves_on_its_start() {
        let mut r = Rng(5);
        let centres: Vec<SketchBytes> = (0..8).map(|_| r.sketch()).collect();
        let sample: Vec<SketchBytes> = (0..400)
            .map(|i| {
                let n = r.sketch();
                std::array::from_fn(|d| centres[i % 8][d].saturating_add(n[d] >> 4))
            })
            .collect();
        let cents = kmeans(&sample, 8, 8, 1);
        assert_eq!(cents.len(), 8);
        assert_eq!(cents, kmeans(&sample, 8, 8, 1), "deterministic");
        let start = kmeans(&sample, 8, 0, 1);
        assert!(cost(&sample, &cents) < cost(&sample, &start));
        assert!(kmeans(&[], 8, 8, 1).is_empty());
        assert_eq!(kmeans(&sample[..3], 8, 2, 1).len(), 3);
    }
}
