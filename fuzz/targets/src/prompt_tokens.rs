//! A request body as the endpoint picker turns it into the engine's block keys
//! (`cohort_prompt_tokens`): engine-sim's template and tokenizer, and a model's, here a
//! small word-level `tokenizer.json` with the Gemma chat template Cohort ships
//! (`data/engines/gemma_chat_template.jinja`), on the chat and completions APIs.
//!
//! Invariants: nothing panics (a body the template or tokenizer refuses is a typed error)
//! and the keys are deterministic; a whole prompt's keys are its full blocks; a prompt cut
//! at `max_prompt_bytes` is marked so and, with engine-sim's tokenizer (4 bytes a token),
//! its keys are the whole prompt's first ones.

use cohort_prompt_tokens::{Api, ModelTokens, PromptTokenizer, Prompts};
use std::sync::OnceLock;

const BLOCK: u32 = 4;

fn model() -> &'static Prompts {
    static MODEL: OnceLock<Prompts> = OnceLock::new();
    MODEL.get_or_init(|| {
        let words = [
            "[UNK]",
            "<bos>",
            "<start_of_turn>",
            "<end_of_turn>",
            "user",
            "model",
            "hi",
        ];
        let vocab: serde_json::Map<String, serde_json::Value> = words
            .iter()
            .enumerate()
            .map(|(i, w)| (w.to_string(), serde_json::json!(i)))
            .collect();
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null,
            "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
        })
        .to_string();
        let tokenizer: tokenizers::Tokenizer = json.parse().expect("the word-level tokenizer");
        let template = include_str!("../../../data/engines/gemma_chat_template.jinja");
        let model = ModelTokens::new(
            tokenizer,
            template.to_owned(),
            "<bos>".into(),
            "<eos>".into(),
        )
        .expect("the shipped Gemma template");
        Prompts::new(PromptTokenizer::Model(Box::new(model)), BLOCK, 256)
    })
}

/// The fuzz target.
pub fn prompt_tokens(data: &[u8]) {
    let whole = Prompts::new(PromptTokenizer::EngineSim, BLOCK, 1 << 20);
    let cut = Prompts::new(PromptTokenizer::EngineSim, BLOCK, 16);
    for api in [Api::Chat, Api::Completions] {
        for prompts in [&whole, &cut, model()] {
            let keys = prompts.keys(api, data);
            let again = prompts.keys(api, data);
            assert_eq!(format!("{keys:?}"), format!("{again:?}"), "deterministic");
            if let Ok(keys) = &keys {
                assert_eq!(keys.block_size, BLOCK as usize);
                if keys.whole {
                    assert_eq!(keys.keys.len(), keys.tokens / BLOCK as usize, "{keys:?}");
                } else {
                    assert!(keys.keys.len() * (BLOCK as usize) < keys.tokens, "{keys:?}");
                }
            }
        }
        if let (Ok(w), Ok(c)) = (whole.keys(api, data), cut.keys(api, data)) {
            assert_eq!(
                w.keys[..c.keys.len()],
                c.keys[..],
                "a cut prompt keys its beginning"
            );
            assert!(c.keys.len() <= w.keys.len());
        }
    }
}
