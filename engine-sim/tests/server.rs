//! The simulator's HTTP layer end to end, in process on ephemeral loopback ports: completions
//! streamed and not, the per-replica prefix cache seen through `usage`, `/metrics`,
//! `/tokenize`, the render endpoint, slots and queueing, bad input. Every sleep is a few
//! milliseconds (tiny cost constants); no timing is asserted beyond ordering.

mod common;

use cohort_engine_sim::cost::CostModel;
use cohort_engine_sim::server::{bind, SimConfig};
use cohort_engine_sim::tokenizer;
use common::call;
use serde_json::{json, Value};

const COST: CostModel = CostModel {
    prefill_base_ms: 2.0,
    prefill_ms_per_token: 0.01,
    prefill_attention_ms: 0.0,
    decode_ms_per_token: 1.0,
    decode_batch_slowdown: 0.1,
};

fn config(replicas: usize, slots: usize) -> SimConfig {
    SimConfig {
        replicas,
        host: "127.0.0.1".to_owned(),
        base_port: 0,
        kv_blocks: 1024,
        block_tokens: 16,
        slots,
        model: "sim-model".to_owned(),
        max_model_len: 8192,
        time_scale: 1.0,
        cost: COST,
        calibration: json!({"source": "test"}),
    }
}

fn chat(content: &str, max_tokens: u64, stream: bool) -> String {
    json!({"model": "sim-model", "messages": [{"role": "user", "content": content}],
           "max_tokens": max_tokens, "stream": stream})
    .to_string()
}

fn metric(page: &str, name: &str) -> f64 {
    page.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing"))
}

