//! The kernels of `kernels/store.cu`, executed on the CPU lane by lane: same layout, same
//! launch plan, same per-warp lists, candidate queue, thresholds and warp-register merge.
//!
//! This is what the parity tests run on machines without a GPU, so the algorithm (fragment
//! order, tie handling, thresholds, part merge) is checked against the CPU store everywhere;
//! the CUDA source is checked against the same suite on a GPU (`scripts/gpu-check.sh`) and
//! compiled with g++ over a warp simulation in `tests/warp_sim.rs`. Keep it in step with
//! the `.cu` file, statement for statement.

use crate::backend::{Backend, DeviceError, RawHit, SlotWrite};
use crate::ivf::ListItems;
use crate::layout::{
    frag_word, pack_queries, padded_slots, plan_scan, ScanPlan, KMAX, NO_SLOT, ROWS, WARPS, WARP_Q,
    WORDS,
};
use cohort_batcher_core::store::SketchBytes;

/// Multiprocessors the emulation plans its launches for (an H200 has 132).
pub const EMU_SMS: usize = 132;

/// One emulated device.
pub struct EmuDevice {
    tiles: Vec<u32>,
    keys: Vec<u64>,
    tenants: Vec<u32>,
    expires: Vec<u32>,
    /// The inverted lists (`ivf::pack_lists`), empty without an index.
    list_off: Vec<u32>,
    list_slots: Vec<u32>,
    answer: Vec<Vec<RawHit>>,
}

impl EmuDevice {
    pub fn new(slots: usize) -> EmuDevice {
        let slots = padded_slots(slots);
        EmuDevice {
            tiles: vec![0; slots * WORDS],
            keys: vec![0; slots],
            tenants: vec![0; slots],
            expires: vec![0; slots],
            list_off: Vec::new(),
            list_slots: Vec::new(),
            answer: Vec::new(),
        }
    }
}

#[inline]
fn better(s: i32, key: u64, s2: i32, key2: u64) -> bool {
    s > s2 || (s == s2 && key < key2)
}

/// `mma.sync.m16n8k32.row.col.s32.s8.s8.s32` over a warp: `a[lane]` and `b[lane]` are the
/// lanes' fragments, the result is each lane's four accumulators. The fragments are first
/// unpacked by the PTX layout into A (16 rows × 32 dims) and B (8 columns × 32 dims): word
/// `w` of row `row` is in lane `(row % 8) * 4 + w % 4`, register `row / 8 + 2 * (w / 4)`;
/// word `w` of column `col` in lane `col * 4 + w % 4`, register `w / 4`. Accumulator `r`
/// of lane L is (row `L / 4 + 8 * (r / 2)`, column `2 * (L % 4) + r % 2`).
fn mma_s8(a: &[[u32; 4]; 32], b: &[[u32; 2]; 32]) -> [[i32; 4]; 32] {
    let unpack = |word: u32| word.to_le_bytes().map(|x| i32::from(x as i8));
    let am: [[i32; 32]; 16] = std::array::from_fn(|row| {
        let mut v = [0; 32];
        for w in 0..WORDS {
            let x = unpack(a[(row & 7) * 4 + (w & 3)][(row >> 3) + 2 * (w >> 2)]);
            v[4 * w..4 * w + 4].copy_from_slice(&x);
        }
        v
    });
    let bm: [[i32; 32]; 8] = std::array::from_fn(|col| {
        let mut v = [0; 32];
        for w in 0..WORDS {
            let x = unpack(b[col * 4 + (w & 3)][w >> 2]);
            v[4 * w..4 * w + 4].copy_from_slice(&x);
        }
        v
    });
    let cm: [[i32; 8]; 16] = std::array::from_fn(|row| {
        std::array::from_fn(|col| am[row].iter().zip(&bm[col]).map(|(x, y)| x * y).sum())
    });
    std::array::from_fn(|lane| {
        let (g, t) = (lane >> 2, lane & 3);
        std::array::from_fn(|r| cm[g + 8 * (r >> 1)][2 * t + (r & 1)])
    })
}

