//! Every fuzz target on stable Rust, in the ordinary test suite: the committed seeds
//! (`fuzz/corpus/<target>/`) and every crash a fuzzer ever found (`fuzz/regressions/<target>/`)
//! are replayed, then the seeded mutator runs for `COHORT_FUZZ_SECONDS` (default 4) per
//! target and prints its executions. A failing input is written to
//! `target/fuzz-failures/<target>/` so it can be added to the regressions.

use cohort_fuzz_targets::mutate::{parse_dict, run};
use cohort_fuzz_targets::target;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The files of `dir`, sorted by name (none when it does not exist).
fn inputs(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let bytes = std::fs::read(&path).unwrap();
            (path, bytes)
        })
        .collect()
}

fn save_failure(name: &str, input: &[u8]) -> PathBuf {
    let dir = fuzz_dir().join("../target/fuzz-failures").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let hash = input.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    });
    let path = dir.join(format!("{hash:016x}"));
    std::fs::write(&path, input).unwrap();
    path
}

fn fuzz(name: &str) {
    let target = target(name).unwrap();
    let seeds = inputs(&fuzz_dir().join("corpus").join(name));
    assert!(!seeds.is_empty(), "no seeds for {name}");
    let regressions = inputs(&fuzz_dir().join("regressions").join(name));
    for (path, bytes) in seeds.iter().chain(&regressions) {
        if catch_unwind(AssertUnwindSafe(|| (target.run)(bytes))).is_err() {
            panic!("{name}: {} fails", path.display());
        }
    }
    let dict_text = std::fs::read_to_string(fuzz_dir().join("fuzz.dict")).unwrap();
    let dict = parse_dict(&dict_text).unwrap();
    let seconds: f64 = std::env::var("COHORT_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4.0);
    let pool: Vec<Vec<u8>> = seeds
        .iter()
        .chain(&regressions)
        .map(|(_, b)| b.clone())
        .collect();
    let seed = name
        .bytes()
        .fold(0xc0_4017u64, |h, b| h.rotate_left(5) ^ u64::from(b));
    match run(
        target,
        &pool,
        &dict,
        seed,
        Duration::from_secs_f64(seconds),
        100,
    ) {
        Ok(stats) => println!(
            "fuzz {name}: {} seeds + {} regressions replayed, {} mutated executions in {:.1} s, 0 failures",
            seeds.len(),
            regressions.len(),
            stats.executions,
            stats.elapsed.as_secs_f64()
        ),
        Err(input) => {
            let path = save_failure(name, &input);
            let shown = String::from_utf8_lossy(&input[..input.len().min(300)]);
            panic!(
                "{name}: a mutated input fails; saved to {} (add it to fuzz/regressions/{name}/): {shown:?}",
                path.display()
            );
        }
    }
}

#[test]
fn body() {
    fuzz("body");
}

#[test]
fn line() {
    fuzz("line");
}

#[test]
fn normalize() {
    fuzz("normalize");
}

#[test]
fn sketch() {
    fuzz("sketch");
}

#[test]
fn knobs() {
    fuzz("knobs");
}

#[test]
fn assign_reply() {
    fuzz("assign_reply");
}

#[test]
fn filter_config() {
    fuzz("filter_config");
}

#[test]
fn response_usage() {
    fuzz("response_usage");
}

#[test]
fn kv_events() {
    fuzz("kv_events");
}

#[test]
fn prompt_tokens() {
    fuzz("prompt_tokens");
}

#[test]
fn every_target_is_tested_and_has_seeds() {
    for target in cohort_fuzz_targets::TARGETS {
        let dir = fuzz_dir().join("corpus").join(target.name);
        assert!(!inputs(&dir).is_empty(), "{}: no seeds", dir.display());
        let bin = fuzz_dir()
            .join("fuzz_targets")
            .join(format!("{}.rs", target.name));
        assert!(bin.exists(), "{}: no libFuzzer bin", bin.display());
    }
    let committed: u64 = ["corpus", "regressions"]
        .iter()
        .flat_map(|d| {
            cohort_fuzz_targets::TARGETS
                .iter()
                .flat_map(move |t| inputs(&fuzz_dir().join(d).join(t.name)))
        })
        .map(|(_, b)| b.len() as u64)
        .sum();
    assert!(
        committed < 200 * 1024,
        "committed corpus is {committed} bytes"
    );
}
