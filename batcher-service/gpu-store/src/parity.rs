//! The parity suite: a store under test and a `CpuStore` built from the same configuration
//! get the same calls, and must give the same answers (ids, scores, order, metadata) and
//! hold the same entries. Run on the CPU over the emulated kernels (`tests/parity.rs`) and
//! on a GPU over the real ones (`tests/gpu_parity.rs`, `gpu-check`).

use crate::rng::Rng;
use cohort_batcher_core::store::cpu::Capacity;
use cohort_batcher_core::store::{CpuStore, CpuStoreConfig, EntryMeta, SketchBytes, Store};

fn config(entries: usize, shards: usize) -> CpuStoreConfig {
    CpuStoreConfig {
        capacity: Capacity::Entries(entries),
        shards,
    }
}

fn meta(tenant: u32, expires_at_s: u32, key: u64) -> EntryMeta {
    EntryMeta {
        tenant,
        cohort: (key % 97) as u32,
        replica: (key % 5) as u16,
        expires_at_s,
    }
}

/// Both stores of one case.
struct Pair {
    cpu: CpuStore,
    dut: Box<dyn Store>,
    case: &'static str,
}

impl Pair {
    fn upsert(&self, key: u64, s: &SketchBytes, m: EntryMeta, now: u32) {
        self.cpu.upsert(key, s, m, now);
        self.dut.upsert(key, s, m, now);
    }

    fn check_query(
        &self,
        tenant: u32,
        qs: &[SketchBytes],
        k: usize,
        now: u32,
    ) -> Result<(), String> {
        let want = self.cpu.top_k_batch(tenant, qs, k, now);
        let got = self.dut.top_k_batch(tenant, qs, k, now);
        if got.len() != want.len() {
            return Err(format!(
                "{}: {} answers for {} queries",
                self.case,
                got.len(),
                qs.len()
            ));
        }
        for (q, (g, w)) in got.iter().zip(&want).enumerate() {
            if g != w {
                let show = |h: &Vec<cohort_batcher_core::store::Hit>| {
                    h.iter()
                        .map(|h| (h.key, h.score))
                        .take(20)
                        .collect::<Vec<_>>()
                };
                return Err(format!(
                    "{}: tenant {tenant} k {k} now {now} query {q} of {}: got {:?}, want {:?}",
                    self.case,
                    qs.len(),
                    show(g),
                    show(w)
                ));
            }
        }
        Ok(())
    }

    fn check_state(&self) -> Result<(), String> {
        let (c, d) = (self.cpu.stats(), self.dut.stats());
        if (c.entries, c.evictions, c.expirations) != (d.entries, d.evictions, d.expirations) {
            return Err(format!(
                "{}: stats (entries, evictions, expirations) cpu {:?} vs {:?}",
                self.case,
                (c.entries, c.evictions, c.expirations),
                (d.entries, d.evictions, d.expirations)
            ));
        }
        Ok(())
    }
}

/// One case: its name and its run.
pub type Case = (
    &'static str,
    fn(&mut dyn FnMut(CpuStoreConfig) -> Box<dyn Store>) -> Result<(), String>,
);

/// Every case of the suite.
pub fn cases() -> Vec<Case> {
    vec![
        ("random", random),
        ("all-equal", all_equal),
        ("saturated", saturated),
        ("empty", empty),
        ("k-larger-than-store", k_larger),
        ("expiry", expiry),
        ("tenants", tenants),
        ("churn", churn),
        ("large-batch", large_batch),
    ]
}

/// Run every case; the names of the cases passed, or the first failure.
pub fn run_all(
    make: &mut dyn FnMut(CpuStoreConfig) -> Box<dyn Store>,
) -> Result<Vec<&'static str>, String> {
    let mut passed = Vec::new();
    for (name, case) in cases() {
        case(make)?;
        passed.push(name);
    }
    Ok(passed)
}

