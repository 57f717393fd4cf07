// The GPU fingerprint store's kernels (cohort-gpu-store). Compiled at run time by NVRTC
// (cudarc) when a GpuStore opens, for the device's own architecture; no CUDA toolkit is
// needed to build the Rust side. docs/GPU-STORE.md describes the layout and the choices.
//
// Device layout (one store shard = one device):
//   tiles    16 entries a tile, 512 bytes: the int8 sketch words in the register order of
//            mma.m16n8k32's A operand, so lane L of a warp loads its whole fragment of a
//            tile with one 16-byte load: tiles[tile * 32 + L] = {a0, a1, a2, a3} with
//            a_r = word (t + 4 * (r >> 1)) of row (g + 8 * (r & 1)), g = L >> 2, t = L & 3.
//   keys     u64 per slot (ties are broken by the smaller key, as the CPU store does)
//   tenants  u32 per slot
//   expires  u32 per slot (0 = empty slot: never live)
//   => 48 device bytes an entry.
//
// Kernels:
//   store_scatter  batched inserts / updates / clears (one thread a written slot)
//   topk_scan      exact top-k of each (query, part of the store), int8 tensor cores
//   topk_merge     per query, the top-k of its parts' lists (one warp a query)
//   topk_scan_lists  the IVF scan: top-k over the probed inverted lists only (slot lists
//                  into the same tiles, gathered), feeding topk_merge with parts = nprobe
// Batched cohort assignment is topk_scan + topk_merge with k = 1 over the centroid store.
//
// The Rust file src/emu.rs executes these kernels lane by lane on the CPU (the parity
// tests), and tests/warp_sim.rs compiles this very file with g++ over kernels/warp_sim.h.
// Keep the three in step.

#define INT_MIN_ (-2147483647 - 1)
#define INT_MAX_ 2147483647

#define ROWS 16            // entries a tile (M of the mma)
#define WARP_Q 32          // queries a warp holds (4 mma N-tiles of 8)
#define WARPS 4            // warps a block of topk_scan
#define KMAX 16            // largest k on the device (larger k: host path)
#define QUEUE (ROWS * 8)   // candidates one mma can yield
#define NO_SLOT 0xffffffffu
#define FULL 0xffffffffu

typedef unsigned int u32;
typedef unsigned long long u64;
typedef int i32;

// One lane's A fragment of a tile (16 bytes, one load). Not CUDA's uint4, so the file
// needs no header under NVRTC or g++.
struct alignas(16) Frag {
    u32 x, y, z, w;
};

// Score-descending, key-ascending order: true when (s, key) comes before (s2, key2).
__device__ __forceinline__ bool better(i32 s, u64 key, i32 s2, u64 key2) {
    return s > s2 || (s == s2 && key < key2);
}

// Index (in u32 words) inside a tile of word `word` of entry `row`.
__device__ __forceinline__ u32 frag_word(u32 row, u32 word) {
    u32 lane = (row & 7) * 4 + (word & 3);
    u32 reg = (row >> 3) + 2 * (word >> 2);
    return lane * 4 + reg;
}

// c += A (16 x 32, s8, this lane's fragment a) x B (32 x 8, s8, fragment b0 b1), s32.
__device__ __forceinline__ void mma_s8(i32 c[4], Frag a, u32 b0, u32 b1) {
#ifdef COHORT_WARP_SIM
    sim_mma_s8(c, a, b0, b1);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
#endif
}

// Writes n slots: sketch words (8 a slot, dims 4w..4w+3 little-endian in word w), key,
// tenant and expiry. The host sends each slot at most once per launch.
extern "C" __global__ void store_scatter(const u32* __restrict__ slots,
                                         const u32* __restrict__ words,
                                         const u64* __restrict__ wkeys,
                                         const u32* __restrict__ wtenants,
                                         const u32* __restrict__ wexpires, u32 n,
                                         u32* __restrict__ tiles, u64* __restrict__ keys,
                                         u32* __restrict__ tenants, u32* __restrict__ expires) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u32 slot = slots[i];
    u32 base = (slot / ROWS) * (ROWS * 8);
    u32 row = slot % ROWS;
    for (u32 w = 0; w < 8; ++w) tiles[base + frag_word(row, w)] = words[i * 8 + w];
    keys[slot] = wkeys[i];
    tenants[slot] = wtenants[i];
    expires[slot] = wexpires[i];
}

