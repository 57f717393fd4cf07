//! The cohort codebook: a request's cohort id is the nearest centroid of the sketch space.
//!
//! A cohort id has to group same-intent requests without a batcher: it anchors the routing
//! key of a request with no system prompt or tools (affinity mode's ring hash, batch mode's
//! grouping) and is the `x-cohort-cluster` header. The sketch's sign signature did not
//! group (one flipped sign made a new id: 3,002 ids for Banking77's 3,080 test prompts).
//! So the id is the index of the nearest of a fixed set of centroids, shipped in the crate
//! like the sketch table and fitted on the distillation corpus, never on evaluation sets
//! (`cohort_tools/distill/codebook.py`; docs/SKETCH.md, "Cohort codebook").
//!
//! Levels run from coarse to fine (4 to 1,024 centroids). `x-cohort-batch-threshold`
//! (0.1–0.9) picks one, evenly: a higher threshold gives smaller, purer cohorts, the same
//! direction as in the batcher's clustering, where it is a similarity bound. The default,
//! 0.5, is the middle level.
//!
//! Nearest means the greatest integer dot product of the int8 sketch with the int8
//! centroids; the centroids of a level are unit vectors quantised with one scale, so that is
//! the nearest by cosine up to rounding, and it is exact and identical on every platform
//! (wasm32 included). Ties go to the lower index. A sketch of all zeros (no intent text, a
//! token-id prompt) has no direction and gets [`NO_INTENT`].
//!
//! Format (little-endian): magic `CCBK`, u32 format (1), u32 dimensions (32), u32 levels
//! `L`; per level: u32 `k`, then `k × 32` int8.

use super::{Sketch, SKETCH_DIMS};
use std::sync::OnceLock;
use thiserror::Error;

/// The codebook built into the crate.
static EMBEDDED: &[u8] = include_bytes!("../../data/codebook_v1.bin");

/// Version of the cohort id function: which codebook, read which way. Ids of different
/// versions are not comparable (shown beside the sketch version in the response header).
pub const CODEBOOK_VERSION: u32 = 1;

/// The cohort code of a sketch with no direction.
pub const NO_INTENT: u32 = u32::MAX;

const MAGIC: &[u8; 4] = b"CCBK";
const FORMAT: u32 = 1;
const HEADER_BYTES: usize = 16;

/// Why a codebook could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CodebookError {
    #[error("codebook is {0} bytes, shorter than its header or levels")]
    Truncated(usize),
    #[error("not a codebook (bad magic)")]
    BadMagic,
    #[error("unsupported codebook format {0}")]
    Format(u32),
    #[error("codebook has {0} dimensions, the sketch has {SKETCH_DIMS}")]
    Dimensions(u32),
    #[error("codebook level {0} is empty or the codebook has no level")]
    Empty(usize),
    #[error("codebook has {0} trailing bytes")]
    Trailing(usize),
}

/// A parsed codebook: its levels, coarse to fine.
#[derive(Debug)]
pub struct Codebook<'a> {
    levels: Vec<&'a [u8]>,
}

