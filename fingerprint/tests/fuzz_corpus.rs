//! Replays the fuzz seed corpus (fuzz/corpus) through the same calls as the fuzz targets,
//! on stable Rust, so every seed — and every crash the fuzzer ever found, saved there as a
//! regression seed — runs in the ordinary test suite.

use cohort_fingerprint::record::{fingerprint_line, LineDefaults};
use cohort_fingerprint::{fingerprint, Request};
use std::path::Path;

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    files
        .iter()
        .map(|path| std::fs::read(path).unwrap())
        .collect()
}

#[test]
fn body_seeds_return_on_every_path() {
    let seeds = seeds("fingerprint_body");
    assert!(seeds.len() >= 10);
    let mut fingerprinted = 0;
    for seed in &seeds {
        for path in [
            None,
            Some("/v1/chat/completions"),
            Some("/v1/completions"),
            Some("/v1/responses"),
            Some("/v1/messages"),
        ] {
            let mut request = Request::new(seed);
            request.path = path;
            fingerprinted += usize::from(fingerprint(&request).is_ok());
        }
    }
    assert!(fingerprinted > 0);
}

#[test]
fn line_seeds_return_records() {
    for seed in seeds("fingerprint_line") {
        let record = fingerprint_line(&seed, 1, &LineDefaults::default());
        assert!(record.bypass.is_some() || record.sketch.is_some());
    }
}