/// One warp's lists: `[place][lane]`, as in shared memory.
struct Lists {
    s: [[i32; 32]; KMAX],
    k: [[u64; 32]; KMAX],
    slot: [[u32; 32]; KMAX],
}

impl Lists {
    fn new() -> Lists {
        Lists {
            s: [[i32::MIN; 32]; KMAX],
            k: [[u64::MAX; 32]; KMAX],
            slot: [[NO_SLOT; 32]; KMAX],
        }
    }

    /// `lists_write`: lane `lane`'s list to `out[base..]`.
    fn write(&self, lane: usize, k: usize, base: usize, out: &mut Partials) {
        for i in 0..k {
            out.s[base + i] = self.s[i][lane];
            out.k[base + i] = self.k[i][lane];
            out.slot[base + i] = self.slot[i][lane];
        }
    }

    /// `list_insert` of the kernel.
    fn insert(&mut self, lane: usize, k: usize, s: i32, key: u64, slot: u32) {
        if !better(s, key, self.s[k - 1][lane], self.k[k - 1][lane]) {
            return;
        }
        let mut i = k - 1;
        while i > 0 && better(s, key, self.s[i - 1][lane], self.k[i - 1][lane]) {
            self.s[i][lane] = self.s[i - 1][lane];
            self.k[i][lane] = self.k[i - 1][lane];
            self.slot[i][lane] = self.slot[i - 1][lane];
            i -= 1;
        }
        self.s[i][lane] = s;
        self.k[i][lane] = key;
        self.slot[i][lane] = slot;
    }
}

/// The B fragments of a warp's 32 queries: `[j][lane]`.
type BFrags = [[[u32; 2]; 32]; 4];
/// Per lane, the floors of its 8 accumulator columns (registers): `[lane][j][h]`.
type Floors = [[[i32; 2]; 4]; 32];

/// The initial floors: `i32::MIN` for the warp's `nv` real queries, `i32::MAX` for padding
/// (which never asks for the slow path).
fn floors(nv: usize) -> Floors {
    std::array::from_fn(|lane| {
        std::array::from_fn(|j| {
            std::array::from_fn(|h| {
                if 8 * j + 2 * (lane & 3) + h < nv {
                    i32::MIN
                } else {
                    i32::MAX
                }
            })
        })
    })
}

/// Per (query, part) lists written by the scan.
struct Partials {
    s: Vec<i32>,
    k: Vec<u64>,
    slot: Vec<u32>,
}

impl EmuDevice {
    fn n_tiles(&self) -> usize {
        self.keys.len() / ROWS
    }

    /// `store_scatter`.
    fn store_scatter(&mut self, writes: &[SlotWrite]) {
        for w in writes {
            let slot = w.slot as usize;
            let base = (slot / ROWS) * (ROWS * WORDS);
            let row = slot % ROWS;
            for (i, &word) in w.words.iter().enumerate() {
                self.tiles[base + frag_word(row, i)] = word;
            }
            self.keys[slot] = w.key;
            self.tenants[slot] = w.tenant;
            self.expires[slot] = w.expires;
        }
    }

    /// Whether slot `e` holds a live entry of `tenant`.
    fn live(&self, e: u32, tenant: u32, now: u32) -> bool {
        e != NO_SLOT && self.tenants[e as usize] == tenant && now < self.expires[e as usize]
    }