// Insert (s, key, slot) into the sorted list column `lane` of one warp (best first, k long).
__device__ __forceinline__ void list_insert(i32 (*ls)[32], u64 (*lk)[32], u32 (*lslot)[32],
                                            u32 lane, u32 k, i32 s, u64 key, u32 slot) {
    if (!better(s, key, ls[k - 1][lane], lk[k - 1][lane])) return;
    u32 i = k - 1;
    while (i > 0 && better(s, key, ls[i - 1][lane], lk[i - 1][lane])) {
        ls[i][lane] = ls[i - 1][lane];
        lk[i][lane] = lk[i - 1][lane];
        lslot[i][lane] = lslot[i - 1][lane];
        --i;
    }
    ls[i][lane] = s;
    lk[i][lane] = key;
    lslot[i][lane] = slot;
}

// Empty lists (column `lane`) and an empty queue, at the start of a warp's scan.
__device__ __forceinline__ void lists_init(i32 (*ls)[32], u64 (*lk)[32], u32 (*lslot)[32],
                                           u32* qn, u32 lane) {
    for (u32 i = 0; i < KMAX; ++i) {
        ls[i][lane] = INT_MIN_;
        lk[i][lane] = ~0ull;
        lslot[i][lane] = NO_SLOT;
    }
    if (lane == 0) *qn = 0;
}

// The initial floors of this lane's 8 accumulator columns: INT_MIN for the warp's nv real
// queries, INT_MAX for padding (which never asks for the slow path).
__device__ __forceinline__ void floors_init(i32 (&fl)[4][2], u32 nv, u32 t) {
    for (u32 j = 0; j < 4; ++j)
        for (u32 h = 0; h < 2; ++h) fl[j][h] = (8 * j + 2 * t + h < nv) ? INT_MIN_ : INT_MAX_;
}

// Lane `lane`'s list (k places, best first) to out_*[base ..].
__device__ __forceinline__ void lists_write(i32 (*ls)[32], u64 (*lk)[32], u32 (*lslot)[32],
                                            u32 lane, u32 k, u32 base, i32* __restrict__ out_s,
                                            u64* __restrict__ out_k,
                                            u32* __restrict__ out_slot) {
    for (u32 i = 0; i < k; ++i) {
        out_s[base + i] = ls[i][lane];
        out_k[base + i] = lk[i][lane];
        out_slot[base + i] = lslot[i][lane];
    }
}

