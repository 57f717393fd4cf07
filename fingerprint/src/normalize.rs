//! Unicode normalisation of intent text, before masking.
//!
//! NFKC folds compatibility forms (full-width letters, ligatures, superscripts) onto their
//! plain forms; zero-width and invisible format characters (ZWSP/ZWJ/ZWNJ, bidi
//! overrides and isolates, BOM, soft hyphen, variation selectors, tag characters) are
//! removed so they cannot split or disguise words; control characters become spaces.
//! Case folding happens per word in [`crate::mask`], after name detection has seen the
//! capitals. Emoji pass through and become tokens of their own.
//!
//! Long turns are cut to their first and last [`HALF_WINDOW`] bytes: a pasted document's
//! ask sits at its start or end, and the sketch's cost stays bounded. The sketch costs about
//! 20 ns per byte it reads (tokenising, masking, WordPiece, the table sum), 50 times the
//! JSON parse's per-byte cost, so the window sets what a long turn costs the filter: 1 KiB
//! at each end is about 350 words, 40 µs. (It was 8 KiB, 330 µs: on Mooncake's long turns
//! that was most of the filter's time, and one Envoy worker fingerprinting a burst of them
//! delayed every Assign of the burst; docs/FINGERPRINT.md.)

use unicode_normalization::UnicodeNormalization;

/// Bytes kept from each end of a long intent text.
pub const HALF_WINDOW: usize = 1024;

/// Normalises `text` for masking and tokenising.
pub fn normalize(text: &str) -> String {
    let text = head_and_tail(text);
    // ASCII is already NFKC and has no invisible characters: only controls to replace.
    if text.is_ascii() {
        let control = |b: u8| b.is_ascii_control() && b != b'\n';
        if !text.bytes().any(control) {
            return text.into_owned();
        }
        return text.replace(|c: char| control(c as u8), " ");
    }
    let mut out = String::with_capacity(text.len());
    // Invisible characters go before composition: left in place, one between a letter and
    // its combining mark (`e` ZWJ U+0301) blocks NFKC from composing them, and removing it
    // afterwards would leave text that composes differently when normalised again.
    let visible = text
        .chars()
        .filter(|c| !is_invisible(*c))
        .map(control_to_space);
    for c in visible.nfkc() {
        // Composition yields no invisible or control character today; the check keeps the
        // output promise if a Unicode update ever maps one there.
        if !is_invisible(c) {
            out.push(control_to_space(c));
        }
    }
    out
}

fn control_to_space(c: char) -> char {
    if c.is_control() && c != '\n' {
        ' '
    } else {
        c
    }
}

/// True for characters that render as nothing but can split or disguise words.
pub fn is_invisible(c: char) -> bool {
    matches!(c,
        '\u{00AD}'                      // soft hyphen
        | '\u{034F}'                    // combining grapheme joiner
        | '\u{061C}'                    // Arabic letter mark
        | '\u{180E}'                    // Mongolian vowel separator
        | '\u{200B}'..='\u{200F}'       // ZWSP, ZWNJ, ZWJ, LRM, RLM
        | '\u{202A}'..='\u{202E}'       // bidi embeddings and overrides
        | '\u{2060}'..='\u{206F}'       // word joiner, invisible operators, bidi isolates
        | '\u{FE00}'..='\u{FE0F}'       // variation selectors
        | '\u{FEFF}'                    // BOM / ZWNBSP
        | '\u{E0000}'..='\u{E007F}'     // tag characters
        | '\u{E0100}'..='\u{E01EF}'     // variation selectors supplement
    )
}

fn head_and_tail(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= 2 * HALF_WINDOW {
        return text.into();
    }
    let mut head_end = HALF_WINDOW;
    while !text.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = text.len() - HALF_WINDOW;
    while !text.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    format!("{}\n\n{}", &text[..head_end], &text[tail_start..]).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ASCII branch as it was before it became one `str::replace` (commit 0f41482).
    fn reference_ascii(text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        out.extend(text.chars().map(|c| {
            if c.is_ascii_control() && c != '\n' {
                ' '
            } else {
                c
            }
        }));
        out
    }

    proptest::proptest! {
        #[test]
        fn ascii_branch_matches_the_reference(text in "[\\x00-\\x7f]{0,300}") {
            proptest::prop_assert_eq!(normalize(&text), reference_ascii(&text));
        }
    }

    #[test]
    fn nfkc_folds_compatibility_forms() {
        assert_eq!(normalize("ｒｅｆｕｎｄ ﬁle"), "refund file");
    }

    #[test]
    fn invisible_characters_are_removed() {
        assert_eq!(
            normalize("re\u{200B}fu\u{200D}nd\u{FEFF} \u{202E}card"),
            "refund card"
        );
    }

    #[test]
    fn normalising_twice_changes_nothing() {
        // Found by fuzzing: a joiner between a letter and its combining mark.
        for text in [
            "e\u{200D}\u{0301}",
            "a\u{FEFF}\u{0308}x",
            "\u{1100}\u{200B}\u{1161}",
        ] {
            let once = normalize(text);
            assert_eq!(normalize(&once), once, "{text:?}");
        }
        assert_eq!(normalize("e\u{200D}\u{0301}"), "\u{e9}");
    }

    #[test]
    fn controls_become_spaces_and_emoji_stay() {
        assert_eq!(normalize("a\u{0}b\tc\nd 🙂"), "a b c\nd 🙂");
    }

    #[test]
    fn long_text_keeps_head_and_tail() {
        let text = format!("start {} end", "é".repeat(20_000));
        let out = normalize(&text);
        assert!(out.starts_with("start "));
        assert!(out.ends_with(" end"));
        assert!(out.len() <= 2 * HALF_WINDOW + 2);
    }
}
