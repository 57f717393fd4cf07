//! `gpu-check`: on a GPU machine, the parity suite on the real kernels, then the benchmark
//! table (GPU store next to the CPU store, same data, same run). Built here with
//! `cargo build --release --locked -p cohort-gpu-store --features cuda --bin gpu-check` and
//! run by `scripts/gpu-check.sh`. Exit status: 0 all parity cases passed, 1 a case failed,
//! 2 no usable GPU.

use cohort_batcher_core::store::cpu::Capacity;
use cohort_batcher_core::store::{CpuStore, CpuStoreConfig, SketchBytes, Store};
use cohort_gpu_store::bench::{measure, measure_calls, peak_fraction, peak_qps, recall, Workload};
use cohort_gpu_store::{cuda, parity};
use std::time::{Duration, Instant};

struct Args {
    sizes: Vec<usize>,
    batches: Vec<usize>,
    seconds: f64,
    cpu: bool,
    parity_only: bool,
    /// Run the parity suites (off with `--no-parity`, for a profiler's short run).
    parity: bool,
    /// Print the IVF rows (off with `--no-ivf`).
    ivf: bool,
}

fn list(v: &str) -> Vec<usize> {
    v.split(',').filter_map(|s| s.trim().parse().ok()).collect()
}

fn args() -> Args {
    let mut a = Args {
        sizes: vec![1_000_000, 5_000_000],
        batches: vec![1, 64, 4096],
        seconds: 3.0,
        cpu: true,
        parity_only: false,
        parity: true,
        ivf: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--sizes" => a.sizes = list(&it.next().unwrap_or_default()),
            "--batches" => a.batches = list(&it.next().unwrap_or_default()),
            "--seconds" => a.seconds = it.next().and_then(|s| s.parse().ok()).unwrap_or(3.0),
            "--no-cpu" => a.cpu = false,
            "--parity-only" => a.parity_only = true,
            "--no-parity" => a.parity = false,
            "--no-ivf" => a.ivf = false,
            other => {
                eprintln!("gpu-check: unknown flag {other} (--sizes, --batches, --seconds, --no-cpu, --parity-only, --no-parity, --no-ivf)");
                std::process::exit(2);
            }
        }
    }
    a
}

fn config(entries: usize) -> CpuStoreConfig {
    CpuStoreConfig {
        capacity: Capacity::Entries(entries),
        shards: 16,
    }
}

