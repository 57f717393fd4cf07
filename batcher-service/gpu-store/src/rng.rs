//! A small deterministic generator for the parity checks and the benchmarks: neither may
//! depend on a crate's random sequence across versions.

use cohort_batcher_core::store::SketchBytes;

/// A small deterministic generator (tests and benchmarks must not depend on a crate's
/// sequence across versions).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    pub fn sketch(&mut self) -> SketchBytes {
        let (a, b, c, d) = (
            self.next_u64(),
            self.next_u64(),
            self.next_u64(),
            self.next_u64(),
        );
        let bytes: Vec<u8> = [a, b, c, d].iter().flat_map(|w| w.to_le_bytes()).collect();
        std::array::from_fn(|i| bytes[i] as i8)
    }
}
