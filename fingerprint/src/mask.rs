//! Tokenising normalised intent text, with variables masked.
//!
//! Two prompts of one intent differ mostly in their variables: "refund order 1234 to
//! jane@x.com" and "refund order 98 to bob@y.org" ask the same thing. Masking replaces
//! each variable by a placeholder token so both yield the same token sequence and hence the
//! same sketch. Masked, in this order:
//! - fenced code blocks (```…```) and inline `code` → `<code>`;
//! - quoted passages of at least [`LONG_QUOTE`] bytes ("…", “…”, «…», '''…''') → `<doc>`;
//! - per whitespace-separated chunk: URLs (`scheme://`, `www.`) → `<url>`, e-mail
//!   addresses → `<email>`, `@handles`, UUIDs, long hex strings and letter–digit codes
//!   (`AB12C9`) → `<id>`, numbers, amounts, dates, times, ordinals and quantities (`3rd`,
//!   `10kg`) → `<num>`;
//! - capitalised words that do not start a sentence (and are not "I" or an all-caps
//!   acronym) → `<name>`: people, places and products in running text.
//!
//! **Anchors** are the exception a template writer asks for: text between `【` and `】`
//! selects the behaviour ("recommend 【Electronics】 products"), so it is never masked. Its
//! words are kept as words (case-folded, digits included), and they are returned apart
//! ([`tokenize_anchored`]) so that the cohort id can tell the values apart
//! ([`crate::IntentSketch::cohort`]): without the anchor, "Electronics" is a `<name>` and
//! every category of the template is one cohort.
//!
//! Consecutive equal placeholders merge ("Mary Ann Smith" → one `<name>`). Words are
//! case-folded (Unicode full folding). Emoji and other symbols become one token each; CJK
//! ideographs and kana, written without spaces, become one token per character so the
//! sketch's bigrams see their words. Punctuation separates and is dropped.

pub use crate::word::Word;

/// Minimum length in bytes of a quoted passage masked as a document.
pub const LONG_QUOTE: usize = 160;

/// Most tokens read from one text; the rest are ignored.
pub const MAX_TOKENS: usize = 4096;

/// A placeholder for a masked variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mask {
    Url,
    Email,
    Id,
    Number,
    Name,
    Code,
    Document,
}

impl Mask {
    pub fn placeholder(self) -> &'static str {
        match self {
            Mask::Url => "<url>",
            Mask::Email => "<email>",
            Mask::Id => "<id>",
            Mask::Number => "<num>",
            Mask::Name => "<name>",
            Mask::Code => "<code>",
            Mask::Document => "<doc>",
        }
    }
}

/// One token of intent text.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Token {
    /// A case-folded word (or a single CJK character).
    Word(Word),
    /// An emoji or other symbol.
    Symbol(char),
    /// A masked variable.
    Mask(Mask),
}

impl Token {
    /// The token as text: the word, the symbol, or the placeholder.
    pub fn as_text(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Token::Word(word) => word.as_str().into(),
            Token::Symbol(c) => c.to_string().into(),
            Token::Mask(mask) => mask.placeholder().into(),
        }
    }
}

/// Opens an anchor (see the module doc).
pub const ANCHOR_OPEN: char = '\u{3010}';
/// Closes an anchor.
pub const ANCHOR_CLOSE: char = '\u{3011}';

/// Tokenises normalised text with variables masked.
pub fn tokenize(text: &str) -> Vec<Token> {
    tokenize_anchored(text).0
}

/// Tokenises normalised text with variables masked; also returns the words of its anchors,
/// in order (empty when it has none).
pub fn tokenize_anchored(text: &str) -> (Vec<Token>, Vec<Word>) {
    // About one token per five bytes of prose; the capacity only saves reallocations.
    let mut out = Tokens(Vec::with_capacity((text.len() / 5 + 1).min(MAX_TOKENS)));
    let mut anchors = Vec::new();
    let mut sentence_start = true;
    for piece in split_blocks(text) {
        match piece {
            Piece::Masked(mask) => {
                out.push(Token::Mask(mask));
                sentence_start = false;
            }
            Piece::Anchor(body) => {
                anchor_words(body, |word| {
                    anchors.push(word.clone());
                    out.push(Token::Word(word));
                });
                sentence_start = false;
            }
            Piece::Text(text) => tokenize_prose(text, &mut sentence_start, &mut out),
        }
        if out.full() {
            break;
        }
    }
    out.0.truncate(MAX_TOKENS);
    (out.0, anchors)
}

