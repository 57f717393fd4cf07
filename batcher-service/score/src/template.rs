//! Linting a prompt template.
//!
//! Placeholders recognised: `{{ … }}` and `{% … %}` (Jinja, Mustache), `${name}`, and
//! `{name}` (Python format strings; `{` followed by an identifier and `}`). What an engine
//! reuses between two renderings is the static text before the first placeholder, in
//! whole cache blocks (256 bytes here, like the filter's blocks); everything after the
//! first variable is recomputed per request.
//!
//! - `reusable_bytes` = the static prefix rounded down to whole cache blocks (64 bytes by
//!   default ≈ 16 tokens, vLLM's block);
//! - `expected_bytes` = all static text + `variable_bytes` per placeholder (the expected
//!   size of what fills it; 256 by default);
//! - `score = reusable_bytes / expected_bytes`;
//! - `prefix_entropy_bits` = the Shannon information of the shared prefix's words
//!   (`Σ −log2 p(word)` over its words, `p` their frequency in the prefix): a short or
//!   repetitive prefix carries little, however long the template is.
//!
//! Findings name what to change: a variable at the very start, a time- or id-like
//! variable inside the first blocks, a prefix too small to fill one cache block, and a
//! variable whose values masking erases from the intent text (a capitalised category is a
//! `<name>`), which puts every value in one cohort unless the template anchors it
//! (`【{category}】`, [`cohort_fingerprint::mask`]).

use cohort_fingerprint::{IntentSketch, SemanticMode};
use serde::Serialize;
use std::collections::HashMap;

/// Cache block size the reusable prefix is rounded to by default, bytes.
pub const DEFAULT_BLOCK_BYTES: usize = super::corpus::DEFAULT_BLOCK_BYTES;
/// Default expected size of one placeholder's value, bytes.
pub const DEFAULT_VARIABLE_BYTES: usize = 256;
/// Below this much information the shared prefix is reported as low-entropy.
pub const LOW_ENTROPY_BITS: f64 = 64.0;

/// Variable names that change on every request.
const VOLATILE: [&str; 10] = [
    "now",
    "date",
    "time",
    "timestamp",
    "today",
    "uuid",
    "request_id",
    "id",
    "nonce",
    "random",
];

/// One placeholder: its byte range in the template and its name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Placeholder {
    pub start: usize,
    pub end: usize,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TemplateReport {
    pub template_bytes: usize,
    pub static_bytes: usize,
    pub placeholders: usize,
    /// Static bytes before the first placeholder.
    pub prefix_bytes: usize,
    pub reusable_bytes: usize,
    pub expected_bytes: usize,
    pub prefix_entropy_bits: f64,
    pub score: f64,
    pub findings: Vec<String>,
}

/// Finds the placeholders of `text`, in order.
pub fn placeholders(text: &str) -> Vec<Placeholder> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        let close = if rest.starts_with("{{") {
            rest.find("}}").map(|e| (e + 2, rest[2..e].trim()))
        } else if rest.starts_with("{%") {
            rest.find("%}").map(|e| (e + 2, rest[2..e].trim()))
        } else if rest.starts_with("${") {
            rest.find('}').map(|e| (e + 1, rest[2..e].trim()))
        } else if rest.starts_with('{') {
            rest.find('}')
                .filter(|&e| e > 1 && is_identifier(&rest[1..e]))
                .map(|e| (e + 1, &rest[1..e]))
        } else {
            None
        };
        match close {
            Some((len, name)) => {
                found.push(Placeholder {
                    start: i,
                    end: i + len,
                    name: name.to_owned(),
                });
                i += len;
            }
            None => i += rest.chars().next().map_or(1, char::len_utf8),
        }
    }
    found
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

fn entropy_bits(text: &str) -> f64 {
    let words: Vec<String> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for w in &words {
        *counts.entry(w).or_default() += 1;
    }
    let n = words.len() as f64;
    let bits: f64 = counts
        .values()
        .map(|&c| {
            let p = c as f64 / n;
            -(c as f64) * p.log2()
        })
        .sum();
    // One repeated word sums to -0.0; report it as 0.
    if bits > 0.0 {
        bits
    } else {
        0.0
    }
}

