//! Each API shape on a realistic body (tests/bodies/): what it parses to, and that the
//! prefix identity reacts to what shapes the engine's prompt (tools, images, the whole
//! conversation) and to nothing else (key order, cache_control marks).

use cohort_fingerprint::prefix::{common_prefix_blocks, BLOCK_BYTES};
use cohort_fingerprint::{fingerprint, Anchor, Api, Fingerprint, Request};
use serde_json::{json, Value};

fn body(name: &str) -> Value {
    let path = format!("{}/tests/bodies/{name}.json", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn fp(value: &Value, path: Option<&str>) -> Fingerprint {
    let bytes = serde_json::to_vec(value).unwrap();
    let mut request = Request::new(&bytes);
    request.path = path;
    fingerprint(&request).unwrap()
}

fn check_shape(name: &str, path: &str, api: Api, intent: &str) -> (Value, Fingerprint) {
    let value = body(name);
    let by_body = fp(&value, None);
    let by_path = fp(&value, Some(path));
    assert_eq!(
        by_body, by_path,
        "{name}: the path and the body agree on the shape"
    );
    assert_eq!(by_body.api, api);
    assert_eq!(by_body.intent.masked_text(), intent);
    assert!(!by_body.prefix_blocks.is_empty());
    assert_eq!(
        by_body.prefix_blocks.len(),
        by_body.prompt_bytes.div_ceil(BLOCK_BYTES)
    );
    (value, by_body)
}

#[test]
fn openai_chat_with_tools_and_an_image_part() {
    let (value, base) = check_shape(
        "openai_chat_tools_image",
        "/v1/chat/completions",
        Api::OpenAiChat,
        "can i change my seat to a window seat on flight <id>",
    );
    assert_eq!(base.model, "gpt-4o-2024-08-06");
    assert!(base.has_stable_context);
    assert_eq!(base.anchor, Anchor::StablePrefix(base.stable_prefix));

    // Tools are part of the stable prefix and of every block after them.
    let mut fewer_tools = value.clone();
    fewer_tools["tools"].as_array_mut().unwrap().pop();
    let changed = fp(&fewer_tools, None);
    assert_ne!(changed.stable_prefix, base.stable_prefix);
    assert_ne!(changed.routing_key, base.routing_key);

    // ...but their key order is not.
    let mut reordered = value.clone();
    let tool = &mut reordered["tools"][0]["function"];
    let description = tool.as_object_mut().unwrap().remove("description").unwrap();
    tool.as_object_mut()
        .unwrap()
        .insert("description".into(), description);
    assert_eq!(fp(&reordered, None).prefix_blocks, base.prefix_blocks);

    // The image's bytes are part of the prompt.
    let mut other_image = value.clone();
    other_image["messages"][2]["content"][1]["image_url"]["url"] =
        json!("https://img.example/x.png");
    let changed = fp(&other_image, None);
    assert_eq!(changed.stable_prefix, base.stable_prefix);
    assert_ne!(changed.prefix_blocks.last(), base.prefix_blocks.last());

    // Tool calls and tool results are part of the conversation.
    let mut other_call = value.clone();
    other_call["messages"][3]["tool_calls"][0]["function"]["arguments"] =
        json!("{\"booking_ref\":\"ZZZ\"}");
    assert_ne!(fp(&other_call, None).prefix_blocks, base.prefix_blocks);
}

#[test]
fn a_growing_conversation_keeps_its_prefix_blocks() {
    let value = body("openai_chat_tools_image");
    let base = fp(&value, None);
    let mut longer = value.clone();
    let messages = longer["messages"].as_array_mut().unwrap();
    messages
        .push(json!({"role": "assistant", "content": "Yes, seat 12A is free. Shall I book it?"}));
    messages.push(json!({"role": "user", "content": "Yes please."}));
    let grown = fp(&longer, None);
    let full_blocks = base.prompt_bytes / BLOCK_BYTES;
    assert!(full_blocks >= 2);
    assert!(common_prefix_blocks(&base.prefix_blocks, &grown.prefix_blocks) >= full_blocks);
    assert_eq!(grown.stable_prefix, base.stable_prefix);
    assert_eq!(grown.intent.masked_text(), "yes please");
}

#[test]
fn openai_completions_with_an_array_prompt() {
    let (value, base) = check_shape(
        "openai_completions_array",
        "/v1/completions",
        Api::OpenAiCompletions,
        "translate to <name> how much does a ticket to <name> cost french",
    );
    assert!(
        !base.has_stable_context,
        "completions have no system prompt or tools"
    );
    assert_eq!(base.anchor, Anchor::Cohort(base.intent.cohort(0.5)));

    let mut single = value.clone();
    single["prompt"] = value["prompt"][0].clone();
    let single = fp(&single, None);
    assert_eq!(
        common_prefix_blocks(&single.prefix_blocks, &base.prefix_blocks),
        0,
        "short prompts: one partial block each"
    );

    let mut tokens = value.clone();
    tokens["prompt"] = json!([[1, 2, 3], [4, 5]]);
    let tokens = fp(&tokens, None);
    assert!(
        tokens.intent.sketch.is_zero(),
        "token prompts carry no text to sketch"
    );
}

#[test]
fn openai_responses_with_items() {
    let (value, base) = check_shape(
        "openai_responses_items",
        "/v1/responses",
        Api::OpenAiResponses,
        "and how do i request a day off next <name>",
    );
    assert!(base.has_stable_context);

    // The leading developer message belongs to the stable prefix.
    let mut other_developer = value.clone();
    other_developer["input"][0]["content"] = json!("Keep answers under 50 words.");
    assert_ne!(fp(&other_developer, None).stable_prefix, base.stable_prefix);

    // Server-held state is part of the prompt, not of the stable prefix.
    let mut other_previous = value.clone();
    other_previous["previous_response_id"] = json!("resp_other");
    let changed = fp(&other_previous, None);
    assert_eq!(changed.stable_prefix, base.stable_prefix);
    assert_ne!(changed.prefix_blocks, base.prefix_blocks);

    // A plain string input is one user turn.
    let plain = fp(
        &json!({"model": "gpt-4.1", "input": "Tell me a joke about SREs"}),
        None,
    );
    assert_eq!(plain.intent.masked_text(), "tell me a joke about sres");
}

#[test]
fn anthropic_with_system_blocks_and_a_tool_result() {
    let (value, base) = check_shape(
        "anthropic_system_blocks_tool_result",
        "/v1/messages",
        Api::AnthropicMessages,
        // The last user turn holds only a tool result, a document and an image: the intent
        // is the last turn the user wrote.
        "why is pod <id> crash looping in prod",
    );
    assert!(base.has_stable_context);

    // A cache breakpoint is a hint, not content.
    let mut no_cache_control = value.clone();
    no_cache_control["system"][1]
        .as_object_mut()
        .unwrap()
        .remove("cache_control");
    assert_eq!(fp(&no_cache_control, None), base);

    // The system text is; so is the tool result.
    let mut other_system = value.clone();
    other_system["system"][1]["text"] = json!("Runbook: never restart.");
    assert_ne!(fp(&other_system, None).stable_prefix, base.stable_prefix);
    let mut other_result = value.clone();
    other_result["messages"][2]["content"][0]["content"][0]["text"] = json!("Running");
    let changed = fp(&other_result, None);
    assert_eq!(changed.stable_prefix, base.stable_prefix);
    assert_ne!(changed.prefix_blocks, base.prefix_blocks);

    // A system string and the same text as one block are the same prompt.
    let as_string = json!({"model": "m", "system": "be brief", "messages": [{"role": "user", "content": "hi"}]});
    let as_blocks = json!({"model": "m", "system": [{"type": "text", "text": "be brief"}], "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]});
    assert_eq!(
        fp(&as_string, None).prefix_blocks,
        fp(&as_blocks, None).prefix_blocks
    );
}

#[test]
fn x_original_query_overrides_the_intent_text() {
    let value = body("openai_chat_tools_image");
    let bytes = serde_json::to_vec(&value).unwrap();
    let mut request = Request::new(&bytes);
    request.original_query = Some("cancel my booking");
    let with_query = fingerprint(&request).unwrap();
    assert_eq!(with_query.intent.masked_text(), "cancel my booking");
    assert_eq!(with_query.prefix_blocks, fp(&value, None).prefix_blocks);
}