/// The words of an anchor's text: runs of letters and digits, case-folded, none masked.
pub(crate) fn anchor_words(body: &str, mut each: impl FnMut(Word)) {
    for run in body
        .split(|c: char| !c.is_alphanumeric())
        .filter(|r| !r.is_empty())
    {
        each(if run.is_ascii() {
            Word::ascii_lowercase(run)
        } else {
            Word::from(caseless::default_case_fold_str(run))
        });
    }
}

/// The length of an anchor (`【…】`, brackets included) at the start of `rest`, and its text.
pub(crate) fn anchor(rest: &str) -> Option<(&str, usize)> {
    let body = rest.strip_prefix(ANCHOR_OPEN)?;
    let end = body.find(ANCHOR_CLOSE)?;
    Some((
        &body[..end],
        ANCHOR_OPEN.len_utf8() + end + ANCHOR_CLOSE.len_utf8(),
    ))
}

/// Tokens with equal consecutive masks merged.
#[derive(Default)]
struct Tokens(Vec<Token>);

impl Tokens {
    fn push(&mut self, token: Token) {
        if let (Token::Mask(new), Some(Token::Mask(last))) = (&token, self.0.last()) {
            if new == last {
                return;
            }
        }
        self.0.push(token);
    }

    /// At [`MAX_TOKENS`]: later pushes could only append (a merge touches the last token
    /// alone), so the first `MAX_TOKENS` are final and reading can stop.
    fn full(&self) -> bool {
        self.0.len() >= MAX_TOKENS
    }
}

enum Piece<'a> {
    Text(&'a str),
    Masked(Mask),
    Anchor(&'a str),
}

/// Splits out anchors, code blocks, inline code and long quotations.
fn split_blocks(text: &str) -> Vec<Piece<'_>> {
    let mut pieces = Vec::new();
    let mut text_start = 0;
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        let first = rest.as_bytes()[0];
        // Only a backtick or a quote can open a masked block; skip everything else fast.
        if !matches!(first, b'`' | b'"' | b'\'' | 0xC2 | 0xE2 | 0xE3) {
            // Those bytes never continue a UTF-8 sequence: jump to the next one.
            i += text.as_bytes()[i..]
                .iter()
                .position(|b| matches!(b, b'`' | b'"' | b'\'' | 0xC2 | 0xE2 | 0xE3))
                .unwrap_or(text.len() - i);
            continue;
        }
        let block = if let Some((body, len)) = anchor(rest) {
            Some((Piece::Anchor(body), len))
        } else if let Some(body) = rest.strip_prefix("```") {
            Some((
                Piece::Masked(Mask::Code),
                3 + body.find("```").map_or(body.len(), |end| end + 3),
            ))
        } else if let Some(body) = rest.strip_prefix('`') {
            match body.find(['`', '\n']) {
                Some(end) if body.as_bytes()[end] == b'`' => {
                    Some((Piece::Masked(Mask::Code), end + 2))
                }
                _ => None,
            }
        } else {
            long_quote(rest).map(|len| (Piece::Masked(Mask::Document), len))
        };
        match block {
            Some((piece, len)) => {
                if text_start < i {
                    pieces.push(Piece::Text(&text[text_start..i]));
                }
                pieces.push(piece);
                i += len;
                text_start = i;
            }
            None => i += rest.chars().next().map_or(1, char::len_utf8),
        }
    }
    if text_start < text.len() {
        pieces.push(Piece::Text(&text[text_start..]));
    }
    pieces
}

