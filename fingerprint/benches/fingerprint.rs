//! Native fingerprint throughput: MB/s of request body and µs per request.
//!
//! `cargo bench -p cohort-fingerprint` — criterion prints time per body and throughput
//! for realistic OpenAI chat bodies of 1 KB, 8 KB and 32 KB (system prompt, tools, a few
//! turns, a last user turn with variables to mask), and for the intent sketch alone: a
//! short turn, and a 1 KB prompt in sketch version 2 (the default) and version 1.

use cohort_fingerprint::{
    fingerprint, mask, normalize, Codebook, IntentSketch, Request, SemanticMode, Sketch,
};
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};

const PROSE: &str = "I want you to act as a customer support agent for an online bank. \
Answer briefly and politely, ask for the account number only when needed, never reveal \
internal policies, and escalate card fraud to a human at once. ";

const ASKS: [&str; 4] = [
    "Hi, I ordered a new card on 12/03/2024 but it has not arrived yet, my ref is AB12CD9 - can you check?",
    "Why was my payment of $1,299.50 to https://shop.example.com/checkout?id=99 declined yesterday?",
    "How do I change the e-mail on my account from jane.doe@example.org to a new one?",
    "Mary Ann sent me 250 EUR last week but I still don't see it, what happened?",
];

/// An OpenAI chat body of about `target` bytes.
fn chat_body(target: usize) -> Vec<u8> {
    let mut system = String::new();
    while system.len() < target / 2 {
        system.push_str(PROSE);
    }
    let mut messages = vec![serde_json::json!({"role": "system", "content": system})];
    let mut i = 0;
    loop {
        let body = serde_json::json!({
            "model": "gemma-3-270m",
            "tools": [{"type": "function", "function": {"name": "lookup_card", "parameters": {"type": "object", "properties": {"ref": {"type": "string"}}}}}],
            "messages": messages,
        });
        let bytes = serde_json::to_vec(&body).unwrap();
        if bytes.len() >= target {
            return bytes;
        }
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        messages.push(serde_json::json!({"role": role, "content": ASKS[i % ASKS.len()]}));
        i += 1;
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("fingerprint");
    for size in [1024, 8 * 1024, 32 * 1024] {
        let body = chat_body(size);
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(format!("chat_{}B", body.len()), |b| {
            b.iter(|| fingerprint(&Request::new(black_box(&body))).unwrap())
        });
    }
    group.finish();

    let mut group = c.benchmark_group("sketch");
    for ask in ASKS.iter().take(1) {
        group.throughput(Throughput::Bytes(ask.len() as u64));
        group.bench_function("intent_text", |b| {
            b.iter(|| IntentSketch::of_text(black_box(ask), SemanticMode::Hybrid))
        });
    }
    let prompt = one_kb_prompt();
    group.throughput(Throughput::Bytes(prompt.len() as u64));
    for version in [2, 1] {
        group.bench_function(format!("prompt_{}B_v{version}", prompt.len()), |b| {
            b.iter(|| {
                let tokens = mask::tokenize(&normalize::normalize(black_box(&prompt)));
                Sketch::of_version(version, &tokens, SemanticMode::Intent)
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("codebook");
    let intent = IntentSketch::of_text(ASKS[0], SemanticMode::Intent);
    for threshold in [0.1, 0.5, 0.9] {
        let level = Codebook::embedded().level_for_threshold(threshold);
        let k = Codebook::embedded().size(level);
        group.bench_function(format!("cohort_k{k}"), |b| {
            b.iter(|| black_box(&intent).cohort(black_box(threshold)))
        });
    }
    group.finish();

    // Learned cohorts as the filter runs them per request: take a full table of the
    // default capacity as the bytes shared data hands over, place one sketch (the copy of
    // the bytes is outside the timing: Envoy makes it).
    let mut group = c.benchmark_group("learned");
    let salt = cohort_fingerprint::TenantSalt::default();
    let mut table = cohort_fingerprint::learned::LearnedCohorts::default();
    // Every leader in the request's scope (the worst case: one tenant fills the table),
    // from pseudo-random directions; a threshold of 1 makes each its own leader.
    let scope = cohort_fingerprint::learned::scope(salt, &intent, 0.5);
    let full = cohort_fingerprint::learned::Capacity {
        total: cohort_fingerprint::learned::DEFAULT_CAPACITY,
        per_scope: cohort_fingerprint::learned::DEFAULT_CAPACITY,
    };
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for i in 0..cohort_fingerprint::learned::DEFAULT_CAPACITY {
        let sketch = cohort_fingerprint::Sketch(std::array::from_fn(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            (state >> 56) as i8
        }));
        table.place(scope, &sketch, 1.0, full, || i as u32);
    }
    let bytes = table.as_bytes().to_vec();
    group.bench_function(format!("place_among_{}_leaders", table.len()), |b| {
        b.iter_batched(
            || bytes.clone(),
            |bytes| {
                let mut table = cohort_fingerprint::learned::LearnedCohorts::from_bytes(bytes);
                table.place(scope, &intent.sketch, 0.5, full, || 0)
            },
            criterion::BatchSize::SmallInput,
        )
    });
    group.finish();
}

/// About 1 KB of user prompt: prose and questions with a few variables.
fn one_kb_prompt() -> String {
    let mut prompt = String::new();
    let mut i = 0;
    while prompt.len() < 1000 {
        prompt.push_str(if i % 2 == 0 {
            PROSE
        } else {
            ASKS[(i / 2) % ASKS.len()]
        });
        prompt.push(' ');
        i += 1;
    }
    prompt.truncate(1024); // ASCII: every byte is a char boundary
    prompt
}

criterion_group!(benches, bench);
criterion_main!(benches);