fn pair(
    make: &mut dyn FnMut(CpuStoreConfig) -> Box<dyn Store>,
    cfg: CpuStoreConfig,
    case: &'static str,
) -> Pair {
    Pair {
        cpu: CpuStore::new(cfg),
        dut: make(cfg),
        case,
    }
}

const KS: [usize; 6] = [1, 2, 8, 16, 17, 40];

fn random(make: &mut dyn FnMut(CpuStoreConfig) -> Box<dyn Store>) -> Result<(), String> {
    let p = pair(make, config(10_000, 16), "random");
    let mut r = Rng(1);
    for key in 0..5000u64 {
        let k = r.next_u64();
        p.upsert(k ^ key, &r.sketch(), meta((key % 3) as u32, 1000, k), 0);
    }
    for batch in [1, 7, 33, 70] {
        let qs: Vec<SketchBytes> = (0..batch).map(|_| r.sketch()).collect();
        for k in KS {
            p.check_query(1, &qs, k, 10)?;
        }
    }
    p.check_state()
}

fn all_equal(make: &mut dyn FnMut(CpuStoreConfig) -> Box<dyn Store>) -> Result<(), String> {
    let p = pair(make, config(4096, 8), "all-equal");
    let s = [7i8; 32];
    let mut r = Rng(2);
    for _ in 0..3000 {
        p.upsert(r.next_u64(), &s, meta(0, 100, 0), 0);
    }
    for k in KS {
        p.check_query(0, &[s, [0; 32], [-7; 32]], k, 1)?;
    }
    p.check_state()
}

fn saturated(make: &mut dyn FnMut(CpuStoreConfig) -> Box<dyn Store>) -> Result<(), String> {
    let p = pair(make, config(2000, 4), "saturated");
    let mut r = Rng(3);
    for key in 0..1500u64 {
        let s: SketchBytes = std::array::from_fn(|_| if r.below(2) == 0 { -128 } else { 127 });
        let s = if key % 10 == 0 { [-128; 32] } else { s };
        p.upsert(key * 7919, &s, meta(5, u32::MAX, key), 0);
    }
    let qs = [
        [-128i8; 32],
        [127; 32],
        std::array::from_fn(|i| if i % 2 == 0 { -128 } else { 127 }),
    ];
    for k in KS {
        p.check_query(5, &qs, k, u32::MAX - 1)?;
    }
    p.check_state()
}

fn empty(make: &mut dyn FnMut(CpuStoreConfig) -> Box<dyn Store>) -> Result<(), String> {
    let p = pair(make, config(1000, 16), "empty");
    for k in [0, 1, 8, 16, 40] {
        p.check_query(0, &[[1; 32], [-1; 32]], k, 0)?;
    }
    p.check_query(0, &[], 8, 0)?;
    let z = pair(make, config(0, 4), "zero-capacity");
    z.upsert(1, &[1; 32], meta(0, 10, 1), 0);
    z.check_query(0, &[[1; 32]], 8, 0)?;
    z.check_state()
}

fn k_larger(make: &mut dyn FnMut(CpuStoreConfig) -> Box<dyn Store>) -> Result<(), String> {
    let p = pair(make, config(100, 16), "k-larger-than-store");
    let mut r = Rng(4);
    for key in 0..5u64 {
        p.upsert(key, &r.sketch(), meta(2, 50, key), 0);
    }
    for k in [5, 6, 8, 16, 100] {
        p.check_query(2, &[r.sketch(), r.sketch()], k, 0)?;
    }
    p.check_state()
}