/// Length of a long quoted passage at the start of `rest`, quotes included.
fn long_quote(rest: &str) -> Option<usize> {
    const QUOTES: [(&str, &str); 6] = [
        ("\"\"\"", "\"\"\""),
        ("'''", "'''"),
        ("\"", "\""),
        ("\u{201C}", "\u{201D}"),
        ("\u{AB}", "\u{BB}"),
        ("\u{300C}", "\u{300D}"),
    ];
    for (open, close) in QUOTES {
        if let Some(body) = rest.strip_prefix(open) {
            let end = body.find(close)?;
            return (end >= LONG_QUOTE).then_some(open.len() + end + close.len());
        }
    }
    None
}

fn tokenize_prose(text: &str, sentence_start: &mut bool, out: &mut Tokens) {
    // Byte-wise: ASCII decides itself, and only a byte above 0x7F decodes its character.
    let bytes = text.as_bytes();
    let mut chunk_start: Option<usize> = None;
    let mut i = 0;
    while i < bytes.len() {
        let (whitespace, newline, width) = match bytes[i] {
            b'\n' => (true, true, 1),
            b'\t' | 0x0B | 0x0C | b'\r' | b' ' => (true, false, 1),
            0..=0x7F => (false, false, 1),
            _ => {
                let c = text[i..].chars().next().unwrap_or(' ');
                (c.is_whitespace(), false, c.len_utf8())
            }
        };
        if whitespace {
            if let Some(start) = chunk_start.take() {
                tokenize_chunk(&text[start..i], sentence_start, out);
                if out.full() {
                    return;
                }
            }
            if newline {
                *sentence_start = true;
            }
        } else if chunk_start.is_none() {
            chunk_start = Some(i);
        }
        i += width;
    }
    if let Some(start) = chunk_start {
        tokenize_chunk(&text[start..], sentence_start, out);
    }
}

fn is_punctuation(c: char) -> bool {
    c.is_ascii_punctuation()
        || matches!(c, '\u{2010}'..='\u{2027}' | '\u{2030}'..='\u{205E}' | '\u{3000}'..='\u{303F}'
            | '\u{A1}' | '\u{AB}' | '\u{BB}' | '\u{BF}' | '\u{FF01}'..='\u{FF0F}')
}

fn is_cjk(c: char) -> bool {
    matches!(c, '\u{3040}'..='\u{30FF}' | '\u{3400}'..='\u{4DBF}' | '\u{4E00}'..='\u{9FFF}' | '\u{F900}'..='\u{FAFF}')
}

/// One whitespace-separated chunk: a whole-chunk variable, or words and symbols.
fn tokenize_chunk(chunk: &str, sentence_start: &mut bool, out: &mut Tokens) {
    let core = chunk.trim_matches(|c: char| is_punctuation(c) && c != '@' && c != '#' && c != '$');
    let ends_sentence = chunk
        .trim_end_matches(['"', '\'', ')', '\u{201D}'])
        .ends_with(['.', '!', '?', ':']);
    let starts_sentence = std::mem::replace(sentence_start, ends_sentence);
    if core.is_empty() {
        *sentence_start |= starts_sentence;
        return;
    }
    // Letters only (most chunks): one run, and no whole-chunk variable can match (each
    // needs a digit or punctuation), so it is one word.
    if core.bytes().all(|b| b.is_ascii_alphabetic()) {
        word(core, starts_sentence, out);
        return;
    }
    if let Some(mask) = whole_chunk_mask(core) {
        out.push(Token::Mask(mask));
        return;
    }

    let mut first_word = true;
    let mut run_start: Option<usize> = None;
    for (i, c) in core.char_indices() {
        let in_word = c.is_alphanumeric() && !is_cjk(c)
            || (matches!(c, '\'' | '\u{2019}')
                && run_start.is_some()
                && core[i + c.len_utf8()..]
                    .chars()
                    .next()
                    .is_some_and(char::is_alphabetic));
        if in_word {
            run_start.get_or_insert(i);
            continue;
        }
        if let Some(start) = run_start.take() {
            word(&core[start..i], starts_sentence && first_word, out);
            first_word = false;
        }
        if is_cjk(c) {
            out.push(Token::Word(Word::from(c.encode_utf8(&mut [0; 4]) as &str)));
            first_word = false;
        } else if !is_punctuation(c) && !c.is_whitespace() {
            out.push(Token::Symbol(c));
        }
    }
    if let Some(start) = run_start {
        word(&core[start..], starts_sentence && first_word, out);
    }
}