/// SSE events of a streamed body, `[DONE]` included.
fn events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_cache_prefixes_separately_and_report_it() {
    let sim = bind(config(2, 4)).await.unwrap();
    let ports = sim.ports().to_vec();
    assert_eq!(ports.len(), 2);
    assert_ne!(ports[0], ports[1]);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(sim.serve(async {
        let _ = stop_rx.await;
    }));

    let shared = "You are a careful assistant. ".repeat(40);
    let prompt_a = format!("{shared}Question A?");
    let rendered = format!("user\n{prompt_a}\n");
    let n = tokenizer::count(&rendered);
    let expected_cached = (n - 1) / 16 * 16;

    // First request on replica 0: nothing cached.
    let first = call(
        ports[0],
        "POST",
        "/v1/chat/completions",
        &chat(&prompt_a, 3, false),
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.body);
    let v = first.json();
    assert_eq!(v["usage"]["prompt_tokens"], n);
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["usage"]["total_tokens"], n + 3);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(v["choices"][0]["message"]["content"], " tok tok tok");
    assert_eq!(first.header("x-sim-replica").as_deref(), Some("0"));
    let ttft: f64 = first.header("x-sim-ttft-ms").unwrap().parse().unwrap();
    let engine: f64 = first.header("x-sim-engine-ms").unwrap().parse().unwrap();
    assert!(first.header("x-sim-queue-ms").is_some());
    assert!(ttft > 0.0 && engine >= ttft, "ttft {ttft} engine {engine}");

    // The same prompt again, streamed, on replica 0: all its full blocks but the last hit.
    let second = call(
        ports[0],
        "POST",
        "/v1/chat/completions",
        &chat(&prompt_a, 4, true),
    )
    .await;
    assert_eq!(second.status, 200);
    assert!(second
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let ev = events(&second.body);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let deltas: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(deltas, " tok".repeat(4));
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"],
        expected_cached
    );
    assert_eq!(usage["completion_tokens"], 4);
    assert_eq!(
        second.header("x-sim-cached-tokens"),
        Some(expected_cached.to_string())
    );

    // A different question under the same shared head on replica 0: the head hits.
    let prompt_b = format!("{shared}Question B, rather longer?");
    let third = call(
        ports[0],
        "POST",
        "/v1/chat/completions",
        &chat(&prompt_b, 1, false),
    )
    .await;
    let cached_b = third.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached_b > 0 && cached_b % 16 == 0, "{cached_b}");

    // Replica 1 has its own cache: the same prompt is cold there.
    let other = call(
        ports[1],
        "POST",
        "/v1/chat/completions",
        &chat(&prompt_a, 2, false),
    )
    .await;
    assert_eq!(
        other.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
        0
    );
    assert_eq!(other.header("x-sim-replica").as_deref(), Some("1"));

    // A cache salt keeps the same prompt apart.
    let salted = json!({"messages": [{"role": "user", "content": prompt_a}], "max_tokens": 1,
                        "cache_salt": "tenant-x"})
    .to_string();
    let s = call(ports[0], "POST", "/v1/chat/completions", &salted).await;
    assert_eq!(
        s.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
        0
    );

    // Completions, non-streamed and streamed.
    let c = call(
        ports[0],
        "POST",
        "/v1/completions",
        r#"{"prompt":"abcdefgh","max_tokens":2}"#,
    )
    .await;
    assert_eq!(c.json()["choices"][0]["text"], " tok tok");
    assert_eq!(c.json()["usage"]["prompt_tokens"], 2);
    let cs = call(
        ports[0],
        "POST",
        "/v1/completions",
        r#"{"prompt":"abcdefgh","max_tokens":2,"stream":true}"#,
    )
    .await;
    let text: String = events(&cs.body)
        .iter()
        .filter(|e| *e != "[DONE]")
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|v| v["choices"][0]["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(text, " tok tok");

    // /metrics moved on replica 0 and not on replica 1's prompt counter beyond its request.
    let page = call(ports[0], "GET", "/metrics", "").await.body;
    let rendered_b = format!("user\n{prompt_b}\n");
    let prompt_total = 3 * n + tokenizer::count(&rendered_b) + 2 + 2;
    assert_eq!(
        metric(&page, "vllm:prompt_tokens_total"),
        prompt_total as f64
    );
    assert_eq!(
        metric(&page, "vllm:prefix_cache_hits_total"),
        (expected_cached as u64 + cached_b) as f64
    );
    assert_eq!(metric(&page, "vllm:request_success_total"), 6.0);
    assert_eq!(
        metric(&page, "vllm:generation_tokens_total"),
        (3 + 4 + 1 + 1 + 2 + 2) as f64
    );
    assert_eq!(metric(&page, "vllm:num_requests_running"), 0.0);
    assert!(metric(&page, "vllm:kv_cache_usage_perc") > 0.0);
    let page1 = call(ports[1], "GET", "/metrics", "").await.body;
    assert_eq!(metric(&page1, "vllm:prompt_tokens_total"), n as f64);

    // /tokenize and the render endpoint agree with the tokenizer.
    let t = call(
        ports[1],
        "POST",
        "/tokenize",
        r#"{"model":"sim-model","prompt":"abcdefghi"}"#,
    )
    .await;
    let tv = t.json();
    assert_eq!(tv["count"], 3);
    assert_eq!(tv["max_model_len"], 8192);
    assert_eq!(tv["tokens"], json!(tokenizer::tokenize("abcdefghi")));
    let chat_body = chat("hi", 1, false);
    let tc = call(ports[1], "POST", "/tokenize", &chat_body).await.json();
    assert_eq!(tc["count"], tokenizer::count("user\nhi\n"));
    let r = call(ports[1], "POST", "/v1/chat/completions/render", &chat_body)
        .await
        .json();
    assert_eq!(r["token_ids"], json!(tokenizer::tokenize("user\nhi\n")));
    let stats = call(ports[0], "GET", "/sim/stats", "").await.json();
    assert_eq!(stats["replica"], 0);
    assert_eq!(stats["replicas"][1]["tokenize_calls"], 2);
    assert_eq!(stats["replicas"][1]["render_calls"], 1);
    assert_eq!(stats["replicas"][0]["requests"], 6);

    // Bad input: 400 with a JSON error, and the replica keeps serving.
    for (path, body) in [
        ("/v1/chat/completions", "{not json"),
        ("/v1/chat/completions", r#"{"messages":"x"}"#),
        ("/v1/completions", r#"{"prompt":"x","max_tokens":-1}"#),
        ("/v1/completions", r#"{"prompt":""}"#),
        ("/v1/completions", r#"{"prompt":"x","max_tokens":9000}"#),
        ("/tokenize", "[]"),
    ] {
        let bad = call(ports[0], "POST", path, body).await;
        assert_eq!(bad.status, 400, "{path} {body}: {}", bad.body);
        assert!(bad.json()["error"]["message"].is_string());
    }
    assert_eq!(call(ports[0], "GET", "/health", "").await.status, 200);
    assert_eq!(call(ports[0], "GET", "/nope", "").await.status, 404);
    let models = call(ports[0], "GET", "/v1/models", "").await.json();
    assert_eq!(models["data"][0]["id"], "sim-model");
    let info = call(ports[0], "GET", "/server_info", "").await.json();
    assert_eq!(info["max_running_requests"], 4);

    let _ = stop_tx.send(());
    server.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_slots_wait_their_turn() {
    let sim = bind(config(1, 1)).await.unwrap();
    let port = sim.ports()[0];
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(sim.serve(async {
        let _ = stop_rx.await;
    }));
    let calls: Vec<_> = (0..3)
        .map(|i| {
            let body = chat(&format!("request {i}"), 10, false);
            tokio::spawn(async move { call(port, "POST", "/v1/chat/completions", &body).await })
        })
        .collect();
    let mut queue_ms = Vec::new();
    for c in calls {
        let reply = c.await.unwrap();
        assert_eq!(reply.status, 200);
        queue_ms.push(
            reply
                .header("x-sim-queue-ms")
                .unwrap()
                .parse::<f64>()
                .unwrap(),
        );
    }
    let stats = call(port, "GET", "/sim/stats", "").await.json();
    let r = &stats["replicas"][0];
    assert_eq!(r["max_running"], 1);
    assert!(r["max_waiting"].as_u64().unwrap() >= 1, "{r}");
    // One slot, ~11 ms each: whoever went last waited for at least one other (≥ 9 ms decode).
    queue_ms.sort_by(f64::total_cmp);
    assert!(queue_ms[2] >= 9.0, "{queue_ms:?}");
    let _ = stop_tx.send(());
    server.await.unwrap().unwrap();
}
