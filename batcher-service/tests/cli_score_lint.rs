//! `cohort score` and `cohort lint` end to end: the real binary on files and globs, table
//! and JSON output, and the CI exit code.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

fn cohort(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cohort"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cohort-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const SYSTEM: &str = "You are the support assistant of the Example Bank. Answer in two sentences, cite the policy section, never reveal account numbers, and offer the secure-message link when a customer is locked out. Escalate fraud reports to a human agent at once. ";

#[test]
fn lint_fails_a_low_entropy_template_and_passes_a_good_one() {
    let dir = scratch("lint");
    let good = dir.join("good.j2");
    let bad = dir.join("bad.j2");
    std::fs::write(
        &good,
        format!("{SYSTEM}{SYSTEM}\nCustomer: {{{{ question }}}}"),
    )
    .unwrap();
    std::fs::write(&bad, "Q: {{ question }}\nA:").unwrap();
    let path = |p: &Path| p.to_string_lossy().into_owned();

    let (code, out, _) = cohort(&["lint", &path(&good)]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(" ok"), "{out}");

    let (code, out, _) = cohort(&["lint", &path(&bad)]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("FAIL") && out.contains("low-entropy"), "{out}");

    // A glob takes both; JSON says which failed; --min-score 0 lets everything pass.
    let glob = format!("{}/*.j2", dir.display());
    let (code, out, _) = cohort(&["lint", &glob, "--format", "json"]);
    assert_eq!(code, 1);
    let report: Value = serde_json::from_str(&out).unwrap();
    let scores: Vec<(String, f64)> = report["templates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["template"]
                    .as_str()
                    .unwrap()
                    .rsplit('/')
                    .next()
                    .unwrap()
                    .to_owned(),
                t["report"]["score"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(scores[0].0, "bad.j2");
    assert!(scores[0].1 < 0.3 && scores[1].1 > 0.3, "{scores:?}");
    assert_eq!(cohort(&["lint", &glob, "--min-score", "0"]).0, 0);
    let (code, _, err) = cohort(&["lint", &format!("{}/*.none", dir.display())]);
    assert_eq!(code, 1);
    assert!(err.contains("matches no file"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn score_ranks_instruction_first_above_variable_first() {
    let dir = scratch("score");
    let corpus = dir.join("requests.jsonl");
    let questions = [
        "how do I reset my card pin",
        "my card was blocked, what now",
        "can I raise my daily limit",
        "where do I see my statements",
    ];
    // Two copies of the system prompt: with one, the shared share of each short prompt
    // depends on where the 64-byte block boundary falls after it (3 or 4 of 5 blocks).
    let system = SYSTEM.repeat(2);
    let mut lines = Vec::new();
    for q in questions {
        lines.push(json!({"service": "instruction-first", "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": q}]}));
        lines.push(json!({"service": "variable-first", "messages": [
            {"role": "user", "content": format!("{q}\n{system}")}]}));
    }
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    std::fs::write(&corpus, text.join("\n") + "\n").unwrap();
    let file = corpus.to_string_lossy().into_owned();
    let (code, out, _) = cohort(&["score", &file, "--group-by", "service", "--format", "json"]);
    let report: Value = serde_json::from_str(&out).unwrap();
    let groups = report["groups"].as_array().unwrap();
    assert_eq!(groups[0]["group"], "instruction-first", "{out}");
    assert_eq!(groups[1]["group"], "variable-first");
    assert!(groups[0]["score"]["prefix_reuse"].as_f64().unwrap() > 0.5);
    assert_eq!(groups[1]["score"]["prefix_reuse"].as_f64().unwrap(), 0.0);
    assert_eq!(code, 1, "variable-first is below 0.3");
    // The effective cost per prompt token: the instruction-first prompts reuse most of
    // theirs and cost less; the variable-first ones reuse nothing: base × (1 + penalty).
    let cost = |g: &Value| g["effective_cost"].as_f64().unwrap();
    assert!(cost(&groups[0]) < 0.5, "{out}");
    assert_eq!(cost(&groups[1]), 1.5);
    assert_eq!(report["cost_model"]["miss_penalty"], 0.5);
    // Its coefficients act.
    let (_, out, _) = cohort(&[
        "score",
        &file,
        "--group-by",
        "service",
        "--format",
        "json",
        "--cost-base",
        "2",
        "--cost-miss-penalty",
        "0",
    ]);
    let priced: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(priced["groups"][1]["effective_cost"], 2.0);
    let (code, table, _) = cohort(&["score", &file, "--group-by", "service", "--min-score", "0"]);
    assert_eq!(code, 0);
    assert!(table.starts_with("group"), "{table}");
    assert!(table.contains("eff. cost"), "{table}");
    std::fs::remove_dir_all(dir).unwrap();
}