    /// `warp_tile`: one tile (the lanes' A fragments `a`; row r is entry `rows[r].0`, live
    /// or not) against the warp's queries, of which the first `nv` are real.
    #[allow(clippy::too_many_arguments)]
    fn warp_tile(
        &self,
        a: &[[u32; 4]; 32],
        rows: &[(u32, bool); ROWS],
        b: &BFrags,
        fl: &mut Floors,
        nv: usize,
        k: usize,
        lists: &mut Lists,
        queue: &mut Vec<(usize, i32, usize)>,
    ) {
        for (j, bj) in b.iter().enumerate() {
            if 8 * j >= nv {
                break;
            }
            let c = mma_s8(a, bj);
            let maybe = (0..32).any(|lane| {
                let g = lane >> 2;
                (0..4).any(|r| {
                    let live = if r < 2 { rows[g].1 } else { rows[g + 8].1 };
                    live && c[lane][r] >= fl[lane][j][r & 1]
                })
            });
            if !maybe {
                continue;
            }
            for (lane, cl) in c.iter().enumerate() {
                let (g, t) = (lane >> 2, lane & 3);
                for (r, &score) in cl.iter().enumerate() {
                    let q = 8 * j + 2 * t + (r & 1);
                    let (e, live) = if r < 2 { rows[g] } else { rows[g + 8] };
                    if !live || q >= nv {
                        continue;
                    }
                    let floor_s = lists.s[k - 1][q];
                    if score < floor_s {
                        continue;
                    }
                    if score == floor_s && self.keys[e as usize] >= lists.k[k - 1][q] {
                        continue;
                    }
                    queue.push((e as usize, score, q));
                }
            }
            for lane in 0..32 {
                for &(e, s, q) in queue.iter() {
                    if q != lane {
                        continue;
                    }
                    lists.insert(lane, k, s, self.keys[e], e as u32);
                }
            }
            if !queue.is_empty() {
                queue.clear();
                for (lane, fl) in fl.iter_mut().enumerate() {
                    for (jj, f) in fl.iter_mut().enumerate() {
                        for (h, f) in f.iter_mut().enumerate() {
                            let q = 8 * jj + 2 * (lane & 3) + h;
                            if q < nv {
                                *f = lists.s[k - 1][q];
                            }
                        }
                    }
                }
            }
        }
    }

    /// Word `word` of the sketch in slot `slot` (`slot_word`).
    fn slot_word(&self, slot: u32, word: usize) -> u32 {
        let slot = slot as usize;
        self.tiles[(slot / ROWS) * (ROWS * WORDS) + frag_word(slot % ROWS, word)]
    }

    /// `topk_scan_lists`, every warp of the grid (one work item each).
    #[allow(clippy::too_many_arguments)]
    fn topk_scan_lists(
        &self,
        items: &ListItems,
        queries: &[u32],
        nprobe: usize,
        tenant: u32,
        now: u32,
        k: usize,
        out: &mut Partials,
    ) {
        for item in 0..items.list.len() {
            let iq = &items.q[item * 32..(item + 1) * 32];
            let ip = &items.p[item * 32..(item + 1) * 32];
            let nv = iq.iter().filter(|&&q| q != NO_SLOT).count();
            let mut lists = Lists::new();
            let mut queue: Vec<(usize, i32, usize)> = Vec::with_capacity(ROWS * 8);
            let b: BFrags = std::array::from_fn(|j| {
                std::array::from_fn(|lane| {
                    let (g, t) = (lane >> 2, lane & 3);
                    let q = iq[8 * j + g];
                    if q == NO_SLOT {
                        [0, 0]
                    } else {
                        let q = q as usize;
                        [queries[q * WORDS + t], queries[q * WORDS + 4 + t]]
                    }
                })
            });
            let mut fl = floors(nv);
            let list = items.list[item] as usize;
            let (from, to) = (
                self.list_off[list] as usize,
                self.list_off[list + 1] as usize,
            );
            for at in (from..to).step_by(ROWS) {
                let rows: [(u32, bool); ROWS] = std::array::from_fn(|row| {
                    let e = self.list_slots[at + row];
                    (e, self.live(e, tenant, now))
                });
                if !rows.iter().any(|&(_, live)| live) {
                    continue;
                }
                let word = |e: u32, w: usize| {
                    if e == NO_SLOT {
                        0
                    } else {
                        self.slot_word(e, w)
                    }
                };
                let a: [[u32; 4]; 32] = std::array::from_fn(|lane| {
                    let (g, t) = (lane >> 2, lane & 3);
                    let (e0, e1) = (rows[g].0, rows[g + 8].0);
                    [word(e0, t), word(e1, t), word(e0, t + 4), word(e1, t + 4)]
                });
                self.warp_tile(&a, &rows, &b, &mut fl, nv, k, &mut lists, &mut queue);
            }
            for lane in 0..32 {
                if iq[lane] == NO_SLOT {
                    continue;
                }
                let base = (iq[lane] as usize * nprobe + ip[lane] as usize) * k;
                lists.write(lane, k, base, out);
            }
        }
    }

