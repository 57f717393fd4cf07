//! The masking tokenizer as it was before the single-pass rewrite (commit 0f41482), kept
//! verbatim as the test oracle: `super::tests` checks on arbitrary and adversarial text
//! that [`super::tokenize`] returns exactly what this returns. Anchors (`【…】`, added
//! after the rewrite) are split out by the same helpers as there.

use super::{anchor, anchor_words, Mask, Token, LONG_QUOTE, MAX_TOKENS};

/// Tokenises normalised text with variables masked.
pub fn tokenize(text: &str) -> Vec<Token> {
    let mut out = Tokens::default();
    let mut sentence_start = true;
    for piece in split_blocks(text) {
        match piece {
            Piece::Masked(mask) => {
                out.push(Token::Mask(mask));
                sentence_start = false;
            }
            Piece::Anchor(body) => {
                anchor_words(body, |word| out.push(Token::Word(word)));
                sentence_start = false;
            }
            Piece::Text(text) => tokenize_prose(text, &mut sentence_start, &mut out),
        }
        if out.0.len() >= MAX_TOKENS {
            break;
        }
    }
    out.0.truncate(MAX_TOKENS);
    out.0
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
}

enum Piece<'a> {
    Text(&'a str),
    Masked(Mask),
    Anchor(&'a str),
}

/// Splits out code blocks, inline code and long quotations.
fn split_blocks(text: &str) -> Vec<Piece<'_>> {
    let mut pieces = Vec::new();
    let mut text_start = 0;
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        let first = rest.as_bytes()[0];
        // Only a backtick or a quote can open a masked block; skip everything else fast.
        if !matches!(first, b'`' | b'"' | b'\'' | 0xC2 | 0xE2 | 0xE3) {
            i += 1;
            while i < text.len() && !text.is_char_boundary(i) {
                i += 1;
            }
            continue;
        }
        if let Some((body, len)) = anchor(rest) {
            if text_start < i {
                pieces.push(Piece::Text(&text[text_start..i]));
            }
            pieces.push(Piece::Anchor(body));
            i += len;
            text_start = i;
            continue;
        }
        let masked = if let Some(body) = rest.strip_prefix("```") {
            Some((
                Mask::Code,
                3 + body.find("```").map_or(body.len(), |end| end + 3),
            ))
        } else if let Some(body) = rest.strip_prefix('`') {
            match body.find(['`', '\n']) {
                Some(end) if body.as_bytes()[end] == b'`' => Some((Mask::Code, end + 2)),
                _ => None,
            }
        } else {
            long_quote(rest).map(|len| (Mask::Document, len))
        };
        match masked {
            Some((mask, len)) => {
                if text_start < i {
                    pieces.push(Piece::Text(&text[text_start..i]));
                }
                pieces.push(Piece::Masked(mask));
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
    let mut chunk_start: Option<usize> = None;
    for (i, c) in text
        .char_indices()
        .chain(std::iter::once((text.len(), ' ')))
    {
        if c.is_whitespace() {
            if let Some(start) = chunk_start.take() {
                tokenize_chunk(&text[start..i], sentence_start, out);
            }
            if c == '\n' {
                *sentence_start = true;
            }
        } else if chunk_start.is_none() {
            chunk_start = Some(i);
        }
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
    if let Some(mask) = whole_chunk_mask(core) {
        out.push(Token::Mask(mask));
        return;
    }

    let mut first_word = true;
    let mut run_start: Option<usize> = None;
    let chars: Vec<(usize, char)> = core.char_indices().collect();
    for (n, &(i, c)) in chars.iter().enumerate() {
        let in_word = c.is_alphanumeric() && !is_cjk(c)
            || (matches!(c, '\'' | '\u{2019}')
                && run_start.is_some()
                && chars
                    .get(n + 1)
                    .is_some_and(|(_, next)| next.is_alphabetic()));
        if in_word {
            run_start.get_or_insert(i);
            continue;
        }
        if let Some(start) = run_start.take() {
            word(&core[start..i], starts_sentence && first_word, out);
            first_word = false;
        }
        if is_cjk(c) {
            out.push(Token::Word(c.to_string().into()));
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
    let lower_starts = |prefix: &str| {
        core.get(..prefix.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(prefix))
    };
    if core.contains("://") || lower_starts("www.") {
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
    out.push(Token::Word(
        if run.is_ascii() {
            run.to_ascii_lowercase()
        } else {
            caseless::default_case_fold_str(run)
        }
        .into(),
    ));
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
