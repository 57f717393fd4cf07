//! Docs, comments and scripts describe the product as it is: no history of the work
//! (rules in `cohort_checks::history`).

use cohort_checks::history::{broken_rules, is_checked};
use cohort_checks::tree::{files, relative, root};

#[test]
fn the_tree_tells_no_history() {
    let mut problems = Vec::new();
    for path in files(&root()) {
        let rel = relative(&path);
        if !is_checked(&rel) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let in_decisions = rel == "docs/DECISIONS.md";
        for (n, line) in text.lines().enumerate() {
            for rule in broken_rules(line, in_decisions) {
                problems.push(format!("{rel}:{}: {rule}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} lines tell history (move the evidence to docs/DECISIONS.md, or the story to \
         the closing note):\n{}",
        problems.len(),
        problems.join("\n")
    );
}
