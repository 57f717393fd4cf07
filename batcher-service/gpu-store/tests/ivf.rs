//! The approximate IVF path on the CPU: its emulated kernels (centroid ranking by the exact
//! scan, `topk_scan_lists`, `topk_merge`) equal the host computation over the same lists on
//! one and three devices (`parity::check_ivf`), and its recall@8 against the exact scan is
//! measured on clustered data (40,000 sketches around 500 centres, nlist 512), printed for
//! nprobe 1 and 4 and asserted ≥ 0.95 at nprobe 4. `cargo test -p cohort-gpu-store --test
//! ivf -- --nocapture` prints the numbers.

use cohort_batcher_core::store::cpu::Capacity;
use cohort_batcher_core::store::{CpuStoreConfig, SketchBytes, Store};
use cohort_gpu_store::bench::{recall, Workload};
use cohort_gpu_store::emu::EmuDevice;
use cohort_gpu_store::{parity, GpuStore};
use std::time::Instant;

fn emulated(devices: usize) -> impl FnMut(CpuStoreConfig) -> GpuStore<EmuDevice> {
    move |cfg| {
        GpuStore::new(cfg, devices, |_, slots| Ok(EmuDevice::new(slots)))
            .expect("the emulation opens")
    }
}

#[test]
fn emulated_ivf_matches_the_host_lists_on_one_device() {
    let line = parity::check_ivf(&mut emulated(1)).unwrap_or_else(|e| panic!("{e}"));
    println!("{line}");
}

#[test]
fn emulated_ivf_matches_the_host_lists_over_three_devices() {
    let line = parity::check_ivf(&mut emulated(3)).unwrap_or_else(|e| panic!("{e}"));
    println!("{line}");
}

#[test]
fn ivf_without_an_index_is_the_exact_scan() {
    let store = emulated(1)(CpuStoreConfig::default());
    let q: SketchBytes = [3; 32];
    assert!(store.top_k_ivf(0, &[q], 8, 4, 0)[0].is_empty());
    let built = store.build_ivf(16, 3, 1).expect("builds");
    assert_eq!(built.nlist, 0, "an empty store has no centroids");
    assert!(store.top_k_ivf_host(0, &[q], 8, 4, 0).is_none());
    let meta = cohort_batcher_core::store::EntryMeta {
        tenant: 0,
        cohort: 1,
        replica: 0,
        expires_at_s: 10,
    };
    store.upsert(5, &[1; 32], meta, 0);
    assert_eq!(
        store.top_k_ivf(0, &[q], 8, 4, 0),
        store.top_k_batch(0, &[q], 8, 0)
    );
    assert!(store.top_k_ivf(0, &[q], 0, 4, 0)[0].is_empty());
}

#[test]
fn ivf_recall_at_8_on_clustered_data() {
    const ENTRIES: usize = 40_000;
    let store = emulated(1)(CpuStoreConfig {
        capacity: Capacity::Entries(ENTRIES),
        shards: 16,
    });
    let mut work = Workload::with_centres(2026, 500);
    work.fill(&[&store], ENTRIES);
    let queries: Vec<SketchBytes> = (0..256).map(|_| work.sketch()).collect();
    let started = Instant::now();
    let built = store.build_ivf(512, 6, 7).expect("builds");
    let build_s = started.elapsed().as_secs_f64();
    assert_eq!(built.nlist, 512);
    let exact = store.top_k_batch(0, &queries, 8, 1);
    println!(
        "ivf: {} entries, nlist {}, k-means sample {}, largest list {}, index {} device B \
         ({:.2} B/entry beyond the 48), built in {build_s:.1} s",
        built.entries,
        built.nlist,
        built.sample,
        built.largest_list,
        built.index_bytes,
        built.index_bytes as f64 / built.entries as f64
    );
    let mut at = Vec::new();
    for nprobe in [1, 4] {
        let got = store.top_k_ivf(0, &queries, 8, nprobe, 1);
        let r = recall(&got, &exact);
        let scanned = store.ivf_scanned_fraction(&queries, nprobe).expect("index");
        println!(
            "ivf recall@8 vs the exact scan: nprobe {nprobe}: {r:.4} ({} queries, {:.2}% of the entries scanned)",
            queries.len(),
            100.0 * scanned
        );
        at.push(r);
    }
    assert_eq!(store.errors().0, 0);
    assert!(at[1] >= 0.95, "recall@8 at nprobe 4 is {:.4}", at[1]);
    assert!(at[1] >= at[0]);
}
