//! Benchmark of the fingerprint store: top-8 queries per second on one core at batch 1 and
//! batch 64, p99 latency, and bytes per entry (from `stats()` and, as a cross-check, from a
//! counting global allocator), against a naive `lru::LruCache` layout as the baseline.
//!
//! ```sh
//! cargo run --release -p cohort-batcher-core --example store_bench -- --entries 1000000
//! ```
//! Options: `--entries N` (1000000), `--seconds S` per measurement (3), `--no-lru`.

// The counting allocator implements the unsafe `GlobalAlloc` trait by forwarding to
// `System` (commented below).
#![allow(unsafe_code)]

use cohort_batcher_core::store::{
    dot, Capacity, CpuStore, CpuStoreConfig, EntryMeta, Hit, SketchBytes, Store, TopK,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Counts the bytes currently allocated by the process.
struct Counting;

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to `System` unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
        System.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        ALLOCATED.fetch_sub(layout.size(), Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATED.fetch_sub(layout.size(), Ordering::Relaxed);
        ALLOCATED.fetch_add(new_size, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const K: usize = 8;
const TENANT: u32 = 1;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// A sketch near one of 256 intent centres, scaled so the largest magnitude is 127
    /// (the shape the fingerprint core produces).
    fn sketch(&mut self, centres: &[[i32; 32]]) -> SketchBytes {
        let c = &centres[(self.next() % centres.len() as u64) as usize];
        let mut v = [0i32; 32];
        for (x, &m) in v.iter_mut().zip(c) {
            *x = m + (self.next() % 61) as i32 - 30;
        }
        let max = v.iter().map(|x| x.abs()).max().unwrap_or(1).max(1);
        std::array::from_fn(|i| (v[i] * 127 / max) as i8)
    }
}

struct Row {
    layout: &'static str,
    batch: usize,
    qps: f64,
    p99: Duration,
    stats_bpe: Option<f64>,
    alloc_bpe: f64,
}

fn measure(seconds: f64, batch: usize, mut call: impl FnMut() -> usize) -> (f64, Duration) {
    let mut lat = Vec::new();
    let mut queries = 0usize;
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < seconds || lat.len() < 5 {
        let t = Instant::now();
        queries += call();
        lat.push(t.elapsed());
    }
    let total = start.elapsed().as_secs_f64();
    lat.sort();
    let p99 = lat[(lat.len() * 99 / 100).min(lat.len() - 1)];
    let _ = batch;
    (queries as f64 / total, p99)
}

fn main() {
    let mut entries = 1_000_000usize;
    let mut seconds = 3.0f64;
    let mut lru_baseline = true;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--entries" => {
                entries = args
                    .get(i + 1)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(entries);
                i += 1;
            }
            "--seconds" => {
                seconds = args
                    .get(i + 1)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(seconds);
                i += 1;
            }
            "--no-lru" => lru_baseline = false,
            other => {
                eprintln!("unknown option {other}");
                std::process::exit(2);
            }
        }
        i += 1;
    }
    let avx2 = {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx2")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    };

    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let centres: Vec<[i32; 32]> = (0..256)
        .map(|_| std::array::from_fn(|_| (rng.next() % 201) as i32 - 100))
        .collect();
    let queries: Vec<SketchBytes> = (0..1024).map(|_| rng.sketch(&centres)).collect();
    let meta = |key: u64| EntryMeta {
        tenant: TENANT,
        cohort: (key % 1000) as u32,
        replica: (key % 8) as u16,
        expires_at_s: 3600,
    };
    let mut rows = Vec::new();

    // Cohort's CpuStore; capacity with 1/16 headroom so no shard evicts at `entries`.
    let before = ALLOCATED.load(Ordering::Relaxed);
    let store = CpuStore::new(CpuStoreConfig {
        capacity: Capacity::Entries(entries + entries / 16),
        shards: 16,
    });
    let t = Instant::now();
    for key in 0..entries as u64 {
        let s = rng.sketch(&centres);
        store.upsert(key.wrapping_mul(0x2545_f491_4f6c_dd1d), &s, meta(key), 0);
    }
    let insert_s = t.elapsed().as_secs_f64();
    let alloc_bytes = ALLOCATED.load(Ordering::Relaxed) - before;
    let stats = store.stats();
    let held = stats.entries.max(1) as f64;
    eprintln!(
        "cpu store: {} entries inserted in {:.2} s ({:.0}/s), stats {:?}",
        stats.entries,
        insert_s,
        entries as f64 / insert_s,
        stats
    );
    // Cross-check one answer against a plain sort.
    let all = store.entries();
    let want = cohort_batcher_core::store::reference_top_k(
        all.iter().map(|(k, s, m)| (*k, s, *m)),
        TENANT,
        &queries[0],
        K,
        1,
    );
    assert_eq!(store.top_k(TENANT, &queries[0], K, 1), want);
    drop(all);

    for batch in [1usize, 64] {
        let mut next = 0usize;
        let (qps, p99) = measure(seconds, batch, || {
            let qs: Vec<SketchBytes> = (0..batch)
                .map(|i| queries[(next + i) % queries.len()])
                .collect();
            next += batch;
            let out = store.top_k_batch(TENANT, &qs, K, 1);
            black_box(&out);
            batch
        });
        rows.push(Row {
            layout: "CpuStore",
            batch,
            qps,
            p99,
            stats_bpe: Some(stats.bytes as f64 / held),
            alloc_bpe: alloc_bytes as f64 / held,
        });
    }
    drop(store);

    if lru_baseline {
        let before = ALLOCATED.load(Ordering::Relaxed);
        let cap = NonZeroUsize::new(entries.max(1)).unwrap_or(NonZeroUsize::MIN);
        let mut cache: lru::LruCache<u64, (SketchBytes, EntryMeta)> = lru::LruCache::new(cap);
        for key in 0..entries as u64 {
            let s = rng.sketch(&centres);
            cache.put(key.wrapping_mul(0x2545_f491_4f6c_dd1d), (s, meta(key)));
        }
        let alloc_bytes = ALLOCATED.load(Ordering::Relaxed) - before;
        let mut next = 0usize;
        let (qps, p99) = measure(seconds, 1, || {
            let q = &queries[next % queries.len()];
            next += 1;
            let mut top = TopK::new(K);
            for (&key, (s, m)) in cache.iter() {
                if m.tenant == TENANT && 1 < m.expires_at_s {
                    top.offer(Hit {
                        key,
                        score: dot(s, q),
                        meta: *m,
                    });
                }
            }
            black_box(top.into_sorted());
            1
        });
        rows.push(Row {
            layout: "lru::LruCache (naive scan)",
            batch: 1,
            qps,
            p99,
            stats_bpe: None,
            alloc_bpe: alloc_bytes as f64 / entries.max(1) as f64,
        });
    }

    println!(
        "\nstore_bench: {} entries, one tenant, top-{K}, single thread, AVX2 {}\n",
        entries,
        if avx2 { "on" } else { "off (portable kernel)" }
    );
    println!("| layout | entries | batch | queries/s (1 core) | p99 latency per call | bytes/entry (stats) | bytes/entry (allocator) |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {} | {:.0} | {:.2} ms | {} | {:.1} |",
            r.layout,
            entries,
            r.batch,
            r.qps,
            r.p99.as_secs_f64() * 1e3,
            r.stats_bpe.map_or("—".to_string(), |b| format!("{b:.1}")),
            r.alloc_bpe
        );
    }
}