fn main() {
    let args = args();
    let devices = match cuda::probe() {
        Ok(n) => n,
        Err(e) => {
            println!("gpu-check: no usable GPU: {e}");
            std::process::exit(2);
        }
    };
    println!("gpu-check: {devices} CUDA device(s)");
    // The cohort_gpu_utilization gauge's source.
    match cohort_gpu_store::nvml::Nvml::open() {
        Ok(nvml) => println!("gpu-check: NVML utilisation {:?}", nvml.utilization()),
        Err(why) => println!("gpu-check: NVML FAIL {why}"),
    }
    let started = Instant::now();
    let mut make = |cfg: CpuStoreConfig| -> Box<dyn Store> {
        match cuda::open(cfg) {
            Ok(s) => Box::new(s),
            Err(e) => {
                println!("gpu-check: opening the GPU store failed: {e}");
                std::process::exit(2);
            }
        }
    };
    if args.parity {
        match parity::run_all(&mut make) {
            Ok(cases) => println!(
                "parity: PASS {} cases ({}) in {:.1} s",
                cases.len(),
                cases.join(", "),
                started.elapsed().as_secs_f64()
            ),
            Err(e) => {
                println!("parity: FAIL {e}");
                std::process::exit(1);
            }
        }
        let mut open_gpu = |cfg: CpuStoreConfig| match cuda::open(cfg) {
            Ok(s) => s,
            Err(e) => {
                println!("gpu-check: opening the GPU store failed: {e}");
                std::process::exit(2);
            }
        };
        match parity::check_ivf(&mut open_gpu) {
            Ok(line) => println!("{line}"),
            Err(e) => {
                println!("parity: FAIL {e}");
                std::process::exit(1);
            }
        }
    }
    if args.parity_only {
        return;
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let budget = Duration::from_secs_f64(args.seconds);
    println!(
        "\n| store | entries | batch | threads | calls | queries/s | p99 ms/call | device B/entry | fraction of int8 peak |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &n in &args.sizes {
        let gpu = match cuda::open(config(n)) {
            Ok(s) => s,
            Err(e) => {
                println!("gpu-check: opening a {n}-entry GPU store failed: {e}");
                std::process::exit(2);
            }
        };
        let cpu = CpuStore::new(config(n));
        let mut work = Workload::new(n as u64);
        let fill = Instant::now();
        if args.cpu {
            work.fill(&[&gpu, &cpu], n);
        } else {
            work.fill(&[&gpu], n);
        }
        if let Err(e) = gpu.flush() {
            println!("gpu-check: flush failed: {e}");
            std::process::exit(1);
        }
        eprintln!(
            "filled {n} entries in {:.1} s",
            fill.elapsed().as_secs_f64()
        );
        let queries: Vec<SketchBytes> = (0..16_384).map(|_| work.sketch()).collect();
        if args.cpu {
            let (g, c) = (
                gpu.top_k_batch(0, &queries[..512], 8, 1),
                cpu.top_k_batch(0, &queries[..512], 8, 1),
            );
            if g != c {
                println!("parity: FAIL at {n} entries: top-8 of 512 clustered queries differ from the CPU store");
                std::process::exit(1);
            }
            println!(
                "parity at {n} entries: PASS (512 queries, top-8, same ids, scores and order)"
            );
        }
        let (entry_bytes, _) = gpu.device_bytes();
        let per_entry = entry_bytes as f64 / gpu.stats().entries.max(1) as f64;
        for &batch in &args.batches {
            let m = measure(&gpu, &queries, batch, 8, 1, budget, 100_000);
            println!(
                "| gpu (exact) | {n} | {batch} | 1 | {} | {:.0} | {:.3} | {:.1} | {:.1}% |",
                m.calls,
                m.queries_per_s,
                m.p99_ms,
                per_entry,
                100.0 * m.queries_per_s / peak_qps(n)
            );
            if args.cpu {
                let m = measure(&cpu, &queries, batch, 8, threads, budget, 100_000);
                println!(
                    "| cpu | {n} | {batch} | {threads} | {} | {:.0} | {:.3} | — | {:.3}% |",
                    m.calls,
                    m.queries_per_s,
                    m.p99_ms,
                    100.0 * m.queries_per_s / peak_qps(n)
                );
            }
        }
        if args.ivf {
            ivf_rows(&gpu, &queries, n, &args, budget);
        }
        let (errors, last) = gpu.errors();
        if errors > 0 {
            println!("gpu-check: {errors} device errors (last: {last:?}); those queries were answered on the host");
            std::process::exit(1);
        }
    }
    println!(
        "IVF goal: ≥ 20 M queries/s at recall@8 ≥ 0.95 against the exact GPU scan, ≤ 64 device B/entry"
    );
    println!(
        "\nint8 peak taken as {:.0} TOPS (H200 dense); exact top-8 cap at 5 M entries: {:.2} M queries/s",
        cohort_gpu_store::bench::H200_INT8_PEAK_OPS / 1e12,
        peak_qps(5_000_000) / 1e6
    );
    println!(
        "gpu-check: done in {:.0} s",
        started.elapsed().as_secs_f64()
    );
}

/// The IVF rows of one size: build the index (nlist ≈ entries / 1,024), then per nprobe the
/// recall@8 of 2,048 queries against the exact GPU scan, the scanned fraction, and per
/// batch size queries/s, p99, and the fraction of the int8 peak for the work done
/// (centroids plus scanned entries).
fn ivf_rows<B: cohort_gpu_store::Backend>(
    gpu: &cohort_gpu_store::GpuStore<B>,
    queries: &[SketchBytes],
    n: usize,
    args: &Args,
    budget: Duration,
) {
    let nlist = (n / 1024).clamp(64, 8192);
    let built_at = Instant::now();
    let built = match gpu.build_ivf(nlist, 6, 1) {
        Ok(b) => b,
        Err(e) => {
            println!("gpu-check: building the IVF index failed: {e}");
            std::process::exit(1);
        }
    };
    let (entry_bytes, _) = gpu.device_bytes();
    let held = gpu.stats().entries.max(1) as f64;
    let per_entry = (entry_bytes + built.index_bytes) as f64 / held;
    println!(
        "\nIVF at {n} entries: nlist {}, k-means sample {}, largest list {}, index {:.1} MB ({:.2} B/entry; {per_entry:.1} device B/entry in all), built in {:.1} s",
        built.nlist,
        built.sample,
        built.largest_list,
        built.index_bytes as f64 / 1e6,
        built.index_bytes as f64 / held,
        built_at.elapsed().as_secs_f64()
    );
    let probe_qs = &queries[..2048];
    let exact = gpu.top_k_batch(0, probe_qs, 8, 1);
    println!("| store | entries | nprobe | batch | calls | queries/s | p99 ms/call | recall@8 | scanned | device B/entry | fraction of int8 peak (work done) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for nprobe in [1, 4] {
        let r = recall(&gpu.top_k_ivf(0, probe_qs, 8, nprobe, 1), &exact);
        let scanned = gpu.ivf_scanned_fraction(probe_qs, nprobe).unwrap_or(1.0);
        let scored = scanned * held + built.nlist as f64;
        for &batch in &args.batches {
            let call = |qs: &[SketchBytes]| {
                std::hint::black_box(gpu.top_k_ivf(0, qs, 8, nprobe, 1));
            };
            let m = measure_calls(&call, queries, batch, 1, budget, 100_000);
            println!(
                "| gpu (ivf) | {n} | {nprobe} | {batch} | {} | {:.0} | {:.3} | {r:.4} | {:.3}% | {per_entry:.1} | {:.2}% |",
                m.calls,
                m.queries_per_s,
                m.p99_ms,
                100.0 * scanned,
                100.0 * peak_fraction(m.queries_per_s, scored)
            );
        }
    }
}