/// Two values a behaviour-selecting variable might take (a product category, a mode).
const PROBES: [&str; 2] = ["Electronics", "Gardening"];

/// Variable names (last dotted part, lowercase, `_`-separated words) that usually select
/// the behaviour asked for rather than fill in data: a template cannot say which of its
/// variables do, so the finding is limited to these.
const SELECTORS: [&str; 16] = [
    "category",
    "type",
    "kind",
    "mode",
    "style",
    "tone",
    "topic",
    "genre",
    "intent",
    "action",
    "task",
    "segment",
    "tier",
    "plan",
    "language",
    "department",
];

fn is_selector(name: &str) -> bool {
    let lower = name.to_lowercase();
    let base = lower.rsplit('.').next().unwrap_or(&lower);
    base.split('_').any(|word| SELECTORS.contains(&word))
}

/// The behaviour-selecting variables ([`SELECTORS`]) whose value masking erases: rendered
/// with each of [`PROBES`] (every other variable as `x`), the template gives the same masked
/// tokens, so the value cannot tell cohorts apart. The whole rendering stands in for the
/// intent text. A variable inside an anchor (`【…】`) keeps its words and is never reported.
fn erased_variables(text: &str, found: &[Placeholder]) -> Vec<String> {
    let mut names: Vec<&str> = Vec::new();
    for p in found {
        if is_selector(&p.name) && !names.contains(&p.name.as_str()) {
            names.push(&p.name);
        }
    }
    let render = |probe_name: &str, probe: &str| {
        let mut out = String::with_capacity(text.len());
        let mut at = 0;
        for p in found {
            out.push_str(&text[at..p.start]);
            out.push_str(if p.name == probe_name { probe } else { "x" });
            at = p.end;
        }
        out.push_str(&text[at..]);
        IntentSketch::of_text(&out, SemanticMode::Intent).tokens
    };
    names
        .into_iter()
        .filter(|name| render(name, PROBES[0]) == render(name, PROBES[1]))
        .map(str::to_owned)
        .collect()
}

