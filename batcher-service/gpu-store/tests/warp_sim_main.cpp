// Driver of tests/warp_sim.rs: kernels/store.cu compiled as C++ over kernels/warp_sim.h.
// Reads the writes, the queries and the launch plan on stdin, runs store_scatter,
// topk_scan and topk_merge, prints each query's hits ("n s key slot ...") on stdout. Then,
// if the input goes on with inverted lists and work items, runs topk_scan_lists and
// topk_merge (parts = nprobe) and prints "--" and each query's hits again.
#include "../../../kernels/warp_sim.h"
#include "../../../kernels/store.cu"
#include <iostream>

int main() {
    unsigned slots, nw;
    std::cin >> slots >> nw;
    std::vector<u32> tiles(slots * 8), tenants(slots), expires(slots);
    std::vector<u64> keys(slots);
    std::vector<u32> wslots(nw), words(nw * 8), wten(nw), wexp(nw);
    std::vector<u64> wkeys(nw);
    for (unsigned i = 0; i < nw; ++i) {
        std::cin >> wslots[i] >> wkeys[i] >> wten[i] >> wexp[i];
        for (unsigned w = 0; w < 8; ++w) std::cin >> words[i * 8 + w];
    }
    unsigned nq, k, tenant, now, parts, part_tiles, qblocks;
    std::cin >> nq >> k >> tenant >> now >> parts >> part_tiles >> qblocks;
    unsigned padded = (nq + 31) / 32 * 32;
    std::vector<u32> q(padded * 8, 0);
    for (unsigned i = 0; i < nq * 8; ++i) std::cin >> q[i];
    if (!std::cin) {
        std::fprintf(stderr, "warp_sim_main: bad input\n");
        return 2;
    }
    sim_launch(dim3{(nw + 63) / 64, 1, 1}, dim3{64, 1, 1}, [&] {
        store_scatter(wslots.data(), words.data(), wkeys.data(), wten.data(), wexp.data(), nw,
                      tiles.data(), keys.data(), tenants.data(), expires.data());
    });
    std::vector<i32> ps(nq * parts * k);
    std::vector<u64> pk(nq * parts * k);
    std::vector<u32> pslot(nq * parts * k);
    sim_launch(dim3{parts, qblocks, 1}, dim3{WARPS * 32, 1, 1}, [&] {
        topk_scan(reinterpret_cast<const Frag*>(tiles.data()), keys.data(), tenants.data(),
                  expires.data(), slots / ROWS, part_tiles, q.data(), nq, tenant, now, k,
                  ps.data(), pk.data(), pslot.data());
    });
    std::vector<i32> os(nq * k);
    std::vector<u64> ok(nq * k);
    std::vector<u32> oslot(nq * k);
    sim_launch(dim3{(nq + 1) / 2, 1, 1}, dim3{64, 1, 1}, [&] {
        topk_merge(ps.data(), pk.data(), pslot.data(), parts, nq, k, os.data(), ok.data(),
                   oslot.data());
    });
    auto print = [&] {
        for (unsigned i = 0; i < nq; ++i) {
            unsigned n = 0;
            for (unsigned j = 0; j < k; ++j) n += oslot[i * k + j] != NO_SLOT;
            std::cout << n;
            for (unsigned j = 0; j < k; ++j)
                if (oslot[i * k + j] != NO_SLOT)
                    std::cout << ' ' << os[i * k + j] << ' ' << ok[i * k + j] << ' '
                              << oslot[i * k + j];
            std::cout << '\n';
        }
    };
    print();
    unsigned nlists, nls;
    if (!(std::cin >> nlists >> nls)) return 0;  // no IVF section
    std::vector<u32> loff(nlists + 1), lslots(nls);
    for (auto& x : loff) std::cin >> x;
    for (auto& x : lslots) std::cin >> x;
    unsigned nprobe, n_items;
    std::cin >> nprobe >> n_items;
    std::vector<u32> il(n_items), iq(n_items * 32), ip(n_items * 32);
    for (auto& x : il) std::cin >> x;
    for (auto& x : iq) std::cin >> x;
    for (auto& x : ip) std::cin >> x;
    if (!std::cin) {
        std::fprintf(stderr, "warp_sim_main: bad IVF input\n");
        return 2;
    }
    std::vector<i32> vs(nq * nprobe * k);
    std::vector<u64> vk(nq * nprobe * k);
    std::vector<u32> vslot(nq * nprobe * k);
    sim_launch(dim3{(n_items + WARPS - 1) / WARPS, 1, 1}, dim3{WARPS * 32, 1, 1}, [&] {
        topk_scan_lists(tiles.data(), keys.data(), tenants.data(), expires.data(), loff.data(),
                        lslots.data(), il.data(), iq.data(), ip.data(), n_items, q.data(),
                        nprobe, tenant, now, k, vs.data(), vk.data(), vslot.data());
    });
    sim_launch(dim3{(nq + 1) / 2, 1, 1}, dim3{64, 1, 1}, [&] {
        topk_merge(vs.data(), vk.data(), vslot.data(), nprobe, nq, k, os.data(), ok.data(),
                   oslot.data());
    });
    std::cout << "--\n";
    print();
    return 0;
}
