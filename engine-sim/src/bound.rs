//! `cohort engine-sim bound`: the prefix-cache hit ratio of a request stream on ONE LRU
//! cache of `kv_blocks` blocks, i.e. the best any router could do if all replicas' caches
//! were pooled (the harness passes blocks = replicas × per-replica blocks). Every request
//! is looked up, then its blocks inserted, in arrival order, with the same tokenizer,
//! renderer and cache code as the replicas (and the same "at least one token computed" cap).

use crate::cache::{block_hashes, PrefixCache};
use crate::render::{parse_any, RequestError};
use crate::tokenizer::tokenize;
use serde::Serialize;
use std::io::BufRead;
use thiserror::Error;

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct BoundReport {
    pub requests: u64,
    pub prompt_tokens: u64,
    pub hit_tokens: u64,
    pub hit_ratio: f64,
}

#[derive(Debug, Error)]
pub enum BoundError {
    #[error("reading input: {0}")]
    Io(#[from] std::io::Error),
    #[error("line {line}: {error}")]
    Request { line: usize, error: RequestError },
}

/// Reads one request body per line (blank lines skipped) and replays them on one cache.
pub fn bound(
    input: impl BufRead,
    kv_blocks: usize,
    block_tokens: usize,
) -> Result<BoundReport, BoundError> {
    let mut cache = PrefixCache::new(kv_blocks, block_tokens);
    let mut report = BoundReport::default();
    for (i, line) in input.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let request = parse_any(line.as_bytes())
            .map_err(|error| BoundError::Request { line: i + 1, error })?;
        let tokens = tokenize(&request.prompt);
        let hashes = block_hashes(&tokens, block_tokens, request.cache_salt.as_deref());
        report.requests += 1;
        report.prompt_tokens += tokens.len() as u64;
        report.hit_tokens += cache.cached_tokens(&hashes, tokens.len()) as u64;
        cache.insert(&hashes);
    }
    if report.prompt_tokens > 0 {
        report.hit_ratio = report.hit_tokens as f64 / report.prompt_tokens as f64;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(prompt: &str) -> String {
        serde_json::json!({"prompt": prompt}).to_string()
    }

    #[test]
    fn repeats_hit_and_a_small_cache_forgets() {
        // 64-byte prompts: 16 tokens, 4 blocks of 4; a repeat hits 3 blocks (12 tokens).
        let a = "a".repeat(60) + "0000";
        let b = "b".repeat(60) + "1111";
        let input = [line(&a), line(&b), String::new(), line(&a)].join("\n");
        let big = bound(input.as_bytes(), 100, 4).unwrap();
        assert_eq!(big.requests, 3);
        assert_eq!(big.prompt_tokens, 48);
        assert_eq!(big.hit_tokens, 12);
        assert!((big.hit_ratio - 0.25).abs() < 1e-12);
        // 4 blocks only: b evicts a's blocks entirely.
        let small = bound(input.as_bytes(), 4, 4).unwrap();
        assert_eq!(small.hit_tokens, 0);
    }

    #[test]
    fn chat_and_completions_lines_mix_and_bad_lines_name_their_number() {
        let input = format!(
            "{}\n{}\n",
            r#"{"messages":[{"role":"user","content":"hello hello hello hello"}]}"#,
            r#"{"messages":[{"role":"user","content":"hello hello hello hello!"}]}"#
        );
        let r = bound(input.as_bytes(), 100, 2).unwrap();
        assert_eq!(r.requests, 2);
        assert!(r.hit_tokens > 0);
        match bound("{\"prompt\":\"x\"}\nnot json\n".as_bytes(), 10, 2) {
            Err(BoundError::Request { line: 2, .. }) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(bound("".as_bytes(), 10, 2).unwrap(), BoundReport::default());
    }
}