// One tile (fragment a; rows g and g + 8 of this lane are entries e0 and e1, live or not)
// against the warp's 32 queries, of which the first nv are real: the mma per 8 queries, the
// register-floor fast path, the candidate queue and the list inserts. Shared by topk_scan
// and topk_scan_lists. b: this lane's B fragments; fl: its floors (registers).
__device__ __forceinline__ void warp_tile(const Frag a, bool live0, bool live1, u32 e0, u32 e1,
                                          const u32 (&b)[4][2], i32 (&fl)[4][2], u32 nv,
                                          u32 lane, u32 t, u32 k, const u64* __restrict__ keys,
                                          i32 (*ls)[32], u64 (*lk)[32], u32 (*lslot)[32],
                                          u32* qe, i32* qs, u32* qq, u32* qn) {
    for (u32 j = 0; j < 4; ++j) {
        if (8 * j >= nv) break;  // whole warp
        i32 c[4] = {0, 0, 0, 0};
        mma_s8(c, a, b[j][0], b[j][1]);
        // Fast path: no live score reaches its floor in the whole warp (the common case
        // once the lists are full).
        bool maybe = false;
        for (u32 r = 0; r < 4; ++r) maybe |= ((r < 2) ? live0 : live1) && c[r] >= fl[j][r & 1];
        if (!__any_sync(FULL, maybe)) continue;
        for (u32 r = 0; r < 4; ++r) {
            const u32 q = 8 * j + 2 * t + (r & 1);
            const u32 e = (r < 2) ? e0 : e1;
            const bool live = (r < 2) ? live0 : live1;
            if (!live || q >= nv) continue;
            const i32 floor_s = ls[k - 1][q];
            if (c[r] < floor_s) continue;
            if (c[r] == floor_s && keys[e] >= lk[k - 1][q]) continue;
            const u32 at = atomicAdd(qn, 1u);
            qe[at] = e;
            qs[at] = c[r];
            qq[at] = q;
        }
        __syncwarp();
        const u32 n = *qn;
        if (n != 0) {  // the same n in every lane
            for (u32 p = 0; p < n; ++p) {
                if (qq[p] != lane) continue;
                const u32 e = qe[p];
                list_insert(ls, lk, lslot, lane, k, qs[p], keys[e], e);
            }
            __syncwarp();
            if (lane == 0) *qn = 0;
            for (u32 jj = 0; jj < 4; ++jj)
                for (u32 h = 0; h < 2; ++h)
                    if (8 * jj + 2 * t + h < nv) fl[jj][h] = ls[k - 1][8 * jj + 2 * t + h];
        }
        __syncwarp();
    }
}

// grid (parts, ceil(nq / (WARP_Q * WARPS))), block WARPS * 32. Warp w of block (p, y) holds
// queries qb .. qb + 31 (qb = (y * WARPS + w) * WARP_Q; the query array is padded with zeros
// to a multiple of WARP_Q) and scans the tiles of part p; lane L keeps query qb + L's list.
// Output: for query q and part p, k (score, key, slot) at ((q * parts) + p) * k, best first,
// slot NO_SLOT where the part had fewer live entries of the tenant.
extern "C" __global__ void __launch_bounds__(WARPS * 32)
    topk_scan(const Frag* __restrict__ tiles, const u64* __restrict__ keys,
              const u32* __restrict__ tenants, const u32* __restrict__ expires, u32 n_tiles,
              u32 part_tiles, const u32* __restrict__ queries, u32 nq, u32 tenant, u32 now,
              u32 k, i32* __restrict__ out_s, u64* __restrict__ out_k,
              u32* __restrict__ out_slot) {
    __shared__ i32 ls[WARPS][KMAX][32];
    __shared__ u64 lk[WARPS][KMAX][32];
    __shared__ u32 lslot[WARPS][KMAX][32];
    __shared__ u32 qe[WARPS][QUEUE];
    __shared__ i32 qs[WARPS][QUEUE];
    __shared__ u32 qq[WARPS][QUEUE];
    __shared__ u32 qn[WARPS];

    const u32 lane = threadIdx.x & 31;
    const u32 warp = threadIdx.x >> 5;
    const u32 g = lane >> 2;
    const u32 t = lane & 3;
    const u32 qb = (blockIdx.y * WARPS + warp) * WARP_Q;
    if (qb >= nq) return;  // whole warp
    const u32 nv = (nq - qb < WARP_Q) ? nq - qb : WARP_Q;  // valid queries of the warp
    const u32 parts = gridDim.x;
    const u32 part = blockIdx.x;

    lists_init(ls[warp], lk[warp], lslot[warp], &qn[warp], lane);
    u32 b[4][2];
    for (u32 j = 0; j < 4; ++j) {
        b[j][0] = queries[(qb + 8 * j + g) * 8 + t];
        b[j][1] = queries[(qb + 8 * j + g) * 8 + 4 + t];
    }
    // The floors (k-th best score) of this lane's 8 accumulator columns, kept in registers:
    // the lists change only in a drain, after which they are re-read.
    i32 fl[4][2];
    floors_init(fl, nv, t);
    __syncwarp();

    const u32 t0 = part * part_tiles;
    const u32 t1 = (t0 + part_tiles < n_tiles) ? t0 + part_tiles : n_tiles;
    for (u32 tile = t0; tile < t1; ++tile) {
        const u32 e0 = tile * ROWS + g;
        const u32 e1 = e0 + 8;
        const bool live0 = tenants[e0] == tenant && now < expires[e0];
        const bool live1 = tenants[e1] == tenant && now < expires[e1];
        if (!__any_sync(FULL, live0 || live1)) continue;
        const Frag a = tiles[tile * 32 + lane];
        warp_tile(a, live0, live1, e0, e1, b, fl, nv, lane, t, k, keys, ls[warp], lk[warp],
                  lslot[warp], qe[warp], qs[warp], qq[warp], &qn[warp]);
    }
    if (qb + lane < nq) {
        lists_write(ls[warp], lk[warp], lslot[warp], lane, k, ((qb + lane) * parts + part) * k,
                    out_s, out_k, out_slot);
    }
}

