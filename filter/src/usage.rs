//! Cached prompt tokens as the engine reports them in its response (pure).
//!
//! Engines say how much of a prompt their prefix cache served, at the end of the answer:
//!
//! - OpenAI-compatible servers (vLLM, SGLang, engine-sim, llama.cpp's newer builds):
//!   `"usage": {"prompt_tokens": P, "prompt_tokens_details": {"cached_tokens": C}}`, in
//!   the JSON body, or in a stream's final usage chunk (`stream_options.include_usage`);
//! - llama.cpp's `timings`: `cache_n` tokens from the cache and `prompt_n` computed, so the
//!   prompt is `cache_n + prompt_n`.
//!
//! The filter does not parse response bodies: it keeps the last [`WINDOW`] bytes that went
//! by ([`TailWindow`], a few hundred bytes past the final usage object on every engine above)
//! and, at the end of the stream, [`scan`] finds the *last* occurrence of each key there (a
//! stream's last chunk carries the totals). A key inside a string value is escaped (`\"`),
//! so it is skipped. Where neither form is found, nothing is counted.

/// Bytes of the response's end that are kept for [`scan`].
pub const WINDOW: usize = 2048;

/// What a response reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

/// The last [`WINDOW`] bytes of a body that passes by in chunks.
#[derive(Debug, Default)]
pub struct TailWindow {
    bytes: Vec<u8>,
}

impl TailWindow {
    /// How many bytes of a `chunk_len`-byte chunk are worth reading: its last [`WINDOW`].
    pub fn wanted(chunk_len: usize) -> (usize, usize) {
        let take = chunk_len.min(WINDOW);
        (chunk_len - take, take)
    }

    /// Appends the end of a chunk, keeping the last [`WINDOW`] bytes.
    pub fn push(&mut self, tail: &[u8]) {
        let tail = &tail[tail.len().saturating_sub(WINDOW)..];
        let overflow = (self.bytes.len() + tail.len()).saturating_sub(WINDOW);
        self.bytes.drain(..overflow);
        self.bytes.extend_from_slice(tail);
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// The keys [`scan`] reads, quotes included.
const KEYS: [&[u8]; 4] = [
    b"\"cached_tokens\"",
    b"\"prompt_tokens\"",
    b"\"cache_n\"",
    b"\"prompt_n\"",
];

/// The usage the text reports, if it reports one: one pass from the end, quote to quote,
/// that stops once the OpenAI pair is found.
pub fn scan(text: &[u8]) -> Option<Usage> {
    let mut last: [Option<u64>; 4] = [None; 4];
    let mut end = text.len();
    while let Some(quote) = text[..end].iter().rposition(|&b| b == b'"') {
        end = quote;
        if quote > 0 && text[quote - 1] == b'\\' {
            continue;
        }
        for (slot, key) in last.iter_mut().zip(KEYS) {
            if slot.is_none() && text[quote..].starts_with(key) {
                *slot = value_after(&text[quote + key.len()..]);
            }
        }
        if last[0].is_some() && last[1].is_some() {
            break;
        }
    }
    match last {
        [Some(cached), Some(prompt), ..] => Some(Usage {
            prompt_tokens: prompt.max(cached),
            cached_tokens: cached,
        }),
        [_, _, Some(cached), Some(computed)] => Some(Usage {
            prompt_tokens: cached.saturating_add(computed),
            cached_tokens: cached,
        }),
        _ => None,
    }
}

/// The number after a key: `: 123`.
fn value_after(text: &[u8]) -> Option<u64> {
    let rest = skip_space(text).strip_prefix(b":")?;
    leading_number(skip_space(rest))
}

fn skip_space(text: &[u8]) -> &[u8] {
    let n = text
        .iter()
        .take_while(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
        .count();
    &text[n..]
}

/// Digits at the start of `text` as a number (none, or too many for u64: `None`).
fn leading_number(text: &[u8]) -> Option<u64> {
    let digits = text.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 19 {
        return None;
    }
    std::str::from_utf8(&text[..digits]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_usage_in_a_json_body() {
        let body = br#"{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":120,"completion_tokens":5,"total_tokens":125,"prompt_tokens_details":{"cached_tokens":96}}}"#;
        assert_eq!(
            scan(body),
            Some(Usage {
                prompt_tokens: 120,
                cached_tokens: 96
            })
        );
    }

    #[test]
    fn a_streams_final_usage_chunk_wins() {
        let stream = b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":{\"prompt_tokens\":9,\"prompt_tokens_details\":{\"cached_tokens\":1}}}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\": 300, \"completion_tokens\":4,\"prompt_tokens_details\": {\"cached_tokens\" : 256}}}\n\ndata: [DONE]\n\n";
        assert_eq!(
            scan(stream),
            Some(Usage {
                prompt_tokens: 300,
                cached_tokens: 256
            })
        );
    }

    #[test]
    fn llama_cpp_timings() {
        let body = br#"{"choices":[],"usage":{"prompt_tokens":50},"timings":{"cache_n":40,"prompt_n":10,"prompt_ms":3.2}}"#;
        assert_eq!(
            scan(body),
            Some(Usage {
                prompt_tokens: 50,
                cached_tokens: 40
            })
        );
    }

    #[test]
    fn keys_inside_strings_and_bad_values_are_not_usage() {
        assert_eq!(
            scan(br#"{"content":"say \"cached_tokens\":5 and \"prompt_tokens\":9"}"#),
            None
        );
        assert_eq!(
            scan(
                br#"{"usage":{"prompt_tokens":null,"prompt_tokens_details":{"cached_tokens":3}}}"#
            ),
            None
        );
        assert_eq!(scan(br#"{"usage":{"prompt_tokens":10}}"#), None);
        assert_eq!(scan(b""), None);
        assert_eq!(scan(b"\"cached_tokens\":99999999999999999999999"), None);
        // Cached above the prompt (a broken engine) is capped at the prompt.
        assert_eq!(
            scan(br#"{"prompt_tokens":5,"cached_tokens":8}"#),
            Some(Usage {
                prompt_tokens: 8,
                cached_tokens: 8
            })
        );
    }

    #[test]
    fn the_window_keeps_the_end_of_the_body() {
        let mut window = TailWindow::default();
        window.push(b"abc");
        window.push(&vec![b'x'; WINDOW - 1]);
        assert_eq!(window.bytes().len(), WINDOW);
        assert_eq!(window.bytes()[0], b'c');
        window.push(&vec![b'y'; WINDOW + 10]);
        assert!(window.bytes().iter().all(|b| *b == b'y'));
        assert_eq!(TailWindow::wanted(100), (0, 100));
        assert_eq!(TailWindow::wanted(WINDOW + 5), (5, WINDOW));
        // A usage chunk split over two chunks is found whole.
        let mut split = TailWindow::default();
        split.push(br#"data: {"usage":{"prompt_tokens":7,"prompt_tokens_det"#);
        split.push(br#"ails":{"cached_tokens":6}}}"#);
        assert_eq!(
            scan(split.bytes()),
            Some(Usage {
                prompt_tokens: 7,
                cached_tokens: 6
            })
        );
    }
}
