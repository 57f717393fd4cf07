//! Parity on a real GPU: the parity suite and the IVF check over the CUDA kernels. Without the `cuda` feature
//! or without a CUDA driver and device, the test says so on stderr ("skipped: ...") and
//! returns; `cargo test -- --nocapture` shows the line. On a GPU machine the same suite runs
//! through `scripts/gpu-check.sh`.

#[cfg(feature = "cuda")]
#[test]
fn cuda_kernels_match_the_cpu_store() {
    use cohort_batcher_core::store::{CpuStoreConfig, Store};
    use cohort_gpu_store::{cuda, parity};
    match cuda::probe() {
        Err(e) => {
            eprintln!("skipped: no CUDA driver or device ({e})");
            return;
        }
        Ok(n) => eprintln!("running on {n} CUDA device(s)"),
    }
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

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_kernels_match_the_cpu_store() {
    eprintln!("skipped: built without the `cuda` feature (cargo test --features cuda)");
}