fn expiry(make: &mut dyn FnMut(CpuStoreConfig) -> Box<dyn Store>) -> Result<(), String> {
    let p = pair(make, config(3000, 8), "expiry");
    let mut r = Rng(5);
    for key in 0..2500u64 {
        p.upsert(key, &r.sketch(), meta(1, 100 + (key % 50) as u32, key), 0);
    }
    let qs: Vec<SketchBytes> = (0..9).map(|_| r.sketch()).collect();
    for now in [0, 99, 100, 120, 149, 150] {
        for k in [1, 8, 16] {
            p.check_query(1, &qs, k, now)?;
        }
    }
    let (a, b) = (p.cpu.expire(125), p.dut.expire(125));
    if a != b {
        return Err(format!("expiry: expire dropped {a} on cpu, {b} here"));
    }
    p.check_query(1, &qs, 8, 125)?;
    p.check_query(1, &qs, 8, 0)?;
    p.check_state()
}

fn tenants(make: &mut dyn FnMut(CpuStoreConfig) -> Box<dyn Store>) -> Result<(), String> {
    let p = pair(make, config(5000, 16), "tenants");
    let mut r = Rng(6);
    for key in 0..4000u64 {
        let tenant = (r.below(10) as u32).wrapping_mul(0x9e37_79b9);
        p.upsert(r.next_u64(), &r.sketch(), meta(tenant, 500, key), 0);
    }
    let qs: Vec<SketchBytes> = (0..40).map(|_| r.sketch()).collect();
    for t in 0..11u32 {
        p.check_query(t.wrapping_mul(0x9e37_79b9), &qs, 8, 1)?;
    }
    p.check_state()
}

fn churn(make: &mut dyn FnMut(CpuStoreConfig) -> Box<dyn Store>) -> Result<(), String> {
    let p = pair(make, config(500, 4), "churn");
    let mut r = Rng(7);
    let qs: Vec<SketchBytes> = (0..8).map(|_| r.sketch()).collect();
    for step in 0..6000u32 {
        let now = step / 20;
        let key = r.below(1500);
        match r.below(10) {
            0 => {
                if p.cpu.remove(key) != p.dut.remove(key) {
                    return Err(format!("churn: remove({key}) differs at step {step}"));
                }
            }
            1 | 2 => {
                if p.cpu.get(key, now) != p.dut.get(key, now) {
                    return Err(format!("churn: get({key}) differs at step {step}"));
                }
            }
            _ => {
                let ttl = 5 + r.below(60) as u32;
                p.upsert(
                    key,
                    &r.sketch(),
                    meta((key % 2) as u32, now + ttl, key),
                    now,
                );
            }
        }
        if step % 500 == 499 {
            if p.cpu.expire(now) != p.dut.expire(now) {
                return Err(format!("churn: expire differs at step {step}"));
            }
            p.check_state()?;
            for k in [1, 8, 16] {
                p.check_query(step / 500 % 2, &qs, k, now)?;
            }
        }
    }
    let mut a = p.cpu.entries();
    let mut b: Vec<_> = (0..1500)
        .filter_map(|key| p.dut.get(key, 0).map(|_| key))
        .collect();
    a.sort_by_key(|e| e.0);
    b.sort();
    let a: Vec<u64> = a
        .into_iter()
        .filter(|e| e.2.expires_at_s > 0)
        .map(|e| e.0)
        .collect();
    if a != b {
        return Err(format!(
            "churn: held keys differ ({} vs {})",
            a.len(),
            b.len()
        ));
    }
    p.check_state()
}

fn large_batch(make: &mut dyn FnMut(CpuStoreConfig) -> Box<dyn Store>) -> Result<(), String> {
    let p = pair(make, config(40_000, 16), "large-batch");
    let mut r = Rng(8);
    let centres: Vec<SketchBytes> = (0..16).map(|_| r.sketch()).collect();
    for key in 0..30_000u64 {
        let c = centres[r.below(16) as usize];
        let s: SketchBytes = std::array::from_fn(|i| c[i].saturating_add((r.below(9) as i8) - 4));
        p.upsert(r.next_u64(), &s, meta(0, 1000, key), 0);
    }
    let qs: Vec<SketchBytes> = (0..300)
        .map(|i| {
            if i % 3 == 0 {
                centres[i % 16]
            } else {
                r.sketch()
            }
        })
        .collect();
    for k in [1, 8, 16] {
        p.check_query(0, &qs, k, 0)?;
    }
    p.check_state()
}

