//! Parity on the CPU: the whole `GpuStore` (host mirror, scatter, scan, merge, across one
//! and three devices) over the lane-by-lane emulation of `kernels/store.cu`, against the
//! CPU store, on every case of the suite (random, all-equal, saturated, empty, k larger
//! than the store, expiry, tenants, churn with eviction, a batch of 300).

use cohort_batcher_core::store::{CpuStoreConfig, Store};
use cohort_gpu_store::emu::EmuDevice;
use cohort_gpu_store::{parity, GpuStore};

fn emulated(devices: usize) -> impl FnMut(CpuStoreConfig) -> Box<dyn Store> {
    move |cfg| {
        Box::new(
            GpuStore::new(cfg, devices, |_, slots| Ok(EmuDevice::new(slots)))
                .expect("the emulation opens"),
        )
    }
}

#[test]
fn emulated_kernels_match_the_cpu_store_on_one_device() {
    let passed = parity::run_all(&mut emulated(1)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(passed.len(), parity::cases().len());
}

#[test]
fn emulated_kernels_match_the_cpu_store_over_three_devices() {
    let passed = parity::run_all(&mut emulated(3)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(passed.len(), parity::cases().len());
}

#[test]
fn assign_batch_is_the_nearest_entry() {
    let store = GpuStore::new(CpuStoreConfig::default(), 1, |_, slots| {
        Ok(EmuDevice::new(slots))
    })
    .expect("opens");
    let meta = |cohort| cohort_batcher_core::store::EntryMeta {
        tenant: 3,
        cohort,
        replica: 0,
        expires_at_s: 10,
    };
    store.upsert(1, &[10; 32], meta(1), 0);
    store.upsert(2, &[-10; 32], meta(2), 0);
    let got = store.assign_batch(3, &[[1; 32], [-1; 32]], 0);
    let cohorts: Vec<Option<u32>> = got.iter().map(|h| h.map(|h| h.meta.cohort)).collect();
    assert_eq!(cohorts, vec![Some(1), Some(2)]);
    assert_eq!(store.assign_batch(4, &[[1; 32]], 0), vec![None]);
}

#[test]
fn device_bytes_per_entry_are_48() {
    let store = GpuStore::new(CpuStoreConfig::default(), 1, |_, slots| {
        Ok(EmuDevice::new(slots))
    })
    .expect("opens");
    let (entries, _) = store.device_bytes();
    assert_eq!(entries, 48 * (1 << 20));
}
