//! `ModelTokens` on a small model folder built here: a word-level `tokenizer.json` with
//! added special tokens, a `tokenizer_config.json`, and Hugging Face-style templates that
//! use Python's string methods, `raise_exception` and whitespace control.

use cohort_prompt_tokens::{Api, ModelTokens, PromptError, PromptTokenizer, Prompts};
use std::path::{Path, PathBuf};

const WORDS: [&str; 12] = [
    "[UNK]", "<bos>", "<turn>", "</turn>", "system", "user", "model", "be", "brief", "hi", "there",
    "\n",
];

fn id(word: &str) -> u32 {
    WORDS.iter().position(|w| *w == word).unwrap() as u32
}

/// A word-level tokenizer over `WORDS`: words split on whitespace, `<bos>`, `<turn>` and
/// `</turn>` added as special tokens, newlines kept as a word of their own.
fn tokenizer_json() -> String {
    let vocab: serde_json::Map<String, serde_json::Value> = WORDS
        .iter()
        .enumerate()
        .map(|(i, w)| (w.to_string(), serde_json::json!(i)))
        .collect();
    let added: Vec<_> = ["<bos>", "<turn>", "</turn>"]
        .iter()
        .map(|t| {
            serde_json::json!({"id": id(t), "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\n|[^\\s]+"}, "behavior": "Removed", "invert": true},
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [id("<bos>")], "tokens": ["<bos>"]}}},
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    })
    .to_string()
}

