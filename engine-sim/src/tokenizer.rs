//! The simulator's tokenizer, defined once for the server, `bound` and the tests: one token
//! per 4 bytes of the UTF-8 rendered prompt (the last partial chunk is one token), and a
//! token's id is the low 31 bits of the xxh3 hash of its 4 bytes. No vocabulary is needed,
//! counts are trivially reproducible by any client (`ceil(bytes / 4)`), and equal text gives
//! equal ids, which is all a prefix cache needs.

use xxhash_rust::xxh3::xxh3_64;

/// Bytes of rendered prompt per token.
pub const BYTES_PER_TOKEN: usize = 4;

/// The token ids of `text`.
pub fn tokenize(text: &str) -> Vec<u32> {
    text.as_bytes()
        .chunks(BYTES_PER_TOKEN)
        .map(|chunk| (xxh3_64(chunk) & 0x7fff_ffff) as u32)
        .collect()
}

/// How many tokens `text` has, without computing them.
pub fn count(text: &str) -> usize {
    text.len().div_ceil(BYTES_PER_TOKEN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_token_per_four_bytes_and_the_partial_tail_counts() {
        assert_eq!(tokenize("").len(), 0);
        assert_eq!(tokenize("abcd").len(), 1);
        assert_eq!(tokenize("abcde").len(), 2);
        assert_eq!(count("abcdefgh"), 2);
        assert_eq!(count("abcdefghi"), 3);
        // Bytes, not characters: "é" is two bytes, so four of them are two tokens.
        assert_eq!(count("éééé"), 2);
        assert_eq!(tokenize("éééé").len(), 2);
    }

    #[test]
    fn ids_are_the_low_31_bits_of_the_chunk_hash() {
        let ids = tokenize("abcdabcdxy");
        assert_eq!(ids[0], (xxh3_64(b"abcd") & 0x7fff_ffff) as u32);
        assert_eq!(ids[0], ids[1]);
        assert_eq!(ids[2], (xxh3_64(b"xy") & 0x7fff_ffff) as u32);
        assert!(ids.iter().all(|&id| id < (1 << 31)));
        assert_ne!(tokenize("abce")[0], ids[0]);
    }
}
