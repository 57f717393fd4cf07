//! A case-folded word of intent text ([`crate::mask::Token::Word`]), stored inline when short.
//!
//! Masking yields a word per token and the sketch reads each once. With a heap `String` per
//! word, allocating and freeing them was a fifth of the native masking time, and more under
//! wasm's allocator. Words of up to [`INLINE`] bytes — nearly all — live inside the token;
//! longer ones go to the heap. A `Word` reads as a `&str` (it derefs to one) and compares,
//! hashes and prints as its text.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;

/// Longest word kept inline, in bytes.
pub const INLINE: usize = 22;

/// A word: its text inline, or on the heap when longer than [`INLINE`] bytes.
#[derive(Clone)]
pub struct Word(Repr);

#[derive(Clone)]
enum Repr {
    /// `bytes[..len]` is valid UTF-8 (copied from a `&str`, or ASCII-lowercased from one).
    Inline {
        len: u8,
        bytes: [u8; INLINE],
    },
    Heap(Box<str>),
}

impl Word {
    /// `text` with ASCII letters lowercased (what [`str::to_ascii_lowercase`] returns).
    pub fn ascii_lowercase(text: &str) -> Word {
        if text.len() > INLINE {
            return Word(Repr::Heap(text.to_ascii_lowercase().into_boxed_str()));
        }
        // One pass, copying and lowercasing (lowercasing ASCII keeps UTF-8 valid).
        let mut bytes = [0; INLINE];
        for (to, from) in bytes.iter_mut().zip(text.bytes()) {
            *to = from.to_ascii_lowercase();
        }
        Word(Repr::Inline {
            len: text.len() as u8,
            bytes,
        })
    }

    fn inline(text: &str) -> Option<Word> {
        let mut bytes = [0; INLINE];
        bytes
            .get_mut(..text.len())?
            .copy_from_slice(text.as_bytes());
        Some(Word(Repr::Inline {
            len: text.len() as u8,
            bytes,
        }))
    }

    /// The word's text.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            // Valid by construction; the check is a few instructions on a short word.
            Repr::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default()
            }
            Repr::Heap(text) => text,
        }
    }
}

impl From<&str> for Word {
    fn from(text: &str) -> Word {
        Word::inline(text).unwrap_or_else(|| Word(Repr::Heap(text.into())))
    }
}

impl From<String> for Word {
    fn from(text: String) -> Word {
        Word::inline(&text).unwrap_or_else(|| Word(Repr::Heap(text.into_boxed_str())))
    }
}

impl Deref for Word {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Word {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for Word {
    fn eq(&self, other: &Word) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Word {}

impl PartialEq<str> for Word {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Word {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Hash for Word {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl fmt::Debug for Word {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Word {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Inline or not, a word reads back as the text it was made from.
        #[test]
        fn words_read_back(text in crate::test_text::any_text()) {
            proptest::prop_assert_eq!(Word::from(text.as_str()), text.as_str());
            proptest::prop_assert_eq!(Word::from(text.clone()), text.as_str());
            let lower = text.to_ascii_lowercase();
            proptest::prop_assert_eq!(Word::ascii_lowercase(&text), lower.as_str());
        }
    }

    #[test]
    fn inline_bound_and_equality() {
        let short = "a".repeat(INLINE);
        let long = "a".repeat(INLINE + 1);
        assert!(matches!(Word::from(short.as_str()).0, Repr::Inline { .. }));
        assert!(matches!(Word::from(long.as_str()).0, Repr::Heap(_)));
        assert_eq!(Word::from("Refund"), Word::from(String::from("Refund")));
        assert_ne!(Word::from("refund"), Word::from("refunds"));
        assert_eq!(format!("{:?}", Word::from("x")), "\"x\"");
    }
}