/// Analyses one template.
pub fn analyse(text: &str, variable_bytes: usize, block_bytes: usize) -> TemplateReport {
    let block_bytes = block_bytes.max(1);
    let found = placeholders(text);
    let placeholder_bytes: usize = found.iter().map(|p| p.end - p.start).sum();
    let static_bytes = text.len() - placeholder_bytes;
    let prefix_bytes = found.first().map_or(text.len(), |p| p.start);
    let reusable_bytes = prefix_bytes / block_bytes * block_bytes;
    let expected_bytes = static_bytes + found.len() * variable_bytes;
    let prefix_entropy_bits = entropy_bits(&text[..prefix_bytes]);
    let score = if expected_bytes == 0 {
        0.0
    } else {
        reusable_bytes as f64 / expected_bytes as f64
    };
    let mut findings = Vec::new();
    if let Some(first) = found.first() {
        if first.start == 0 || text[..first.start].trim().is_empty() {
            findings.push(format!(
                "starts with the variable {{{}}}: nothing before it can be cached; move variables after the fixed instructions",
                first.name
            ));
        }
    }
    for p in found.iter().filter(|p| p.start < 1024) {
        let lower = p.name.to_lowercase();
        let base = lower.rsplit('.').next().unwrap_or(&lower);
        if VOLATILE.contains(&base) {
            findings.push(format!(
                "{{{}}} at byte {} changes on every request and ends the shared prefix there; move it to the end",
                p.name, p.start
            ));
        }
    }
    if prefix_bytes < block_bytes && !found.is_empty() {
        findings.push(format!(
            "the fixed prefix is {prefix_bytes} bytes, less than one {block_bytes}-byte cache block"
        ));
    }
    if prefix_entropy_bits < LOW_ENTROPY_BITS {
        findings.push(format!(
            "low-entropy prefix: {prefix_entropy_bits:.0} bits shared by every rendering"
        ));
    }
    findings.extend(erased_variables(text, &found).into_iter().map(|name| {
        format!(
            "{{{name}}}: a capitalised value (e.g. `{}`) is masked as <name> in the intent text, \
             so requests that differ only in it share one cohort; if it selects the behaviour, \
             anchor it: 【{{{name}}}】",
            PROBES[0]
        )
    }));
    TemplateReport {
        template_bytes: text.len(),
        static_bytes,
        placeholders: found.len(),
        prefix_bytes,
        reusable_bytes,
        expected_bytes,
        prefix_entropy_bits,
        score,
        findings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SYSTEM: &str = "You are the support assistant of the Example Bank. Answer in two sentences, cite the policy section, never reveal account numbers, and offer the secure-message link when a customer is locked out. Escalate fraud reports to a human agent at once, and keep a friendly, precise tone in every language the customer writes in. ";

    #[test]
    fn a_masked_behaviour_selecting_variable_is_found_and_an_anchored_one_is_not() {
        // {history} is masked too, but it fills in data: only selector names are reported.
        let plain = "Based on my history {history} recommend {category} products.";
        let report = analyse(plain, DEFAULT_VARIABLE_BYTES, DEFAULT_BLOCK_BYTES);
        let erased: Vec<&String> = report
            .findings
            .iter()
            .filter(|f| f.contains("is masked as <name>"))
            .collect();
        assert_eq!(erased.len(), 1, "{:?}", report.findings);
        assert!(erased[0].starts_with("{category}"), "{}", erased[0]);
        let anchored =
            "Based on my history {history} recommend \u{3010}{category}\u{3011} products.";
        let report = analyse(anchored, DEFAULT_VARIABLE_BYTES, DEFAULT_BLOCK_BYTES);
        assert!(
            !report
                .findings
                .iter()
                .any(|f| f.contains("is masked as <name>")),
            "{:?}",
            report.findings
        );
    }

    #[test]
    fn finds_every_placeholder_syntax() {
        let found =
            placeholders("a {{ user.name }} b {% if x %} c ${var} d {q} e {not json: 1} {}");
        let names: Vec<_> = found.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["user.name", "if x", "var", "q"]);
        assert_eq!(
            &"a {{ user.name }}"[found[0].start..found[0].end],
            "{{ user.name }}"
        );
    }

    #[test]
    fn a_long_fixed_instruction_first_scores_high() {
        let good = format!("{SYSTEM}{SYSTEM}\nCustomer question: {{question}}");
        let report = analyse(&good, DEFAULT_VARIABLE_BYTES, DEFAULT_BLOCK_BYTES);
        assert!(report.score > 0.5, "{report:?}");
        assert!(report.findings.is_empty(), "{:?}", report.findings);
        assert!(report.prefix_entropy_bits > LOW_ENTROPY_BITS);
    }

    #[test]
    fn low_entropy_and_variable_first_templates_score_low_and_say_why() {
        let tiny = analyse(
            "Q: {question}\nA:",
            DEFAULT_VARIABLE_BYTES,
            DEFAULT_BLOCK_BYTES,
        );
        assert_eq!(tiny.score, 0.0);
        assert!(tiny.findings.iter().any(|f| f.contains("low-entropy")));
        let first = analyse(
            &format!("{{question}}\n{SYSTEM}{SYSTEM}"),
            DEFAULT_VARIABLE_BYTES,
            DEFAULT_BLOCK_BYTES,
        );
        assert_eq!(first.score, 0.0);
        assert!(first.findings[0].contains("starts with the variable {question}"));
        let dated = analyse(
            &format!("Today is {{today}}. {SYSTEM}{SYSTEM}{{question}}"),
            256,
            64,
        );
        assert!(dated.findings.iter().any(|f| f.contains("{today}")));
        assert!(dated.score < 0.1);
        // Repetition is long but carries nothing.
        let filler = analyse(&format!("{}{{question}}", "ok ".repeat(200)), 256, 64);
        assert!(filler.prefix_entropy_bits < 1.0);
        assert!(filler.findings.iter().any(|f| f.contains("low-entropy")));
    }

    #[test]
    fn a_template_without_variables_is_all_prefix() {
        let report = analyse(
            &SYSTEM.repeat(3),
            DEFAULT_VARIABLE_BYTES,
            DEFAULT_BLOCK_BYTES,
        );
        assert_eq!(report.placeholders, 0);
        assert_eq!(report.prefix_bytes, SYSTEM.len() * 3);
        assert!(report.score > 0.7, "{report:?}");
    }
}
