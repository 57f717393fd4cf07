//! The repository speaks of the product as it is now: history of the work belongs in git
//! and in the closing notes, not in docs, comments or scripts.
//!
//! A line breaks the rule when it:
//! - cites a tracker issue by its number;
//! - counts rounds of work by ordinal (sessions, rounds, builds, numbered runs);
//! - dates a try, or, outside docs/DECISIONS.md (where choices tried and left out are
//!   recorded), reports one;
//! - cites a document outside the repository.
//!
//! The patterns are in [`rules`]. The product's own words stay: user sessions, conversation
//! sessions, the `x-cohort-session` header; a *session* is flagged only where it is a
//! session of work. Dates that go with a current result (its date, commit and machine) are
//! wanted and not flagged.
//!
//! The tests below write their samples with a `·` inside a word, removed before the check,
//! so that this file holds no line that breaks the rules it tests.

use regex::Regex;
use std::sync::OnceLock;

/// One rule: its name and the pattern that breaks it.
struct Rule {
    name: &'static str,
    pattern: Regex,
    /// Whether docs/DECISIONS.md may say it (choices tried and left out belong there).
    allowed_in_decisions: bool,
}

fn rules() -> &'static [Rule] {
    static RULES: OnceLock<Vec<Rule>> = OnceLock::new();
    RULES.get_or_init(|| {
        let rule = |name, pattern: &str, allowed_in_decisions| Rule {
            name,
            pattern: Regex::new(pattern).expect("a valid pattern"),
            allowed_in_decisions,
        };
        const ORDINAL: &str = r"(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth|fifteenth|\d+(st|nd|rd|th))";
        vec![
            rule("tracker issue number", r"(?i)\bissues?\s+#?\d+\b|\(#\d+\)", false),
            rule(
                "round of work by ordinal",
                &format!(r"(?i)\b{ORDINAL}\s+(session|round|sitting|iteration)s?\b|\b{ORDINAL}'s\s+build\b|\bon\s+the\s+{ORDINAL}\s+build\b"),
                false,
            ),
            rule(
                "session of work",
                r"(?i)\b(this|previous|earlier|later|prior|next)\s+session\b|\bsessions?\s+(note|ago)\b|\bsession\s+\d+\b",
                false,
            ),
            rule("numbered runs", r"(?i)\bruns\s+\d+\s*(–|-|to)\s*\d+\b", false),
            rule(
                "dated try",
                r"(?i)\btried\b[^.]{0,60}\b20\d\d-\d\d-\d\d\b|\b20\d\d-\d\d-\d\d\b[^.]{0,40}\btried\b|\buntil\s+20\d\d-\d\d-\d\d\b",
                false,
            ),
            rule("tried and left out", r"(?i)\b(was|were)\s+tried\b", true),
            rule(
                "document outside the repository",
                r"\bDESIGN\.md\b|\.\./shared\b|\bDEVELOPERS\.md\b",
                false,
            ),
        ]
    })
}

/// The rules `line` breaks, by name (empty: none).
pub fn broken_rules(line: &str, in_decisions: bool) -> Vec<&'static str> {
    rules()
        .iter()
        .filter(|r| !(in_decisions && r.allowed_in_decisions) && r.pattern.is_match(line))
        .map(|r| r.name)
        .collect()
}

/// Whether the check reads a file of this (repository-relative) path: docs, sources,
/// scripts and configuration; not data, lock files or binary artefacts.
pub fn is_checked(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    let checked_ext = [
        ".md", ".rs", ".py", ".sh", ".toml", ".yaml", ".yml", ".js", ".cu", ".proto", ".json",
    ];
    if name == "Cargo.lock" || name.ends_with(".lock") {
        return false;
    }
    if checked_ext.iter().any(|e| name.ends_with(e)) {
        return true;
    }
    // Extensionless scripts.
    (path.starts_with("scripts/") || path.starts_with(".ci/")) && !name.contains('.')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sample line: `·` marks where a word was split so the source does not match.
    fn sample(line: &str) -> String {
        line.replace('·', "")
    }

    #[test]
    fn history_is_caught() {
        for line in [
            "Benchmarks against the peers (iss·ue 8)",
            "see Iss·ue 20's test",
            "fixed in (#·23)",
            "measured in the ten·th session",
            "ru·ns 14–16 on the eleven·th's build",
            "on the ten·th build, the parser",
            "the 3·rd round of tuning",
            "In th·is session we measured",
            "Sess·ion note (2026-12-06)",
            "twenty fresh runs, ru·ns 12-16 on another machine",
            "was tr·ied (2026-12-06) and changed nothing",
            "the owner came before the room unt·il 2026-12-06",
            "A floor of the wait was tr·ied and dropped",
            "One comment still cites DES·IGN.md",
            "read ../sha·red/data/README.md",
        ] {
            let line = sample(line);
            assert!(!broken_rules(&line, false).is_empty(), "missed: {line}");
        }
    }

    #[test]
    fn the_products_words_stay() {
        for line in [
            "requests with a user session get warm-ups",
            "the `x-cohort-session` header names the session",
            "Mooncake conversation sessions replay turn by turn",
            "A third user session shares the prefix",
            "sessions per tenant are capped",
            "measured 2026-12-06 on main 3468a73, 2-core machine",
            "each replica has tried every slot",
            "the first pass over the body",
            "run 2 replicas",
        ] {
            assert!(broken_rules(line, false).is_empty(), "flagged: {line}");
        }
    }

    #[test]
    fn decisions_may_say_what_was_tried() {
        let line = sample("A floor of the wait was tr·ied and dropped.");
        assert!(broken_rules(&line, true).is_empty());
        assert!(!broken_rules(&sample("cited in iss·ue 9"), true).is_empty());
    }

    #[test]
    fn data_and_locks_are_not_read() {
        assert!(is_checked("docs/README.md"));
        assert!(is_checked("scripts/setup"));
        assert!(is_checked("filter/src/http.rs"));
        assert!(!is_checked("Cargo.lock"));
        assert!(!is_checked("scripts/distill/data.bin"));
    }
}
