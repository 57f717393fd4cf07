//! Loading the Mooncake trace format: one JSON object per line with `timestamp` (ms),
//! `input_length` and `output_length` (tokens) and `hash_ids` (one id per 512-token block;
//! equal ids mean equal prefixes up to and including that block).
//!
//! Ids are spread with [`crate::policy::mix64`] into 64-bit block hashes, so the routers
//! see what they see live (uniform chained hashes), and shard keys and tie rotation are
//! not skewed by the ids' small sequential values.

use std::path::Path;

use serde::Deserialize;

use cohort_batcher_core::policy::mix64;

/// Tokens per block in Mooncake traces.
pub const MOONCAKE_BLOCK_TOKENS: u32 = 512;

/// One request of a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceRequest {
    /// Arrival, ms from the start of the trace.
    pub timestamp_ms: u64,
    /// Prompt tokens.
    pub input_length: u32,
    /// Output tokens.
    pub output_length: u32,
    /// Chained block hashes (mixed ids), first block first.
    pub blocks: Vec<u64>,
}

#[derive(Deserialize)]
struct Line {
    timestamp: u64,
    input_length: u32,
    output_length: u32,
    hash_ids: Vec<u64>,
}

/// Why a trace could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The path given.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A line is not a trace record.
    #[error("line {line}: {source}")]
    Parse {
        /// 1-based line number.
        line: usize,
        /// The cause.
        source: serde_json::Error,
    },
}

/// Parses JSONL trace text (blank lines skipped), sorted by timestamp (stable).
pub fn parse_trace(text: &str) -> Result<Vec<TraceRequest>, TraceError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let l: Line = serde_json::from_str(line).map_err(|source| TraceError::Parse {
            line: i + 1,
            source,
        })?;
        out.push(TraceRequest {
            timestamp_ms: l.timestamp,
            input_length: l.input_length,
            output_length: l.output_length,
            blocks: l.hash_ids.into_iter().map(mix64).collect(),
        });
    }
    out.sort_by_key(|r| r.timestamp_ms);
    Ok(out)
}

/// Reads and parses a JSONL trace file.
pub fn load_trace(path: &Path) -> Result<Vec<TraceRequest>, TraceError> {
    let text = std::fs::read_to_string(path).map_err(|source| TraceError::Io {
        path: path.display().to_string(),
        source,
    })?;
    parse_trace(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_reports_bad_lines() {
        let t = "{\"timestamp\": 5, \"input_length\": 600, \"output_length\": 3, \"hash_ids\": [0, 1]}\n\n\
                 {\"timestamp\": 1, \"input_length\": 10, \"output_length\": 2, \"hash_ids\": [0]}\n";
        let r = parse_trace(t).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].timestamp_ms, 1);
        assert_eq!(r[1].blocks[0], r[0].blocks[0]);
        assert!(matches!(
            parse_trace("{}\n"),
            Err(TraceError::Parse { line: 1, .. })
        ));
    }
}