    /// `topk_scan`, every block and warp of the grid.
    #[allow(clippy::too_many_arguments)]
    fn topk_scan(
        &self,
        plan: ScanPlan,
        queries: &[u32],
        nq: usize,
        tenant: u32,
        now: u32,
        k: usize,
        out: &mut Partials,
    ) {
        let parts = plan.parts;
        for by in 0..plan.query_blocks {
            for part in 0..parts {
                for warp in 0..WARPS {
                    let qb = (by * WARPS + warp) * WARP_Q;
                    if qb >= nq {
                        continue;
                    }
                    let nv = (nq - qb).min(WARP_Q);
                    let mut lists = Lists::new();
                    let mut queue: Vec<(usize, i32, usize)> = Vec::with_capacity(ROWS * 8);
                    let b: [[[u32; 2]; 32]; 4] = std::array::from_fn(|j| {
                        std::array::from_fn(|lane| {
                            let (g, t) = (lane >> 2, lane & 3);
                            let q = qb + 8 * j + g;
                            [queries[q * WORDS + t], queries[q * WORDS + 4 + t]]
                        })
                    });
                    let mut fl = floors(nv);
                    let t0 = part * plan.part_tiles;
                    let t1 = (t0 + plan.part_tiles).min(self.n_tiles());
                    for tile in t0..t1 {
                        let rows: [(u32, bool); ROWS] = std::array::from_fn(|row| {
                            let e = tile * ROWS + row;
                            (e as u32, self.live(e as u32, tenant, now))
                        });
                        if !rows.iter().any(|&(_, live)| live) {
                            continue;
                        }
                        let a: [[u32; 4]; 32] = std::array::from_fn(|lane| {
                            let at = (tile * 32 + lane) * 4;
                            [
                                self.tiles[at],
                                self.tiles[at + 1],
                                self.tiles[at + 2],
                                self.tiles[at + 3],
                            ]
                        });
                        self.warp_tile(&a, &rows, &b, &mut fl, nv, k, &mut lists, &mut queue);
                    }
                    for lane in 0..32 {
                        if qb + lane >= nq {
                            continue;
                        }
                        lists.write(lane, k, ((qb + lane) * parts + part) * k, out);
                    }
                }
            }
        }
    }

    /// `topk_merge`, one warp a query.
    fn topk_merge(&self, parts: usize, nq: usize, k: usize, input: &Partials) -> Vec<Vec<RawHit>> {
        (0..nq)
            .map(|q| {
                let mut ms = [i32::MIN; 32];
                let mut mk = [u64::MAX; 32];
                let mut mslot = [NO_SLOT; 32];
                let (mut ts, mut tk) = (i32::MIN, u64::MAX);
                let total = parts * k;
                let base = q * total;
                for c0 in (0..total).step_by(32) {
                    let cand: [(i32, u64, u32); 32] = std::array::from_fn(|lane| {
                        let i = c0 + lane;
                        if i < total {
                            (input.s[base + i], input.k[base + i], input.slot[base + i])
                        } else {
                            (i32::MIN, u64::MAX, NO_SLOT)
                        }
                    });
                    let mut m = (0..32).fold(0u32, |m, lane| {
                        let (cs, ck, cslot) = cand[lane];
                        m | (u32::from(cslot != NO_SLOT && better(cs, ck, ts, tk)) << lane)
                    });
                    while m != 0 {
                        let src = m.trailing_zeros() as usize;
                        m &= m - 1;
                        let (ns, nk, nslot) = cand[src];
                        if !better(ns, nk, ts, tk) {
                            continue;
                        }
                        let pos = (0..32)
                            .filter(|&lane| lane < k && !better(ns, nk, ms[lane], mk[lane]))
                            .count();
                        let (us, uk, uslot) = (ms, mk, mslot);
                        for lane in 0..32 {
                            if lane > pos {
                                ms[lane] = us[lane - 1];
                                mk[lane] = uk[lane - 1];
                                mslot[lane] = uslot[lane - 1];
                            } else if lane == pos {
                                ms[lane] = ns;
                                mk[lane] = nk;
                                mslot[lane] = nslot;
                            }
                        }
                        ts = ms[k - 1];
                        tk = mk[k - 1];
                    }
                }
                (0..k)
                    .filter(|&lane| mslot[lane] != NO_SLOT)
                    .map(|lane| RawHit {
                        slot: mslot[lane],
                        key: mk[lane],
                        score: ms[lane],
                    })
                    .collect()
            })
            .collect()
    }
}

