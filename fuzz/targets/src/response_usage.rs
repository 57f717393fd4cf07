//! The end of an engine's response as the filter reads it for the cached tokens it reports
//! (`cohort_filter::usage`): arbitrary bytes, in arbitrary chunks, through the tail window.
//!
//! Invariants: scanning is deterministic; a reported usage never has more cached tokens than
//! prompt tokens; the window keeps at most `WINDOW` bytes, exactly the stream's last ones
//! whatever the chunking; and what the window holds scans the same as the whole tail.

use cohort_filter::usage::{scan, TailWindow, WINDOW};

/// The fuzz target: `data`'s first byte picks a chunk size for the rest.
pub fn response_usage(data: &[u8]) {
    let Some((&first, body)) = data.split_first() else {
        return;
    };
    let usage = scan(body);
    assert_eq!(usage, scan(body), "deterministic");
    if let Some(usage) = usage {
        assert!(usage.cached_tokens <= usage.prompt_tokens, "{usage:?}");
    }
    let chunk = usize::from(first).max(1) * 7;
    let mut window = TailWindow::default();
    for piece in body.chunks(chunk) {
        let (start, len) = TailWindow::wanted(piece.len());
        assert_eq!(start + len, piece.len());
        window.push(&piece[start..]);
    }
    let tail = &body[body.len().saturating_sub(WINDOW)..];
    assert_eq!(window.bytes(), tail, "the window is the stream's end");
    assert_eq!(scan(window.bytes()), scan(tail));
}