/// Variables recognised on a whole chunk: URL, e-mail, handle, UUID/hex id, number.
fn whole_chunk_mask(core: &str) -> Option<Mask> {
    // Every rule below needs a digit, an '@', "://" or a "www." start: most chunks are
    // plain words, settled by one byte scan.
    if !core
        .bytes()
        .any(|b| b.is_ascii_digit() || b == b'@' || b == b':' || b == b'.')
    {
        return None;
    }
    let lower_starts = |prefix: &str| {
        core.get(..prefix.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(prefix))
    };
    if contains_scheme_separator(core) || lower_starts("www.") {
        return Some(Mask::Url);
    }
    if let Some(at) = core.find('@') {
        let (local, domain) = (&core[..at], &core[at + 1..]);
        if at == 0 && core.len() > 1 {
            return Some(Mask::Id);
        }
        if !local.is_empty() && domain.contains('.') && !domain.contains('@') {
            return Some(Mask::Email);
        }
    }
    let has_digit = core.bytes().any(|b| b.is_ascii_digit());
    if !has_digit {
        return None;
    }
    if core
        .chars()
        .all(|c| c.is_ascii_digit() || ".,:/-+%$#\u{20AC}\u{A3}\u{A5}'".contains(c))
    {
        return Some(Mask::Number);
    }
    // Codes joined by '-' or '_' with letters and digits: pod names, SKUs, ticket ids.
    if core.contains(['-', '_']) && core.chars().any(char::is_alphabetic) && core.len() >= 6 {
        return Some(Mask::Id);
    }
    let hex_digits = core.bytes().filter(u8::is_ascii_hexdigit).count();
    if hex_digits >= 8 && core.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
        return Some(Mask::Id);
    }
    None
}

/// True when `core` contains "://" (a byte scan; `str::contains` sets up a searcher).
fn contains_scheme_separator(core: &str) -> bool {
    core.as_bytes().windows(3).any(|w| w == b"://")
}

/// A run of letters and digits: a number, a code, a name or a plain word.
fn word(run: &str, starts_sentence: bool, out: &mut Tokens) {
    let digits = run.bytes().filter(u8::is_ascii_digit).count();
    if digits == run.len() {
        return out.push(Token::Mask(Mask::Number));
    }
    if digits > 0 {
        let suffix = run.trim_start_matches(|c: char| c.is_ascii_digit());
        let quantity = run.starts_with(|c: char| c.is_ascii_digit())
            && !suffix.contains(|c: char| c.is_ascii_digit())
            && suffix.len() <= 3;
        return out.push(Token::Mask(if quantity { Mask::Number } else { Mask::Id }));
    }
    if !starts_sentence && looks_like_name(run) {
        return out.push(Token::Mask(Mask::Name));
    }
    out.push(Token::Word(if run.is_ascii() {
        Word::ascii_lowercase(run)
    } else {
        Word::from(caseless::default_case_fold_str(run))
    }));
}

/// Capitalised with no other capitals ("Paris", not "SREs" or "ATM"), and not the
/// pronoun "I" or its contractions.
fn looks_like_name(run: &str) -> bool {
    let mut chars = run.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    if !first.is_uppercase() || run == "I" || run.starts_with("I'") || run.starts_with("I\u{2019}")
    {
        return false;
    }
    let rest = chars.as_str();
    rest.chars().any(char::is_lowercase) && !rest.chars().any(char::is_uppercase)
}