// Word `word` of the sketch in slot `slot` (tile order, as store_scatter writes it).
__device__ __forceinline__ u32 slot_word(const u32* __restrict__ tiles, u32 slot, u32 word) {
    return tiles[(slot / ROWS) * (ROWS * 8) + frag_word(slot % ROWS, word)];
}

// The IVF scan: only the entries of some inverted lists, for the queries that probe them.
// The lists are slot numbers into the same tiles (no second copy of any sketch):
// list_slots[list_off[l] .. list_off[l + 1]) holds list l, padded with NO_SLOT to whole tiles
// of 16. Work item i (one warp) is list item_list[i] with up to 32 of the queries probing it:
// item_q[i * 32 + L] (query index, NO_SLOT past the last one; the real ones come first) and
// item_p[i * 32 + L] (the probe's rank for that query). Lane L gathers its A fragment
// (rows g, g + 8; words t, t + 4) from the two slots and runs the same warp_tile as
// topk_scan. grid (ceil(n_items / WARPS)), block WARPS * 32. Output: query q's list for its
// probe p at ((q * nprobe) + p) * k, as topk_scan's parts, for topk_merge with
// parts = nprobe; every (q, p) is in exactly one item.
extern "C" __global__ void __launch_bounds__(WARPS * 32)
    topk_scan_lists(const u32* __restrict__ tiles, const u64* __restrict__ keys,
                    const u32* __restrict__ tenants, const u32* __restrict__ expires,
                    const u32* __restrict__ list_off, const u32* __restrict__ list_slots,
                    const u32* __restrict__ item_list, const u32* __restrict__ item_q,
                    const u32* __restrict__ item_p, u32 n_items,
                    const u32* __restrict__ queries, u32 nprobe, u32 tenant, u32 now, u32 k,
                    i32* __restrict__ out_s, u64* __restrict__ out_k,
                    u32* __restrict__ out_slot) {
    __shared__ i32 ls[WARPS][KMAX][32];
    __shared__ u64 lk[WARPS][KMAX][32];
    __shared__ u32 lslot[WARPS][KMAX][32];
    __shared__ u32 qe[WARPS][QUEUE];
    __shared__ i32 qs[WARPS][QUEUE];
    __shared__ u32 qq[WARPS][QUEUE];
    __shared__ u32 qn[WARPS];

    const u32 lane = threadIdx.x & 31;
    const u32 warp = threadIdx.x >> 5;
    const u32 g = lane >> 2;
    const u32 t = lane & 3;
    const u32 item = blockIdx.x * WARPS + warp;
    if (item >= n_items) return;  // whole warp
    const u32 my_q = item_q[item * 32 + lane];
    const u32 nv = __popc(__ballot_sync(FULL, my_q != NO_SLOT));

    lists_init(ls[warp], lk[warp], lslot[warp], &qn[warp], lane);
    u32 b[4][2];
    for (u32 j = 0; j < 4; ++j) {
        const u32 q = item_q[item * 32 + 8 * j + g];
        b[j][0] = (q != NO_SLOT) ? queries[q * 8 + t] : 0u;
        b[j][1] = (q != NO_SLOT) ? queries[q * 8 + 4 + t] : 0u;
    }
    i32 fl[4][2];
    floors_init(fl, nv, t);
    __syncwarp();

    const u32 list = item_list[item];
    for (u32 at = list_off[list]; at < list_off[list + 1]; at += ROWS) {
        const u32 e0 = list_slots[at + g];
        const u32 e1 = list_slots[at + g + 8];
        const bool live0 = e0 != NO_SLOT && tenants[e0] == tenant && now < expires[e0];
        const bool live1 = e1 != NO_SLOT && tenants[e1] == tenant && now < expires[e1];
        if (!__any_sync(FULL, live0 || live1)) continue;
        Frag a;
        a.x = (e0 != NO_SLOT) ? slot_word(tiles, e0, t) : 0u;
        a.y = (e1 != NO_SLOT) ? slot_word(tiles, e1, t) : 0u;
        a.z = (e0 != NO_SLOT) ? slot_word(tiles, e0, t + 4) : 0u;
        a.w = (e1 != NO_SLOT) ? slot_word(tiles, e1, t + 4) : 0u;
        warp_tile(a, live0, live1, e0, e1, b, fl, nv, lane, t, k, keys, ls[warp], lk[warp],
                  lslot[warp], qe[warp], qs[warp], qq[warp], &qn[warp]);
    }
    if (my_q != NO_SLOT) {
        lists_write(ls[warp], lk[warp], lslot[warp], lane, k,
                    (my_q * nprobe + item_p[item * 32 + lane]) * k, out_s, out_k, out_slot);
    }
}