impl Backend for EmuDevice {
    fn slots(&self) -> usize {
        self.keys.len()
    }

    fn scatter(&mut self, writes: &[SlotWrite]) -> Result<(), DeviceError> {
        self.store_scatter(writes);
        Ok(())
    }

    fn submit_top_k(
        &mut self,
        tenant: u32,
        queries: &[SketchBytes],
        k: usize,
        now_s: u32,
    ) -> Result<(), DeviceError> {
        let nq = queries.len();
        let plan = plan_scan(self.n_tiles(), nq, EMU_SMS);
        let words = pack_queries(queries);
        let n = nq * plan.parts * k;
        let mut partials = Partials {
            s: vec![0; n],
            k: vec![0; n],
            slot: vec![0; n],
        };
        self.topk_scan(plan, &words, nq, tenant, now_s, k, &mut partials);
        self.answer = self.topk_merge(plan.parts, nq, k, &partials);
        Ok(())
    }

    fn collect_top_k(&mut self) -> Result<Vec<Vec<RawHit>>, DeviceError> {
        Ok(std::mem::take(&mut self.answer))
    }

    fn entry_bytes(&self) -> u64 {
        (self.keys.len() * crate::layout::DEVICE_BYTES_PER_ENTRY) as u64
    }

    fn scratch_bytes(&self) -> u64 {
        0
    }

    fn open_like(&self, slots: usize) -> Result<EmuDevice, DeviceError> {
        Ok(EmuDevice::new(slots))
    }

    fn set_lists(&mut self, list_off: &[u32], list_slots: &[u32]) -> Result<(), DeviceError> {
        self.list_off = list_off.to_vec();
        self.list_slots = list_slots.to_vec();
        Ok(())
    }

    fn submit_top_k_lists(
        &mut self,
        tenant: u32,
        queries: &[SketchBytes],
        items: &ListItems,
        k: usize,
        nprobe: usize,
        now_s: u32,
    ) -> Result<(), DeviceError> {
        let nq = queries.len();
        if self.list_off.is_empty()
            || items
                .list
                .iter()
                .any(|&l| l as usize + 1 >= self.list_off.len())
        {
            return Err(DeviceError::Driver(
                "no inverted lists for this launch".to_owned(),
            ));
        }
        let words = pack_queries(queries);
        let n = nq * nprobe * k;
        let mut partials = Partials {
            s: vec![0; n],
            k: vec![0; n],
            slot: vec![0; n],
        };
        self.topk_scan_lists(items, &words, nprobe, tenant, now_s, k, &mut partials);
        self.answer = self.topk_merge(nprobe, nq, k, &partials);
        Ok(())
    }

    fn index_bytes(&self) -> u64 {
        ((self.list_off.len() + self.list_slots.len()) * 4) as u64
    }

    fn describe(&self) -> String {
        format!(
            "CPU emulation of kernels/store.cu ({} slots)",
            self.keys.len()
        )
    }
}