#[cfg(test)]
mod reference;

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(text: &str) -> Vec<String> {
        tokenize(text)
            .iter()
            .map(|t| t.as_text().into_owned())
            .collect()
    }

    #[test]
    fn anchors_keep_their_words_and_are_returned() {
        let text = "Based on Mary's history recommend \u{3010}Electronics 4K\u{3011} products";
        assert_eq!(
            texts(text),
            [
                "based",
                "on",
                "<name>",
                "history",
                "recommend",
                "electronics",
                "4k",
                "products"
            ]
        );
        let (_, anchors) = tokenize_anchored(text);
        let anchors: Vec<&str> = anchors.iter().map(Word::as_str).collect();
        assert_eq!(anchors, ["electronics", "4k"]);
        // Without the brackets the value is a name, and an unclosed bracket is punctuation.
        assert_eq!(texts("recommend Electronics products")[1], "<name>");
        assert_eq!(
            texts("recommend \u{3010}Electronics products"),
            ["recommend", "<name>", "products"]
        );
        assert!(tokenize_anchored("no anchors here").1.is_empty());
    }

    #[test]
    fn plain_words_are_folded() {
        assert_eq!(
            texts("How do I reset my PIN?"),
            ["how", "do", "i", "reset", "my", "pin"]
        );
    }

    #[test]
    fn urls_emails_handles_and_ids() {
        assert_eq!(
            texts("see https://x.io/a?b=1 or www.example.com, mail bob.s@corp.co.uk or @bob"),
            ["see", "<url>", "or", "<url>", "mail", "<email>", "or", "<id>"]
        );
        assert_eq!(
            texts("order 550e8400-e29b-41d4-a716-446655440000 and AB12CD9 and deadbeef42"),
            ["order", "<id>", "and", "<id>", "and", "<id>"]
        );
    }

    #[test]
    fn numbers_dates_amounts_quantities() {
        assert_eq!(
            texts("pay $1,299.50 on 12/05/2024 at 10:30, the 3rd time, 5kg and 42"),
            [
                "pay", "<num>", "on", "<num>", "at", "<num>", "the", "<num>", "time", "<num>",
                "and", "<num>"
            ]
        );
    }

    #[test]
    fn names_mid_sentence_are_masked_and_merged() {
        assert_eq!(
            texts("Send it to Mary Ann Smith. Then call me"),
            ["send", "it", "to", "<name>", "then", "call", "me"]
        );
        assert_eq!(texts("I'm using the ATM"), ["i'm", "using", "the", "atm"]);
    }

    #[test]
    fn code_and_long_quotes_are_masked() {
        let quote = "lorem ipsum ".repeat(20);
        let text = format!(
            "fix ```fn main() {{}}``` and `x+1` then summarise \"{quote}\" please, \"short\""
        );
        assert_eq!(
            texts(&text),
            [
                "fix",
                "<code>",
                "and",
                "<code>",
                "then",
                "summarise",
                "<doc>",
                "please",
                "short"
            ]
        );
    }

    #[test]
    fn emoji_and_cjk_are_tokens() {
        assert_eq!(texts("great 🙂🙂 job"), ["great", "🙂", "🙂", "job"]);
        assert_eq!(texts("我想退款"), ["我", "想", "退", "款"]);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 2048, ..Default::default() })]

        /// The single-pass tokenizer returns exactly what the original one returns.
        #[test]
        fn tokenize_matches_the_reference(text in crate::test_text::any_text()) {
            proptest::prop_assert_eq!(tokenize(&text), reference::tokenize(&text));
            let normalized = crate::normalize::normalize(&text);
            proptest::prop_assert_eq!(tokenize(&normalized), reference::tokenize(&normalized));
        }
    }

    #[test]
    fn tokenize_matches_the_reference_past_the_token_limit() {
        for text in [
            "word ".repeat(MAX_TOKENS + 10),
            "a 1 ".repeat(MAX_TOKENS),
            format!("{} Mary Ann tail", "x ".repeat(MAX_TOKENS - 1)),
            "🙂".repeat(MAX_TOKENS + 3),
            format!("{}```code```", "y ".repeat(MAX_TOKENS)),
        ] {
            assert_eq!(tokenize(&text), reference::tokenize(&text));
        }
    }

    #[test]
    fn unterminated_blocks_do_not_panic() {
        assert_eq!(texts("```never closed"), ["<code>"]);
        assert_eq!(texts("`open"), ["open"]);
        assert_eq!(texts("\"open"), ["open"]);
        assert!(texts("").is_empty());
    }
}
