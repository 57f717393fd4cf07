//! The real `kernels/store.cu`, compiled as C++ by g++ over `kernels/warp_sim.h` (one thread
//! per CUDA thread, warp collectives through a barrier, `mma.sync` by its PTX fragment
//! layout), run on random, tied, multi-tenant and expiring entries over several parts and
//! two warps of queries: its answers must equal the reference top-k. The same run then
//! scans random inverted lists (`topk_scan_lists`, 3 probes a query, lists longer than one
//! tile, items of several warps) and must equal the reference top-k over the probed lists. This checks the CUDA
//! source itself (syntax, indexing, warp synchronisation) without a GPU. It needs g++
//! (`scripts/setup` installs it) and fails without it rather than pass without running.

use cohort_batcher_core::store::{reference_top_k, EntryMeta, SketchBytes};
use cohort_gpu_store::ivf::{pack_lists, plan_items};
use cohort_gpu_store::layout::{pack_words, plan_scan, ROWS};
use cohort_gpu_store::rng::Rng;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn build() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("warp_sim_main");
    let status = Command::new("g++")
        .args(["-std=c++17", "-O1", "-pthread", "-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(root.join("tests/warp_sim_main.cpp"))
        .status();
    match status {
        Ok(s) if s.success() => out,
        Ok(s) => panic!("g++ could not compile kernels/store.cu over the warp simulator: {s}"),
        Err(e) => panic!("g++ not found ({e}): scripts/setup installs it"),
    }
}

struct Entry {
    slot: u32,
    key: u64,
    sketch: SketchBytes,
    meta: EntryMeta,
}

fn run(
    bin: &PathBuf,
    entries: &[Entry],
    slots: usize,
    queries: &[SketchBytes],
    k: usize,
    tenant: u32,
    now: u32,
) {
    let plan = plan_scan(slots / ROWS, queries.len(), 1);
    assert!(plan.parts > 1, "the case should cover several parts");
    let mut input = format!("{slots} {}\n", entries.len());
    for e in entries {
        input += &format!(
            "{} {} {} {}",
            e.slot, e.key, e.meta.tenant, e.meta.expires_at_s
        );
        for w in pack_words(&e.sketch) {
            input += &format!(" {w}");
        }
        input.push('\n');
    }
    input += &format!(
        "{} {k} {tenant} {now} {} {} {}\n",
        queries.len(),
        plan.parts,
        plan.part_tiles,
        plan.query_blocks
    );
    for q in queries {
        for w in pack_words(q) {
            input += &format!("{w} ");
        }
        input.push('\n');
    }
    // Inverted lists: every slot (empty ones too) in one of LISTS random lists; each query
    // probes NPROBE distinct lists.
    const LISTS: usize = 10;
    const NPROBE: usize = 3;
    let mut r = Rng(slots as u64 ^ k as u64);
    let mut members = vec![Vec::new(); LISTS];
    for slot in 0..slots as u32 {
        members[r.below(LISTS as u64) as usize].push(slot);
    }
    let probes: Vec<Vec<u32>> = queries
        .iter()
        .map(|_| {
            let mut p: Vec<u32> = Vec::new();
            while p.len() < NPROBE {
                let l = r.below(LISTS as u64) as u32;
                if !p.contains(&l) {
                    p.push(l);
                }
            }
            p
        })
        .collect();
    let (off, lslots) = pack_lists(&members);
    let lens: Vec<usize> = members.iter().map(Vec::len).collect();
    let items = plan_items(&probes, &lens);
    let join = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(" ");
    input += &format!(
        "{LISTS} {}\n{}\n{}\n",
        lslots.len(),
        join(&off),
        join(&lslots)
    );
    input += &format!(
        "{NPROBE} {}\n{}\n{}\n{}\n",
        items.list.len(),
        join(&items.list),
        join(&items.q),
        join(&items.p)
    );
    let mut child = Command::new(bin)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the simulator starts");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("input written");
    let started = Instant::now();
    let out = child.wait_with_output().expect("the simulator finishes");
    assert!(started.elapsed() < Duration::from_secs(300));
    assert!(out.status.success(), "simulator failed: {}", out.status);
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2 * queries.len() + 1);
    assert_eq!(lines[queries.len()], "--");
    check(
        entries,
        queries,
        &lines[..queries.len()],
        k,
        tenant,
        now,
        |_, _| true,
    );
    check(
        entries,
        queries,
        &lines[queries.len() + 1..],
        k,
        tenant,
        now,
        |q, slot| {
            probes[q]
                .iter()
                .any(|&l| members[l as usize].contains(&slot))
        },
    );
}

/// Each output line against `reference_top_k` over the entries that `scanned(query, slot)`.
fn check(
    entries: &[Entry],
    queries: &[SketchBytes],
    lines: &[&str],
    k: usize,
    tenant: u32,
    now: u32,
    scanned: impl Fn(usize, u32) -> bool,
) {
    for (qi, (q, line)) in queries.iter().zip(lines).enumerate() {
        let want = reference_top_k(
            entries
                .iter()
                .filter(|e| scanned(qi, e.slot))
                .map(|e| (e.key, &e.sketch, e.meta)),
            tenant,
            q,
            k,
            now,
        );
        let nums: Vec<i128> = line
            .split(' ')
            .map(|s| s.parse::<i128>().expect("number"))
            .collect();
        let n = nums[0] as usize;
        let got: Vec<(i32, u64, u32)> = (0..n)
            .map(|i| {
                (
                    nums[1 + 3 * i] as i32,
                    nums[2 + 3 * i] as u64,
                    nums[3 + 3 * i] as u32,
                )
            })
            .collect();
        let want: Vec<(i32, u64, u32)> = want
            .iter()
            .map(|h| {
                let slot = entries.iter().find(|e| e.key == h.key).expect("held").slot;
                (h.score, h.key, slot)
            })
            .collect();
        assert_eq!(got, want, "k {k} tenant {tenant} now {now} query {qi}");
    }
}

#[test]
fn cuda_source_under_warp_simulation_matches_reference() {
    let bin = build();
    let slots = ROWS * 200;
    let mut r = Rng(11);
    let tied = r.sketch();
    let mut entries = Vec::new();
    for slot in 0..slots as u32 {
        if r.below(5) == 0 {
            continue; // an empty slot
        }
        let sketch = match r.below(6) {
            0 => tied,
            1 => [127; 32],
            2 => [-128; 32],
            _ => r.sketch(),
        };
        entries.push(Entry {
            slot,
            key: r.next_u64() >> r.below(40),
            sketch,
            meta: EntryMeta {
                tenant: (r.below(2)) as u32,
                cohort: 0,
                replica: 0,
                expires_at_s: 50 + r.below(100) as u32,
            },
        });
    }
    let mut queries: Vec<SketchBytes> = (0..40).map(|_| r.sketch()).collect();
    queries[0] = tied;
    queries[1] = [-128; 32];
    queries[2] = [0; 32];
    run(&bin, &entries, slots, &queries, 8, 0, 60);
    run(&bin, &entries, slots, &queries[..9], 16, 1, 0);
    run(&bin, &entries, slots, &queries[..33], 1, 1, 149);
}
