// A warp simulator for kernels/store.cu: compiles the CUDA source as C++ (g++ -std=c++17)
// and runs each block with one std::thread per CUDA thread, the warp collectives
// (__syncwarp, __any_sync, __ballot_sync, __shfl*_sync, mma.sync) through a per-warp
// barrier. Lanes run independently, as under Volta's independent thread scheduling, so a
// collective that not every lane reaches (warp divergence) or shared memory read before the
// writing lane's __syncwarp shows up here: a barrier that waits 20 s aborts with a message.
// Used by batcher-service/gpu-store/tests/warp_sim.rs; no GPU, no CUDA toolkit.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#define COHORT_WARP_SIM 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(x)
// Blocks run one at a time, so a function-static array is the block's shared memory.
#define __shared__ static

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

struct Warp {
    std::mutex m;
    std::condition_variable cv;
    unsigned arrived = 0;
    unsigned long long generation = 0;
    unsigned long long vals[32];
    unsigned a[32][4];
    unsigned b[32][2];

    void barrier() {
        std::unique_lock<std::mutex> lock(m);
        unsigned long long gen = generation;
        if (++arrived == 32) {
            arrived = 0;
            ++generation;
            cv.notify_all();
            return;
        }
        if (!cv.wait_for(lock, std::chrono::seconds(20), [&] { return generation != gen; })) {
            std::fprintf(stderr, "warp_sim: a warp collective was not reached by every lane "
                                 "(warp divergence)\n");
            std::abort();
        }
    }
};

static thread_local dim3 threadIdx;
static thread_local dim3 blockIdx;
static thread_local Warp* cur_warp;
static dim3 blockDim;
static dim3 gridDim;

static inline unsigned sim_lane() { return threadIdx.x & 31; }

static inline void __syncwarp(unsigned = 0xffffffffu) { cur_warp->barrier(); }

template <class T>
static inline unsigned long long sim_bits(T v) {
    unsigned long long b = 0;
    std::memcpy(&b, &v, sizeof(T));
    return b;
}
template <class T>
static inline T sim_from(unsigned long long b) {
    T v;
    std::memcpy(&v, &b, sizeof(T));
    return v;
}

// Every lane publishes a value; returns all 32 (the caller's copy).
static inline void sim_exchange(unsigned long long mine, unsigned long long out[32]) {
    Warp* w = cur_warp;
    w->vals[sim_lane()] = mine;
    w->barrier();
    std::memcpy(out, w->vals, sizeof(w->vals));
    w->barrier();
}

static inline unsigned __ballot_sync(unsigned, bool p) {
    unsigned long long all[32];
    sim_exchange(p ? 1 : 0, all);
    unsigned m = 0;
    for (unsigned i = 0; i < 32; ++i) m |= (all[i] ? 1u : 0u) << i;
    return m;
}
static inline bool __any_sync(unsigned mask, bool p) { return __ballot_sync(mask, p) != 0; }

template <class T>
static inline T __shfl_sync(unsigned, T v, unsigned src) {
    unsigned long long all[32];
    sim_exchange(sim_bits(v), all);
    return sim_from<T>(all[src & 31]);
}
template <class T>
static inline T __shfl_up_sync(unsigned, T v, unsigned d) {
    unsigned long long all[32];
    sim_exchange(sim_bits(v), all);
    unsigned lane = sim_lane();
    return lane >= d ? sim_from<T>(all[lane - d]) : v;
}

static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline unsigned atomicAdd(unsigned* p, unsigned v) {
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}

static inline int sim_dot4(unsigned a, unsigned b) {
    int s = 0;
    for (int i = 0; i < 4; ++i)
        s += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return s;
}

// mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 as the PTX ISA lays out its fragments.
template <class F>
static inline void sim_mma_s8(int c[4], F a, unsigned b0, unsigned b1) {
    Warp* w = cur_warp;
    unsigned lane = sim_lane();
    w->a[lane][0] = a.x;
    w->a[lane][1] = a.y;
    w->a[lane][2] = a.z;
    w->a[lane][3] = a.w;
    w->b[lane][0] = b0;
    w->b[lane][1] = b1;
    w->barrier();
    unsigned g = lane >> 2, t = lane & 3;
    for (unsigned r = 0; r < 4; ++r) {
        unsigned row = g + 8 * (r >> 1), col = 2 * t + (r & 1);
        int s = 0;
        for (unsigned word = 0; word < 8; ++word)
            s += sim_dot4(w->a[(row & 7) * 4 + (word & 3)][(row >> 3) + 2 * (word >> 2)],
                          w->b[col * 4 + (word & 3)][word >> 2]);
        c[r] += s;
    }
    w->barrier();
}

// Run `kernel` over the grid, one block after another.
static inline void sim_launch(dim3 grid, dim3 block, const std::function<void()>& kernel) {
    gridDim = grid;
    blockDim = block;
    for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
            std::vector<Warp> warps((block.x + 31) / 32);
            std::vector<std::thread> threads;
            for (unsigned t = 0; t < block.x; ++t)
                threads.emplace_back([&, t] {
                    threadIdx.x = t;
                    blockIdx.x = bx;
                    blockIdx.y = by;
                    cur_warp = &warps[t / 32];
                    kernel();
                });
            for (auto& th : threads) th.join();
        }
}
