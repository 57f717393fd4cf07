//! What turning a request into the engine's block keys costs the endpoint picker, per
//! request: `cargo run --release -p cohort-prompt-tokens --example prompt_keys_bench --
//! [MODEL_DIR]` prints the median time of `Prompts::keys` for chat requests of about 500,
//! 2,000 and 8,000 tokens, with engine-sim's tokenizer and, given a model folder
//! (`tokenizer.json`, `tokenizer_config.json`, the chat template), the model's.

use cohort_prompt_tokens::{Api, ModelTokens, PromptTokenizer, Prompts};
use std::time::Instant;

fn body(words: usize) -> Vec<u8> {
    let line = "You are the refunds desk of Example Corp. Cite the policy number, never guess. ";
    let system = line.repeat(words / 14 + 1);
    serde_json::to_vec(&serde_json::json!({"model": "m", "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": "Where is my refund for order 12345?"},
    ]}))
    .unwrap()
}

fn median_us(prompts: &Prompts, body: &[u8]) -> (f64, usize) {
    let tokens = prompts.keys(Api::Chat, body).expect("keys").tokens;
    let mut times: Vec<f64> = (0..41)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(prompts.keys(Api::Chat, body).expect("keys"));
            start.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], tokens)
}

fn main() {
    let mut rows = vec![(
        "engine-sim",
        Prompts::new(PromptTokenizer::EngineSim, 16, 1 << 20),
    )];
    if let Some(dir) = std::env::args().nth(1) {
        let model = ModelTokens::load(std::path::Path::new(&dir)).expect("the model folder");
        rows.push((
            "model",
            Prompts::new(PromptTokenizer::Model(Box::new(model)), 16, 1 << 20),
        ));
    }
    println!("| tokenizer | body bytes | prompt tokens | µs per request (median of 41) | µs per 1,000 tokens |");
    println!("|---|---|---|---|---|");
    for (name, prompts) in &rows {
        for words in [400, 1_600, 6_400] {
            let body = body(words);
            let (us, tokens) = median_us(prompts, &body);
            println!(
                "| {name} | {} | {tokens} | {us:.0} | {:.0} |",
                body.len(),
                us * 1000.0 / tokens as f64
            );
        }
    }
}
