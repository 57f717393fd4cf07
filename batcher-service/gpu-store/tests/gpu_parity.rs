//! Parity on a real GPU: the parity suite and the IVF check over the CUDA kernels.
//!
//! It needs the `cuda` feature and a CUDA device, so it is `#[ignore]`d: `cargo test`
//! reports it as ignored on a CPU machine, never as passed. On a GPU machine run it with
//! `cargo test -p cohort-gpu-store --features cuda -- --ignored` (or the `gpu-check`
//! binary through `scripts/gpu-check.sh`); there a missing feature or device fails it.

#[test]
#[ignore = "needs a CUDA device and the `cuda` feature (cargo test -p cohort-gpu-store --features cuda -- --ignored)"]
fn cuda_kernels_match_the_cpu_store() {
    #[cfg(not(feature = "cuda"))]
    panic!("built without the `cuda` feature: cargo test -p cohort-gpu-store --features cuda -- --ignored");
    #[cfg(feature = "cuda")]
    {
        use cohort_batcher_core::store::{CpuStoreConfig, Store};
        use cohort_gpu_store::{cuda, parity};
        let devices = cuda::probe().unwrap_or_else(|e| panic!("no CUDA driver or device: {e}"));
        eprintln!("running on {devices} CUDA device(s)");
        let mut make = |cfg: CpuStoreConfig| -> Box<dyn Store> {
            Box::new(cuda::open(cfg).unwrap_or_else(|e| panic!("the GPU store opens: {e}")))
        };
        let passed = parity::run_all(&mut make).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(passed.len(), parity::cases().len());
        let mut open = |cfg: CpuStoreConfig| {
            cuda::open(cfg).unwrap_or_else(|e| panic!("the GPU store opens: {e}"))
        };
        let line = parity::check_ivf(&mut open).unwrap_or_else(|e| panic!("{e}"));
        eprintln!("{line}");
    }
}