fn read_u32(bytes: &[u8], at: usize) -> Result<u32, CodebookError> {
    bytes
        .get(at..at + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or(CodebookError::Truncated(bytes.len()))
}

impl<'a> Codebook<'a> {
    /// Parses a codebook.
    pub fn parse(bytes: &'a [u8]) -> Result<Codebook<'a>, CodebookError> {
        if bytes.len() < HEADER_BYTES {
            return Err(CodebookError::Truncated(bytes.len()));
        }
        if &bytes[..4] != MAGIC {
            return Err(CodebookError::BadMagic);
        }
        let format = read_u32(bytes, 4)?;
        if format != FORMAT {
            return Err(CodebookError::Format(format));
        }
        let dims = read_u32(bytes, 8)?;
        if dims as usize != SKETCH_DIMS {
            return Err(CodebookError::Dimensions(dims));
        }
        let count = read_u32(bytes, 12)? as usize;
        let mut levels = Vec::with_capacity(count.min(64));
        let mut at = HEADER_BYTES;
        for level in 0..count {
            let k = read_u32(bytes, at)? as usize;
            let end = k
                .checked_mul(SKETCH_DIMS)
                .and_then(|n| n.checked_add(at + 4))
                .filter(|&end| end <= bytes.len())
                .ok_or(CodebookError::Truncated(bytes.len()))?;
            if k == 0 {
                return Err(CodebookError::Empty(level));
            }
            levels.push(&bytes[at + 4..end]);
            at = end;
        }
        if levels.is_empty() {
            return Err(CodebookError::Empty(0));
        }
        if at != bytes.len() {
            return Err(CodebookError::Trailing(bytes.len() - at));
        }
        Ok(Codebook { levels })
    }

    /// The codebook built into the crate, parsed once per process (or wasm VM).
    pub fn embedded() -> &'static Codebook<'static> {
        static PARSED: OnceLock<Codebook<'static>> = OnceLock::new();
        PARSED.get_or_init(|| {
            Codebook::parse(EMBEDDED).expect("the embedded codebook is checked by its tests")
        })
    }

    /// Number of levels.
    pub fn levels(&self) -> usize {
        self.levels.len()
    }

    /// Number of centroids at `level`.
    pub fn size(&self, level: usize) -> usize {
        self.levels.get(level).map_or(0, |c| c.len() / SKETCH_DIMS)
    }

    /// The level a batch threshold (0.1–0.9, clamped) selects: evenly spaced, coarse to fine.
    pub fn level_for_threshold(&self, threshold: f32) -> usize {
        let last = self.levels.len() - 1;
        let t = if threshold.is_finite() {
            threshold.clamp(0.1, 0.9)
        } else {
            0.5
        };
        (((t - 0.1) / 0.8) * last as f32).round() as usize
    }

    /// Index of the centroid nearest to `sketch` at `level` (None for a zero sketch).
    pub fn nearest(&self, level: usize, sketch: &Sketch) -> Option<usize> {
        if sketch.0.iter().all(|&v| v == 0) {
            return None;
        }
        let centroids = self.levels.get(level.min(self.levels.len() - 1))?;
        let mut best = (i32::MIN, 0);
        for (index, centroid) in centroids.chunks_exact(SKETCH_DIMS).enumerate() {
            let dot: i32 = centroid
                .iter()
                .zip(sketch.0.iter())
                .map(|(&c, &s)| i32::from(c as i8) * i32::from(s))
                .sum();
            if dot > best.0 {
                best = (dot, index);
            }
        }
        Some(best.1)
    }

    /// The cohort code of `sketch` under a batch threshold: level and centroid index in one
    /// number (`level << 16 | index`), so ids of different levels never meet; [`NO_INTENT`]
    /// for a zero sketch. Not salted: the id anyone sees is [`crate::TenantSalt::cohort`] of it.
    pub fn code(&self, threshold: f32, sketch: &Sketch) -> u32 {
        let level = self.level_for_threshold(threshold);
        match self.nearest(level, sketch) {
            Some(index) => (level as u32) << 16 | index as u32,
            None => NO_INTENT,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn book(levels: &[&[[i8; SKETCH_DIMS]]]) -> Vec<u8> {
        let mut bytes = b"CCBK".to_vec();
        for v in [FORMAT, SKETCH_DIMS as u32, levels.len() as u32] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        for level in levels {
            bytes.extend_from_slice(&(level.len() as u32).to_le_bytes());
            for c in *level {
                bytes.extend(c.iter().map(|&v| v as u8));
            }
        }
        bytes
    }

    fn axis(d: usize, v: i8) -> [i8; SKETCH_DIMS] {
        let mut c = [0; SKETCH_DIMS];
        c[d] = v;
        c
    }

    #[test]
    fn the_embedded_codebook_parses_coarse_to_fine() {
        let book = Codebook::embedded();
        assert!(book.levels() >= 3);
        for level in 1..book.levels() {
            assert!(book.size(level) > book.size(level - 1));
        }
    }

    #[test]
    fn nearest_is_the_greatest_dot_and_ties_go_low() {
        let bytes = book(&[&[axis(0, 100), axis(1, 100), axis(1, 100)]]);
        let book = Codebook::parse(&bytes).unwrap();
        let mut s = Sketch::default();
        s.0[1] = 5;
        s.0[0] = 4;
        assert_eq!(
            book.nearest(0, &s),
            Some(1),
            "the tie between 1 and 2 goes to 1"
        );
        s.0[0] = 6;
        assert_eq!(book.nearest(0, &s), Some(0));
        assert_eq!(book.nearest(0, &Sketch::default()), None);
        assert_eq!(book.code(0.5, &Sketch::default()), NO_INTENT);
    }

    #[test]
    fn the_threshold_picks_levels_evenly_and_codes_differ_by_level() {
        let a: &[[i8; SKETCH_DIMS]] = &[axis(0, 1)];
        let bytes = book(&[a, a, a, a, a]);
        let book = Codebook::parse(&bytes).unwrap();
        let levels: Vec<usize> = [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 2.0, f32::NAN]
            .iter()
            .map(|&t| book.level_for_threshold(t))
            .collect();
        assert_eq!(levels, [0, 0, 1, 2, 3, 4, 4, 2]);
        let mut s = Sketch::default();
        s.0[0] = 1;
        assert_ne!(book.code(0.1, &s), book.code(0.9, &s));
        assert_eq!(book.code(0.9, &s), 4 << 16);
    }

    #[test]
    fn broken_codebooks_are_errors() {
        let good = book(&[&[axis(0, 1)]]);
        assert!(Codebook::parse(&good).is_ok());
        assert_eq!(
            Codebook::parse(&good[..good.len() - 1]).unwrap_err(),
            CodebookError::Truncated(good.len() - 1)
        );
        let mut bad = good.clone();
        bad[0] = b'X';
        assert_eq!(Codebook::parse(&bad).unwrap_err(), CodebookError::BadMagic);
        let mut extra = good.clone();
        extra.push(0);
        assert_eq!(
            Codebook::parse(&extra).unwrap_err(),
            CodebookError::Trailing(1)
        );
        assert_eq!(
            Codebook::parse(&book(&[])).unwrap_err(),
            CodebookError::Empty(0)
        );
        let mut huge = book(&[]);
        huge[12] = 1;
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            Codebook::parse(&huge),
            Err(CodebookError::Truncated(_))
        ));
    }
}
