//! Test data: the live messages of the real vLLM 0.32.0 recording kept by the
//! `cohort-kv-events` crate (`kv-events/tests/fixtures/vllm/stream.jsonl`, recorded by
//! `scripts/vllm-kv-events`: vLLM on CPU, block size 128, topic `kv`), as frames.

/// Each live message's frames `[topic, seq, payload]`, in order (seq 0 to 8).
pub fn live_messages() -> Vec<Vec<Vec<u8>>> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/kv-events/tests/fixtures/vllm/stream.jsonl"
    );
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .map(|line| {
            let record: serde_json::Value = serde_json::from_str(line).unwrap();
            record["frames"]
                .as_array()
                .unwrap()
                .iter()
                .map(|frame| hex(frame.as_str().unwrap()))
                .collect()
        })
        .collect()
}

/// The payloads of [`live_messages`], by sequence number.
pub fn payloads() -> Vec<Vec<u8>> {
    live_messages()
        .into_iter()
        .map(|mut m| m.remove(2))
        .collect()
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}