const TEMPLATE: &str = "{{ bos_token }}
{% for message in messages %}
{% if message['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('unknown role ' + message['role']) }}{% endif %}
{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}
<turn> {{ role }}
 {{ message['content'].strip() }} </turn>
{% endfor %}
{% if add_generation_prompt %}<turn> model
{% endif %}";

struct Folder(PathBuf);

impl Folder {
    fn new(name: &str, config: serde_json::Value, template_file: Option<&str>) -> Folder {
        let dir = std::env::temp_dir().join(format!(
            "cohort-prompt-tokens-{name}-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tokenizer.json"), tokenizer_json()).unwrap();
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
        if let Some(template) = template_file {
            std::fs::write(dir.join("chat_template.jinja"), template).unwrap();
        }
        Folder(dir)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn chat(messages: serde_json::Value) -> Vec<u8> {
    serde_json::json!({"model": "m", "messages": messages})
        .to_string()
        .into_bytes()
}

#[test]
fn a_chat_request_is_rendered_by_the_template_and_encoded_without_added_tokens() {
    let folder = Folder::new(
        "config",
        serde_json::json!({"bos_token": {"content": "<bos>"}, "eos_token": "</turn>", "chat_template": TEMPLATE}),
        None,
    );
    let model = ModelTokens::load(folder.path()).unwrap();
    let body = chat(serde_json::json!([
        {"role": "system", "content": "  be brief  "},
        {"role": "user", "content": "hi there"}
    ]));
    let object = serde_json::from_slice(&body).unwrap();
    // trim_blocks and lstrip_blocks drop the block tags' lines; `.strip()` is Python's.
    assert_eq!(
        model.render(&object).unwrap(),
        "<bos>\n<turn> system\n be brief </turn>\n<turn> user\n hi there </turn>\n<turn> model\n"
    );
    let ids = model.tokens(Api::Chat, &object).unwrap();
    let expected: Vec<u32> = [
        "<bos>", "\n", "<turn>", "system", "\n", "be", "brief", "</turn>", "\n", "<turn>", "user",
        "\n", "hi", "there", "</turn>", "\n", "<turn>", "model", "\n",
    ]
    .iter()
    .map(|w| id(w))
    .collect();
    assert_eq!(
        ids, expected,
        "one <bos>, the template's: chat adds no special tokens"
    );
}

#[test]
fn a_completions_prompt_is_encoded_with_the_tokenizers_special_tokens() {
    let folder = Folder::new(
        "completions",
        serde_json::json!({"bos_token": "<bos>"}),
        Some(TEMPLATE),
    );
    let tokens = PromptTokenizer::Model(Box::new(ModelTokens::load(folder.path()).unwrap()));
    let ids = tokens
        .tokens(Api::Completions, br#"{"prompt": "hi there"}"#)
        .unwrap();
    assert_eq!(ids, vec![id("<bos>"), id("hi"), id("there")]);
    let ids = tokens
        .tokens(Api::Completions, br#"{"prompt": ["hi"]}"#)
        .unwrap();
    assert_eq!(ids, vec![id("<bos>"), id("hi")]);
    assert!(matches!(
        tokens.tokens(Api::Completions, br#"{"prompt": [1, 2]}"#),
        Err(PromptError::Body(_))
    ));
}

#[test]
fn the_template_file_serves_when_the_config_has_none_and_a_named_list_gives_its_default() {
    let from_file = Folder::new(
        "file",
        serde_json::json!({"bos_token": "<bos>"}),
        Some(TEMPLATE),
    );
    let named = Folder::new(
        "named",
        serde_json::json!({"bos_token": "<bos>", "chat_template": [
            {"name": "tool_use", "template": "{{ raise_exception('not this one') }}"},
            {"name": "default", "template": TEMPLATE}
        ]}),
        None,
    );
    let body = chat(serde_json::json!([{"role": "user", "content": "hi"}]));
    let a = Prompts::new(
        PromptTokenizer::Model(Box::new(ModelTokens::load(from_file.path()).unwrap())),
        2,
        1 << 20,
    );
    let b = Prompts::new(
        PromptTokenizer::Model(Box::new(ModelTokens::load(named.path()).unwrap())),
        2,
        1 << 20,
    );
    let keys = a.keys(Api::Chat, &body).unwrap();
    assert_eq!(keys, b.keys(Api::Chat, &body).unwrap());
    // <bos> \n <turn> user \n hi </turn> \n <turn> model \n: 11 tokens, 5 blocks of 2.
    assert_eq!((keys.tokens, keys.keys.len()), (11, 5));
}

#[test]
fn what_the_template_or_the_body_refuses_is_a_typed_error() {
    let folder = Folder::new(
        "errors",
        serde_json::json!({"chat_template": TEMPLATE}),
        None,
    );
    let model = ModelTokens::load(folder.path()).unwrap();
    let tokens = PromptTokenizer::Model(Box::new(model));
    let err = tokens
        .tokens(
            Api::Chat,
            &chat(serde_json::json!([{"role": "tool", "content": "x"}])),
        )
        .unwrap_err();
    assert!(
        matches!(&err, PromptError::Template(m) if m.contains("unknown role tool")),
        "{err}"
    );
    assert!(matches!(
        tokens.tokens(Api::Chat, b"{]"),
        Err(PromptError::NotJson(_))
    ));
    assert!(matches!(
        tokens.tokens(Api::Chat, b"[]"),
        Err(PromptError::NotObject)
    ));
    assert!(matches!(
        tokens.tokens(Api::Chat, br#"{"messages": []}"#),
        Err(PromptError::Body(_))
    ));
    // Content the template cannot `.strip()` fails in the template, not in a panic.
    assert!(matches!(
        tokens.tokens(
            Api::Chat,
            &chat(serde_json::json!([{"role": "user", "content": 3}]))
        ),
        Err(PromptError::Template(_))
    ));
}

#[test]
fn a_folder_without_its_files_says_which_one() {
    let missing = std::env::temp_dir().join("cohort-prompt-tokens-nowhere");
    let err = ModelTokens::load(&missing).err().unwrap();
    assert!(
        matches!(&err, PromptError::Load { path, .. } if path.ends_with("tokenizer.json")),
        "{err}"
    );
    let no_template = Folder::new("no-template", serde_json::json!({}), None);
    let err = ModelTokens::load(no_template.path()).err().unwrap();
    assert!(err.to_string().contains("chat_template.jinja"), "{err}");
    let bad_template = Folder::new(
        "bad-template",
        serde_json::json!({"chat_template": "{% for %}"}),
        None,
    );
    assert!(matches!(
        ModelTokens::load(bad_template.path()),
        Err(PromptError::Load { .. })
    ));
}
