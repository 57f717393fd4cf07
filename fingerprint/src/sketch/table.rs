//! The distilled sketch table: its binary format and the embedded copy.
//!
//! `scripts/distill-sketch` writes `fingerprint/data/sketch_v2.bin`; the crate embeds it
//! with `include_bytes!` (no file I/O at run time, wasm included) and parses it once per
//! process or wasm VM. Format, little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `CSKT` |
//! | 4 | format version (1) |
//! | 4 | dimensions (32) |
//! | 4 | vocabulary tokens `V` (the teacher's WordPiece vocabulary, ids in order) |
//! | 4 | extra rows `E` (one per mask placeholder, in [`Mask`] order) |
//! | 4 | id of `[UNK]` |
//! | 4 | `B`, bytes of the vocabulary text |
//! | B | the `V` tokens joined by `\n` |
//! | 2 × (V+E) | per-row weight, u16 |
//! | 32 × (V+E) | per-row direction, int8 (peak 127 per row) |
//!
//! A token contributes `weight × direction` to the sketch sum: the direction is the
//! token's learned 32-dim vector normalised to int8 range, the weight its learned
//! magnitude (which absorbs frequency weighting: "the" is light, "refund" heavy).

use crate::mask::Mask;
use crate::wordpiece::Vocab;
use std::sync::OnceLock;
use thiserror::Error;

/// The table built into the crate.
static EMBEDDED: &[u8] = include_bytes!("../../data/sketch_v2.bin");

const MAGIC: &[u8; 4] = b"CSKT";
const FORMAT: u32 = 1;
const HEADER_BYTES: usize = 28;

/// Number of extra rows: one per [`Mask`] placeholder.
pub const MASK_ROWS: usize = 7;

/// Why a table could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TableError {
    #[error("table is {0} bytes, shorter than its header or sections")]
    Truncated(usize),
    #[error("not a sketch table (bad magic)")]
    BadMagic,
    #[error("unsupported table format {0}")]
    Format(u32),
    #[error("table has {0} dimensions, the sketch has {1}")]
    Dimensions(u32, usize),
    #[error("table has {0} extra rows, expected {MASK_ROWS}")]
    ExtraRows(u32),
    #[error("vocabulary text is not UTF-8")]
    VocabNotUtf8,
    #[error("vocabulary has {found} tokens, header says {expected}")]
    VocabCount { found: usize, expected: usize },
    #[error("[UNK] id {0} is outside the vocabulary")]
    Unk(u32),
}

/// A parsed table: vocabulary, per-row weights and directions.
#[derive(Debug)]
pub struct Table<'a> {
    pub vocab: Vocab<'a>,
    weights: &'a [u8],
    rows: &'a [u8],
    dims: usize,
    median_weight: i64,
}

fn read_u32(bytes: &[u8], at: usize) -> Result<u32, TableError> {
    bytes
        .get(at..at + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or(TableError::Truncated(bytes.len()))
}

impl<'a> Table<'a> {
    /// Parses a table.
    pub fn parse(bytes: &'a [u8]) -> Result<Table<'a>, TableError> {
        if bytes.len() < HEADER_BYTES {
            return Err(TableError::Truncated(bytes.len()));
        }
        if &bytes[..4] != MAGIC {
            return Err(TableError::BadMagic);
        }
        let format = read_u32(bytes, 4)?;
        if format != FORMAT {
            return Err(TableError::Format(format));
        }
        let dims = read_u32(bytes, 8)?;
        if dims as usize != super::SKETCH_DIMS {
            return Err(TableError::Dimensions(dims, super::SKETCH_DIMS));
        }
        let vocab_len = read_u32(bytes, 12)? as usize;
        let extra = read_u32(bytes, 16)?;
        if extra as usize != MASK_ROWS {
            return Err(TableError::ExtraRows(extra));
        }
        let unk = read_u32(bytes, 20)?;
        let text_len = read_u32(bytes, 24)? as usize;
        let rows_len = vocab_len + MASK_ROWS;
        let text_end = HEADER_BYTES.saturating_add(text_len);
        let weights_end = text_end.saturating_add(2 * rows_len);
        let rows_end = weights_end.saturating_add(super::SKETCH_DIMS * rows_len);
        if bytes.len() < rows_end {
            return Err(TableError::Truncated(bytes.len()));
        }
        let text = std::str::from_utf8(&bytes[HEADER_BYTES..text_end])
            .map_err(|_| TableError::VocabNotUtf8)?;
        let tokens: Vec<&str> = if text.is_empty() {
            Vec::new()
        } else {
            text.split('\n').collect()
        };
        if tokens.len() != vocab_len {
            return Err(TableError::VocabCount {
                found: tokens.len(),
                expected: vocab_len,
            });
        }
        let vocab = Vocab::new(tokens, unk).ok_or(TableError::Unk(unk))?;
        let weights = &bytes[text_end..weights_end];
        let mut sorted: Vec<u16> = weights
            .chunks_exact(2)
            .map(|w| u16::from_le_bytes([w[0], w[1]]))
            .collect();
        sorted.sort_unstable();
        let median_weight = sorted.get(sorted.len() / 2).map_or(0, |w| i64::from(*w));
        Ok(Table {
            median_weight,
            vocab,
            weights,
            rows: &bytes[weights_end..rows_end],
            dims: dims as usize,
        })
    }

    /// The embedded table, parsed on first use; `None` only if the build embedded a bad one
    /// (a unit test guards against that).
    pub fn embedded() -> Option<&'static Table<'static>> {
        static TABLE: OnceLock<Option<Table<'static>>> = OnceLock::new();
        TABLE.get_or_init(|| Table::parse(EMBEDDED).ok()).as_ref()
    }

    /// The median row weight (the scale of a typical token).
    pub fn median_weight(&self) -> i64 {
        self.median_weight
    }

    /// Row id of a mask placeholder.
    pub fn mask_row(&self, mask: Mask) -> u32 {
        let k = match mask {
            Mask::Url => 0,
            Mask::Email => 1,
            Mask::Id => 2,
            Mask::Number => 3,
            Mask::Name => 4,
            Mask::Code => 5,
            Mask::Document => 6,
        };
        (self.vocab.len() + k) as u32
    }

    /// Weight and int8 direction of row `id` (zero weight for an unknown id).
    pub fn row(&self, id: u32) -> (i64, &'a [u8]) {
        let id = id as usize;
        match (
            self.weights.get(2 * id..2 * id + 2),
            self.rows.get(self.dims * id..self.dims * (id + 1)),
        ) {
            (Some(w), Some(row)) => (i64::from(u16::from_le_bytes([w[0], w[1]])), row),
            _ => (0, &[]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_table_parses() {
        let table = Table::parse(EMBEDDED).expect("the embedded table is valid");
        assert_eq!(table.vocab.len(), 30_522);
        assert_eq!(table.vocab.token(table.vocab.unk()), Some("[UNK]"));
        assert!(Table::embedded().is_some());
        assert!(EMBEDDED.len() <= 2 * 1024 * 1024, "table over 2 MB");
    }

    #[test]
    fn bad_tables_are_errors() {
        assert_eq!(Table::parse(b"CSK").err(), Some(TableError::Truncated(3)));
        let mut bytes = EMBEDDED.to_vec();
        bytes[0] = b'X';
        assert_eq!(Table::parse(&bytes).err(), Some(TableError::BadMagic));
        let short = &EMBEDDED[..EMBEDDED.len() - 1];
        assert!(matches!(Table::parse(short), Err(TableError::Truncated(_))));
    }
}
