//! A small seeded mutator for the stable-Rust fuzz pass (no libFuzzer, no coverage
//! feedback): random byte edits, splices between inputs and dictionary insertions, stacked
//! a few at a time over a pool that starts with the seeds. The same seed gives the same
//! inputs in the same order, so a failure found in CI reproduces locally; the time budget
//! only decides how many of them run.
//!
//! The dictionary is the libFuzzer dictionary (`fuzz/fuzz.dict`), read with
//! [`parse_dict`], so both fuzzers know the same tokens.

use crate::Target;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// Longest input the mutator builds.
pub const MAX_LEN: usize = 16 * 1024;
/// Inputs kept in the pool beyond the seeds.
const POOL_LIMIT: usize = 512;

/// splitmix64: tiny, fast, good enough to pick mutations.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

const INTERESTING: [u8; 12] = [
    0x00, 0x01, 0x7f, 0x80, 0xff, b'"', b'\\', b'{', b'}', b'[', b']', b'\n',
];

/// One random edit of `input`.
fn mutate_once(rng: &mut Rng, input: &mut Vec<u8>, pool: &[Vec<u8>], dict: &[Vec<u8>]) {
    let len = input.len();
    match rng.below(9) {
        0 if len > 0 => {
            let at = rng.below(len);
            input[at] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let at = rng.below(len);
            input[at] = INTERESTING[rng.below(INTERESTING.len())];
        }
        2 if len > 0 => {
            let at = rng.below(len);
            input[at] = rng.next_u64() as u8;
        }
        3 if len > 0 => {
            let start = rng.below(len);
            let end = (start + 1 + rng.below(16)).min(len);
            input.drain(start..end);
        }
        4 if len > 0 => {
            let start = rng.below(len);
            let end = (start + 1 + rng.below(64)).min(len);
            let chunk = input[start..end].to_vec();
            let at = rng.below(input.len() + 1);
            input.splice(at..at, chunk);
        }
        5 | 6 if !dict.is_empty() => {
            let token = &dict[rng.below(dict.len())];
            let at = rng.below(len + 1);
            if rng.below(4) == 0 && len > 0 {
                let end = (at + token.len()).min(len);
                input.splice(at..end, token.iter().copied());
            } else {
                input.splice(at..at, token.iter().copied());
            }
        }
        7 if !pool.is_empty() => {
            let other = &pool[rng.below(pool.len())];
            if !other.is_empty() {
                let start = rng.below(other.len());
                let end = (start + 1 + rng.below(256)).min(other.len());
                let at = rng.below(len + 1);
                input.splice(at..at, other[start..end].iter().copied());
            }
        }
        8 if len > 1 => {
            let at = rng.below(len);
            input.truncate(at.max(1));
        }
        _ => input.push(rng.next_u64() as u8),
    }
    input.truncate(MAX_LEN);
}

/// What a mutation run did.
#[derive(Debug, Clone, Copy)]
pub struct Stats {
    pub executions: u64,
    pub elapsed: Duration,
}

/// Runs `target` on mutations of `seeds` until `budget` has passed (and at least
/// `min_executions` ran). On a panic, returns the input that caused it.
pub fn run(
    target: Target,
    seeds: &[Vec<u8>],
    dict: &[Vec<u8>],
    seed: u64,
    budget: Duration,
    min_executions: u64,
) -> Result<Stats, Vec<u8>> {
    let started = Instant::now();
    let mut rng = Rng::new(seed);
    let mut pool: Vec<Vec<u8>> = seeds.to_vec();
    if pool.is_empty() {
        pool.push(Vec::new());
    }
    let seeds_len = pool.len();
    let mut executions = 0u64;
    while executions < min_executions || started.elapsed() < budget {
        let mut input = pool[rng.below(pool.len())].clone();
        for _ in 0..1 + rng.below(4) {
            mutate_once(&mut rng, &mut input, &pool, dict);
        }
        if catch_unwind(AssertUnwindSafe(|| (target.run)(&input))).is_err() {
            return Err(input);
        }
        executions += 1;
        if rng.below(16) == 0 {
            if pool.len() < seeds_len + POOL_LIMIT {
                pool.push(input);
            } else {
                let slot = seeds_len + rng.below(POOL_LIMIT);
                pool[slot] = input;
            }
        }
    }
    Ok(Stats {
        executions,
        elapsed: started.elapsed(),
    })
}

/// Parses a libFuzzer dictionary: one `"token"` (optionally `name="token"`) per line,
/// `#` comments, escapes `\\`, `\"` and `\xNN`.
pub fn parse_dict(text: &str) -> Result<Vec<Vec<u8>>, String> {
    let mut tokens = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let quoted = line
            .find('"')
            .map(|start| &line[start..])
            .filter(|q| q.len() >= 2 && q.ends_with('"'))
            .ok_or_else(|| format!("line {}: no quoted token", number + 1))?;
        let inner = &quoted.as_bytes()[1..quoted.len() - 1];
        let mut token = Vec::new();
        let mut i = 0;
        while i < inner.len() {
            match (inner[i], inner.get(i + 1)) {
                (b'\\', Some(b'\\')) | (b'\\', Some(b'"')) => {
                    token.push(inner[i + 1]);
                    i += 2;
                }
                (b'\\', Some(b'x')) => {
                    let hex = inner
                        .get(i + 2..i + 4)
                        .and_then(|h| std::str::from_utf8(h).ok())
                        .and_then(|h| u8::from_str_radix(h, 16).ok())
                        .ok_or_else(|| format!("line {}: bad \\x escape", number + 1))?;
                    token.push(hex);
                    i += 4;
                }
                (b'\\', _) => return Err(format!("line {}: bad escape", number + 1)),
                (byte, _) => {
                    token.push(byte);
                    i += 1;
                }
            }
        }
        tokens.push(token);
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dictionary_escapes() {
        let dict = parse_dict("# c\n\"a\\\"b\"\nkw=\"\\xe2\\x80\\x8d\\\\\"\n").unwrap();
        assert_eq!(dict, [b"a\"b".to_vec(), b"\xe2\x80\x8d\\".to_vec()]);
        assert!(parse_dict("nope").is_err());
    }

    #[test]
    fn the_same_seed_gives_the_same_inputs() {
        let inputs = |seed| {
            let mut rng = Rng::new(seed);
            let mut input = b"{\"a\":1}".to_vec();
            (0..50)
                .map(|_| {
                    mutate_once(&mut rng, &mut input, &[], &[b"x".to_vec()]);
                    input.clone()
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(inputs(7), inputs(7));
        assert_ne!(inputs(7), inputs(8));
    }
}