/// The IVF path of a GPU store against the host computation over the same centroids and
/// lists (`GpuStore::top_k_ivf_host`): same ids, scores and order, with no device error on
/// the way (so the device path answered, not the fallback). Clustered entries of two
/// tenants with expiries; k 1, 8, 16 (device) and 20 (host path); nprobe 1, 3 and 16
/// (clamped to nlist); removes and inserts after the build (stale lists); and with every
/// list probed, the exact answer of the CPU store. Returns a summary line.
pub fn check_ivf<B: crate::Backend>(
    make: &mut dyn FnMut(CpuStoreConfig) -> crate::GpuStore<B>,
) -> Result<String, String> {
    let cfg = config(4096, 4);
    let store = make(cfg);
    let cpu = CpuStore::new(cfg);
    let mut work = crate::bench::Workload::with_centres(77, 40);
    let mut keys = Vec::new();
    let mut r = Rng(78);
    for i in 0..3000u64 {
        let key = r.next_u64() >> r.below(8);
        let s = work.sketch();
        let m = meta((i % 2) as u32, 20 + r.below(100) as u32, key);
        store.upsert(key, &s, m, 0);
        cpu.upsert(key, &s, m, 0);
        keys.push(key);
    }
    let queries: Vec<SketchBytes> = (0..70).map(|_| work.sketch()).collect();
    let (errors0, _) = store.errors();
    let compare = |what: &str, tenant: u32, k: usize, nprobe: usize, now: u32| {
        let got = store.top_k_ivf(tenant, &queries, k, nprobe, now);
        let want = store
            .top_k_ivf_host(tenant, &queries, k, nprobe, now)
            .ok_or_else(|| format!("ivf {what}: no index"))?;
        if got != want {
            let q = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
            return Err(format!(
                "ivf {what}: tenant {tenant} k {k} nprobe {nprobe} now {now}: query {q}: got {:?}, want {:?}",
                got[q], want[q]
            ));
        }
        Ok(())
    };
    // Every list probed: the exact answer.
    let small = store.build_ivf(8, 4, 1).map_err(|e| e.to_string())?;
    if small.nlist != 8 || small.entries != 3000 {
        return Err(format!("ivf: built {small:?}"));
    }
    for k in [1, 8, 16] {
        let got = store.top_k_ivf(0, &queries, k, 16, 50);
        if got != cpu.top_k_batch(0, &queries, k, 50) {
            return Err(format!(
                "ivf: all 8 lists probed, k {k}: not the exact answer"
            ));
        }
        compare("all lists", 1, k, 8, 50)?;
    }
    let built = store.build_ivf(24, 5, 2).map_err(|e| e.to_string())?;
    for (tenant, k, nprobe, now) in [
        (0, 8, 1, 0),
        (0, 8, 3, 60),
        (1, 1, 3, 60),
        (1, 16, 16, 30),
        (0, 20, 3, 60),
    ] {
        compare("clustered", tenant, k, nprobe, now)?;
    }
    for (i, &key) in keys.iter().enumerate().step_by(7) {
        store.remove(key);
        if i % 2 == 0 {
            store.upsert(key ^ 1, &work.sketch(), meta(0, 200, key ^ 1), 0);
        }
    }
    compare("after churn", 0, 8, 3, 10)?;
    compare("after churn", 1, 16, 5, 10)?;
    let (errors, last) = store.errors();
    if errors != errors0 {
        return Err(format!("ivf: device errors: {last:?}"));
    }
    Ok(format!(
        "ivf parity: PASS (nlist {}, {} entries, largest list {}, index {} device B)",
        built.nlist, built.entries, built.largest_list, built.index_bytes
    ))
}
