//! `cohort fingerprint` end to end: the real binary, stdin and files, JSONL and table.

mod common;

use common::cohort;

fn records(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

const INPUT: &str = concat!(
    r#"{"model":"m","messages":[{"role":"system","content":"You are a bank."},{"role":"user","content":"Refund order 42 please"}]}"#,
    "\n",
    r#"{"text":"refund order 77 please","label":"refund"}"#,
    "\n\n",
    "{broken\n",
    r#"{"model":"m","messages":[{"role":"system","content":"You are a bank."},{"role":"user","content":"Where is my card?"}]}"#,
    "\n",
);

#[test]
fn stdin_to_jsonl_with_a_record_per_non_blank_line() {
    let (ok, stdout, _) = cohort(&["fingerprint"], INPUT);
    assert!(ok);
    let records = records(&stdout);
    let lines: Vec<u64> = records
        .iter()
        .map(|r| r["line"].as_u64().unwrap())
        .collect();
    assert_eq!(lines, [1, 2, 4, 5]);

    let body = &records[0];
    assert_eq!(body["api"], "openai.chat_completions");
    assert_eq!(body["anchor"], "stable_prefix");
    assert_eq!(body["routing_key"].as_str().unwrap().len(), 16);
    assert_eq!(body["sketch"].as_str().unwrap().len(), 43);
    assert_eq!(body["sketch_i8"].as_array().unwrap().len(), 32);
    assert_eq!(body["intent_text"], "refund order <num> please");

    let text = &records[1];
    assert_eq!(text["label"], "refund");
    assert_eq!(
        text["sketch"], body["sketch"],
        "same intent, different number: same sketch"
    );

    assert_eq!(records[2]["bypass"], "invalid_json");
    assert!(records[2]["error"]
        .as_str()
        .unwrap()
        .contains("not valid JSON"));

    // Same application, other intent: same routing key (the system prompt's replica).
    assert_eq!(records[3]["routing_key"], body["routing_key"]);
    assert_ne!(records[3]["sketch"], body["sketch"]);
}

#[test]
fn tenant_salts_every_key() {
    let (_, a, _) = cohort(&["fingerprint", "--tenant", "a"], INPUT);
    let (_, b, _) = cohort(&["fingerprint", "--tenant", "b"], INPUT);
    let (a, b) = (records(&a), records(&b));
    assert_ne!(a[0]["routing_key"], b[0]["routing_key"]);
    assert_ne!(a[0]["prefix_blocks"], b[0]["prefix_blocks"]);
    assert_eq!(
        a[0]["sketch"], b[0]["sketch"],
        "the sketch itself is not salted"
    );
}

#[test]
fn file_input_and_table_output() {
    let path = std::env::temp_dir().join(format!("cohort-cli-{}.jsonl", std::process::id()));
    std::fs::write(&path, INPUT).unwrap();
    let (ok, stdout, _) = cohort(
        &["fingerprint", "--format", "table", path.to_str().unwrap()],
        "",
    );
    std::fs::remove_file(&path).unwrap();
    assert!(ok);
    assert!(stdout.starts_with("4 lines, 2 routing keys"), "{stdout}");
    assert!(stdout.contains("bypass: invalid_json"));
}

#[test]
fn a_missing_file_is_a_clear_error() {
    let (ok, _, stderr) = cohort(&["fingerprint", "/nonexistent/requests.jsonl"], "");
    assert!(!ok);
    assert!(
        stderr.contains("opening /nonexistent/requests.jsonl"),
        "{stderr}"
    );
}