// One warp a query (blockDim.x a multiple of 32): the best k of the query's parts * k
// candidates. Lane i < k holds the i-th best so far; a candidate better than the k-th is
// inserted by shifting the lanes after its place up by one.
extern "C" __global__ void topk_merge(const i32* __restrict__ in_s, const u64* __restrict__ in_k,
                                      const u32* __restrict__ in_slot, u32 parts, u32 nq, u32 k,
                                      i32* __restrict__ out_s, u64* __restrict__ out_k,
                                      u32* __restrict__ out_slot) {
    const u32 lane = threadIdx.x & 31;
    const u32 q = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (q >= nq) return;  // whole warp
    i32 ms = INT_MIN_;
    u64 mk = ~0ull;
    u32 mslot = NO_SLOT;
    i32 ts = INT_MIN_;
    u64 tk = ~0ull;
    const u32 total = parts * k;
    const u32 base = q * total;
    for (u32 c0 = 0; c0 < total; c0 += 32) {
        const u32 i = c0 + lane;
        i32 cs = INT_MIN_;
        u64 ck = ~0ull;
        u32 cslot = NO_SLOT;
        if (i < total) {
            cs = in_s[base + i];
            ck = in_k[base + i];
            cslot = in_slot[base + i];
        }
        u32 m = __ballot_sync(FULL, cslot != NO_SLOT && better(cs, ck, ts, tk));
        while (m != 0) {
            const u32 src = __ffs((int)m) - 1;
            m &= m - 1;
            const i32 ns = __shfl_sync(FULL, cs, src);
            const u64 nk = __shfl_sync(FULL, ck, src);
            const u32 nslot = __shfl_sync(FULL, cslot, src);
            if (!better(ns, nk, ts, tk)) continue;  // the same in every lane
            const u32 pos = __popc(__ballot_sync(FULL, lane < k && !better(ns, nk, ms, mk)));
            const i32 us = __shfl_up_sync(FULL, ms, 1);
            const u64 uk = __shfl_up_sync(FULL, mk, 1);
            const u32 uslot = __shfl_up_sync(FULL, mslot, 1);
            if (lane > pos) {
                ms = us;
                mk = uk;
                mslot = uslot;
            } else if (lane == pos) {
                ms = ns;
                mk = nk;
                mslot = nslot;
            }
            ts = __shfl_sync(FULL, ms, k - 1);
            tk = __shfl_sync(FULL, mk, k - 1);
        }
    }
    if (lane < k) {
        out_s[q * k + lane] = ms;
        out_k[q * k + lane] = mk;
        out_slot[q * k + lane] = mslot;
    }
}
