//! Engine adapters against engine output: llama.cpp recorded from the live server this
//! project tests with (`tests/fixtures/engines/llamacpp/`), vLLM recorded from a live vLLM
//! on CPU by `scripts/vllm-live` (`…/vllm/`), SGLang and TGI written from their published
//! metric names and API shapes (`…/sglang/`, `…/tgi/`; marked so in each file).

use cohort_batcher_core::batch::Release;
use cohort_batcher_core::engines::{cache_salt, EngineKind, LoraAdapter, Member};
use serde_json::{json, Map, Value};
use std::path::PathBuf;

fn fixture(path: &str) -> String {
    let full = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/engines")
        .join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

fn chat() -> Map<String, Value> {
    json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        .as_object()
        .unwrap()
        .clone()
}

#[test]
fn llamacpp_pins_a_slot_and_reads_its_counters() {
    let engine = EngineKind::LlamaCpp.adapter();
    assert_eq!(engine.release(), Release::SameSlot);
    let mut body = chat();
    engine.prepare(
        &mut body,
        &Member {
            salt: Some("5a17"),
            slot: Some(1),
        },
    );
    assert_eq!(body["id_slot"], 1);
    assert!(!body.contains_key("cache_salt"), "llama.cpp has no salt");
    let metrics = engine.parse_metrics(&fixture("llamacpp/metrics.txt"));
    assert_eq!(metrics.prompt_tokens_total, Some(12.0));
    assert_eq!(metrics.cached_tokens_total, Some(10.0));
    assert_eq!(metrics.running, Some(0.0));
    assert_eq!(metrics.waiting, Some(0.0));
    assert!(engine.lora_load(&adapter()).is_none());
    // The recorded answers carry what the front and its tests read.
    let reply: Value = serde_json::from_str(&fixture("llamacpp/chat.json")).unwrap();
    assert!(reply["usage"]["prompt_tokens_details"]["cached_tokens"].is_u64());
    let sse = fixture("llamacpp/chat.sse");
    assert!(sse.trim_end().ends_with("data: [DONE]"));
    assert!(sse.contains("\"usage\""));
}

fn adapter() -> LoraAdapter {
    LoraAdapter {
        name: "sql-lora".into(),
        path: "/adapters/sql".into(),
    }
}

#[test]
fn vllm_salts_per_tenant_and_loads_adapters_at_run_time() {
    let engine = EngineKind::Vllm.adapter();
    assert_eq!(engine.release(), Release::AfterLeaderPrefill);
    let mut body = chat();
    let salt = cache_salt(b"secret", Some("acme"), None).unwrap();
    engine.prepare(
        &mut body,
        &Member {
            salt: Some(&salt),
            slot: None,
        },
    );
    assert_eq!(body["cache_salt"], salt.as_str());
    let mut own = chat();
    own.insert("cache_salt".into(), json!("client-set"));
    let mixed = cache_salt(b"secret", Some("acme"), Some("client-set")).unwrap();
    engine.prepare(
        &mut own,
        &Member {
            salt: Some(&mixed),
            slot: None,
        },
    );
    assert_eq!(
        own["cache_salt"],
        mixed.as_str(),
        "a client's salt is mixed into its tenant's, never sent as is"
    );
    let mut anonymous = chat();
    engine.prepare(&mut anonymous, &Member::default());
    assert!(!anonymous.contains_key("cache_salt"));
    let load = engine.lora_load(&adapter()).unwrap();
    assert_eq!(load.path, "/v1/load_lora_adapter");
    assert_eq!(
        load.body,
        json!({"lora_name": "sql-lora", "lora_path": "/adapters/sql"})
    );
    let unload = engine.lora_unload(&adapter()).unwrap();
    assert_eq!(unload.path, "/v1/unload_lora_adapter");
    assert_eq!(unload.body, json!({"lora_name": "sql-lora"}));
}

/// What the live vLLM answered (`scripts/vllm-live`): the metric names the adapter reads,
/// followers reusing a leader's prefix, `cache_salt` isolating tenants, run-time LoRA.
#[test]
fn vllm_recorded_answers_match_the_adapter() {
    let engine = EngineKind::Vllm.adapter();
    let m = engine.parse_metrics(&fixture("vllm/metrics-after.txt"));
    assert_eq!(m.prompt_tokens_total, Some(2470.0));
    assert_eq!(m.cached_tokens_total, Some(1536.0));
    assert_eq!(m.kv_usage, Some(0.0));
    assert_eq!((m.running, m.waiting), (Some(0.0), Some(0.0)));
    let during = engine.parse_metrics(&fixture("vllm/metrics-during.txt"));
    assert!(during.running.unwrap() >= 1.0, "the leader was running");
    assert!(during.kv_usage.unwrap() > 0.0);

    let followers: Vec<Value> = serde_json::from_str(&fixture("vllm/followers.json")).unwrap();
    assert!(!followers.is_empty());
    for usage in &followers {
        let cached = usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert!(
            cached >= 512,
            "a follower sent after the leader's first token reuses its blocks"
        );
    }
    let salted: Vec<Value> = serde_json::from_str(&fixture("vllm/cache-salt.json")).unwrap();
    let cached = |i: usize| salted[i]["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    assert_eq!(salted[0]["cache_salt"], salted[2]["cache_salt"]);
    assert_ne!(salted[0]["cache_salt"], salted[1]["cache_salt"]);
    assert_eq!(cached(1), Some(0), "another tenant's salt misses the cache");
    assert!(cached(2).unwrap() > 0, "the same tenant's salt hits it");
    assert!(fixture("vllm/lora-load.txt").starts_with("HTTP 200"));
}

#[test]
fn sglang_reads_published_metric_names() {
    let engine = EngineKind::Sglang.adapter();
    let m = engine.parse_metrics(&fixture("sglang/metrics.txt"));
    assert_eq!(m.prompt_tokens_total, Some(5120.0));
    assert_eq!(m.cached_tokens_total, Some(3584.0));
    assert_eq!(m.kv_usage, Some(0.93));
    assert_eq!(m.running, Some(7.0));
    assert_eq!(m.waiting, Some(2.0));
    assert_eq!(
        engine.lora_load(&adapter()).unwrap().path,
        "/load_lora_adapter"
    );
}

#[test]
fn tgi_reads_published_metric_names() {
    let m = EngineKind::Tgi
        .adapter()
        .parse_metrics(&fixture("tgi/metrics.txt"));
    assert_eq!(m.prompt_tokens_total, Some(4096.0));
    assert_eq!(m.cached_tokens_total, None);
    assert_eq!(m.waiting, Some(3.0));
    assert_eq!(m.running, Some(4.0));
}

#[test]
fn generic_servers_are_left_alone() {
    for kind in [EngineKind::OpenAi, EngineKind::Anthropic] {
        let engine = kind.adapter();
        let mut body = chat();
        engine.prepare(
            &mut body,
            &Member {
                salt: Some("5a17"),
                slot: Some(3),
            },
        );
        assert_eq!(body, chat(), "{kind:?} sends bodies unchanged");
        assert!(engine.metrics_path().is_none());
        assert_eq!(engine.health_path(), "/v1/models");
        assert!(engine.lora_load(&adapter()).is_none());
    }
}
