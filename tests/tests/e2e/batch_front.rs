//! The batch front's protocol duties, against recording upstreams standing in for engines
//! that cannot run here (vLLM needs a GPU or a 6 GB CPU build; its real answers are
//! fixtures in `batcher-service/core/tests/fixtures/engines/vllm/`). The real-engine
//! behaviour (batching, prefix reuse, SSE, cancellation) is `batch_llama.rs`.
//!
//! - vLLM members carry their tenant's `cache_salt`, and a LoRA adapter is loaded on the
//!   replica before the first request that needs it, once;
//! - a body the front cannot parse goes to an engine byte for byte (marked `direct`);
//! - an unreachable replica's requests fail over to a live one; none fails;
//! - a request joins its cohort's batch (and is held for the leader) only when it shares
//!   `batch.min_shared` of its prompt with the leader; otherwise it goes alone, at once.

use cohort_tests::batcher::{Batcher, BatcherSpec};
use cohort_tests::client::post_json;
use cohort_tests::upstream::Upstream;
use cohort_tests::{eventually, free_port, stays, QUIET_WINDOW};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const CHAT: &str = "/v1/chat/completions";

fn front(replicas: &[String], extra_args: Vec<String>) -> Batcher {
    Batcher::start(BatcherSpec {
        grpc_port: free_port(),
        http_port: free_port(),
        replicas: replicas.to_vec(),
        shard_index: 0,
        shard_count: 1,
        front_port: Some(free_port()),
        picker_port: None,
        extra_args,
    })
}

/// A front over one generic OpenAI-compatible engine (`upstream`, as replica-0).
fn openai_front(upstream: &Upstream) -> Batcher {
    front(
        &[format!(
            "replica-0=openai+http://127.0.0.1:{}",
            upstream.port
        )],
        Vec::new(),
    )
}

fn chat(model: &str, system: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "model": model,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "Which tables hold the invoices?"},
        ],
    }))
    .unwrap()
}

#[test]
fn vllm_members_carry_their_tenant_salt_and_their_adapter_is_loaded_once() {
    let upstreams = [Upstream::start("replica-0"), Upstream::start("replica-1")];
    let config = std::env::temp_dir().join(format!(
        "cohort-lora-{}-{}.toml",
        std::process::id(),
        free_port()
    ));
    std::fs::write(
        &config,
        "[[lora]]\nname = \"sql-lora\"\npath = \"/adapters/sql\"\n",
    )
    .unwrap();
    let replicas: Vec<String> = upstreams
        .iter()
        .map(|u| format!("{}=vllm+http://127.0.0.1:{}", u.name, u.port))
        .collect();
    let batcher = front(
        &replicas,
        vec!["--config".into(), config.to_string_lossy().into_owned()],
    );
    let port = batcher.spec.front_port.unwrap();
    let headers = [("x-cohort-tenant", "acme")];
    let first = post_json(port, CHAT, &headers, &chat("sql-lora", "You write SQL."));
    assert_eq!(first.status, 200, "{}", first.text());
    let tag = first.header("x-cohort-batch").unwrap().to_owned();
    assert!(tag.starts_with("leader;replica="), "{tag}");
    let owner = tag.trim_start_matches("leader;replica=").to_owned();
    // Another cohort needing the same adapter, after the first batch closed: it goes
    // where the adapter is, without loading it again.
    assert!(eventually(Duration::from_secs(5), || {
        batcher.metric("cohort_batches_open") == 0.0
    }));
    let second = post_json(port, CHAT, &headers, &chat("sql-lora", "You review SQL."));
    assert_eq!(second.status, 200);
    assert_eq!(
        second.header("x-cohort-batch"),
        Some(format!("leader;replica={owner}").as_str())
    );

    let calls = |u: &Upstream| -> Vec<(String, Value)> {
        u.received()
            .into_iter()
            .filter(|r| r.method == "POST")
            .map(|r| (r.path, serde_json::from_slice(&r.body).unwrap()))
            .collect()
    };
    let owner_upstream = upstreams.iter().find(|u| u.name == owner).unwrap();
    let posts = calls(owner_upstream);
    assert_eq!(posts.len(), 3, "{posts:?}");
    assert_eq!(posts[0].0, "/v1/load_lora_adapter", "the load comes first");
    assert_eq!(
        posts[0].1,
        json!({"lora_name": "sql-lora", "lora_path": "/adapters/sql"})
    );
    assert_eq!(
        posts[1].1["cache_salt"], posts[2].1["cache_salt"],
        "one tenant, one salt"
    );
    for (path, body) in &posts[1..] {
        assert_eq!(path, CHAT);
        let salt = body["cache_salt"].as_str().unwrap();
        assert_eq!(
            salt.len(),
            64,
            "a keyed hash of the tenant, not its name: {salt}"
        );
        assert!(!salt.contains("acme"));
        assert_eq!(body["model"], "sql-lora");
    }
    for upstream in &upstreams {
        let loads = calls(upstream)
            .iter()
            .filter(|(p, _)| p == "/v1/load_lora_adapter")
            .count();
        assert_eq!(loads, usize::from(upstream.name == owner));
    }
    assert_eq!(batcher.metric("cohort_lora_loads_total"), 1.0);
    std::fs::remove_file(config).unwrap();
}

/// A leader held at its engine for 600 ms, then, inside its window, a request of the same
/// cohort (same system prompt) that shares most of its prompt and one that brings 3 KB of
/// its own: what `x-cohort-batch` each gets, under `batch.min_shared` = `min_shared`.
fn roles_under_min_shared(min_shared: &str) -> (Vec<String>, Batcher) {
    let upstreams = [Upstream::start("replica-0"), Upstream::start("replica-1")];
    for upstream in &upstreams {
        upstream.set_delay(Duration::from_millis(600));
    }
    let config = std::env::temp_dir().join(format!(
        "cohort-min-shared-{}-{min_shared}.toml",
        std::process::id()
    ));
    std::fs::write(&config, format!("[batch]\nmin_shared = {min_shared}\n")).unwrap();
    let replicas: Vec<String> = upstreams
        .iter()
        .map(|u| format!("{}=openai+http://127.0.0.1:{}", u.name, u.port))
        .collect();
    let batcher = front(
        &replicas,
        vec!["--config".into(), config.to_string_lossy().into_owned()],
    );
    let port = batcher.spec.front_port.unwrap();
    // One block of system prompt (256 B), then the user turn.
    let system = "You answer questions about our invoices. ".repeat(7);
    let body = |user: &str| {
        serde_json::to_vec(&json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": user},
            ],
        }))
        .unwrap()
    };
    let leader = body("Which tables hold the invoices?");
    let close = body("Which tables hold the credit notes?");
    let long = body(&"Here is my whole ledger, line after line of it. ".repeat(64));
    let roles = std::thread::scope(|scope| {
        let first = scope.spawn(|| post_json(port, CHAT, &[], &leader));
        // Deliberate window: the others arrive 60 ms after the leader, inside its window.
        std::thread::sleep(Duration::from_millis(60));
        let others = [&close, &long].map(|b| scope.spawn(move || post_json(port, CHAT, &[], b)));
        let mut roles = vec![first.join().unwrap()];
        roles.extend(others.map(|t| t.join().unwrap()));
        roles
            .into_iter()
            .map(|r| {
                assert_eq!(r.status, 200, "{}", r.text());
                let tag = r.header("x-cohort-batch").unwrap();
                tag.split(';').next().unwrap().to_owned()
            })
            .collect()
    });
    std::fs::remove_file(config).unwrap();
    (roles, batcher)
}

#[test]
fn a_request_joins_its_cohorts_batch_only_when_it_shares_enough_of_its_prompt() {
    let (roles, batcher) = roles_under_min_shared("0.5");
    assert_eq!(roles, ["leader", "follower", "direct"]);
    assert_eq!(
        batcher.metric("cohort_front_direct_total{reason=\"unshared\"}"),
        1.0
    );
    // The knob at 0: whatever shares the key joins, and is held.
    let (roles, batcher) = roles_under_min_shared("0");
    assert_eq!(roles, ["leader", "follower", "follower"]);
    assert_eq!(
        batcher.metric("cohort_front_direct_total{reason=\"unshared\"}"),
        0.0
    );
}

#[test]
fn a_body_the_front_cannot_parse_goes_to_an_engine_unchanged() {
    let upstream = Upstream::start("replica-0");
    let batcher = openai_front(&upstream);
    let port = batcher.spec.front_port.unwrap();
    let raw = b"{\"model\": \"m\", \"messages\": [unterminated";
    let response = post_json(port, CHAT, &[], raw);
    assert_eq!(response.status, 200);
    assert_eq!(
        response.header("x-cohort-batch"),
        Some("direct;replica=replica-0")
    );
    let received: Vec<_> = upstream
        .received()
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].body, raw, "byte for byte");
    assert_eq!(
        batcher.metric("cohort_front_direct_total{reason=\"unparsed\"}"),
        1.0
    );
}

#[test]
fn requests_for_an_unreachable_replica_fail_over() {
    let live = Upstream::start("replica-1");
    let dead_port = free_port();
    let batcher = front(
        &[
            format!("replica-0=openai+http://127.0.0.1:{dead_port}"),
            format!("replica-1=openai+http://127.0.0.1:{}", live.port),
        ],
        Vec::new(),
    );
    let port = batcher.spec.front_port.unwrap();
    let started = Instant::now();
    for i in 0..12 {
        let response = post_json(port, CHAT, &[], &chat("m", &format!("App {i}.")));
        assert_eq!(response.status, 200, "request {i}: {}", response.text());
        assert_eq!(response.header("x-upstream"), Some("replica-1"));
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "a refused connection fails over at once"
    );
    assert_eq!(batcher.metric("cohort_front_unreachable_total"), 0.0);
    assert_eq!(
        batcher.metric("cohort_engine_up{replica=\"replica-0\"}"),
        0.0
    );
}

#[test]
fn a_predicted_cohort_is_warmed_on_its_owner_before_it_arrives() {
    let upstreams = [Upstream::start("replica-0"), Upstream::start("replica-1")];
    let replicas: Vec<String> = upstreams
        .iter()
        .map(|u| format!("{}=openai+http://127.0.0.1:{}", u.name, u.port))
        .collect();
    let batcher = front(&replicas, Vec::new());
    let port = batcher.spec.front_port.unwrap();
    let send = |system: &str, session: &str, level: &str| {
        let headers = [("x-cohort-session", session), ("x-cohort-prefetch", level)];
        let response = post_json(port, CHAT, &headers, &chat("m", system));
        assert_eq!(response.status, 200);
        // Deliberate window: past the front's joining window (150 ms), so each step
        // leads its own batch.
        std::thread::sleep(Duration::from_millis(250));
    };
    // Two sessions walk "lookup" → "refund"; a third starts "lookup".
    for session in ["s1", "s2"] {
        send("Look up the order.", session, "high");
        send("Refund the order.", session, "high");
    }
    let warmups = || -> Vec<Value> {
        upstreams
            .iter()
            .flat_map(|u| u.received())
            .filter(|r| r.method == "POST")
            .map(|r| serde_json::from_slice::<Value>(&r.body).unwrap())
            .filter(|b| b["max_tokens"] == 1)
            .collect()
    };
    // The second walk already predicts "refund" after "lookup": one warm-up so far (it is
    // sent in the background, so wait for it rather than trust the pause above).
    assert!(
        eventually(Duration::from_secs(5), || warmups().len() == 1),
        "{:?}",
        warmups()
    );
    send("Look up the order.", "s3", "none");
    assert_eq!(warmups().len(), 1, "x-cohort-prefetch: none warms nothing");
    send("Look up the order.", "s4", "high");
    send("Refund the order.", "s4", "high");
    assert!(eventually(Duration::from_secs(5), || warmups().len() == 2));
    let warm = warmups();
    assert_eq!(warm.len(), 2);
    // The warm-up computes the cohort's prefix (its system prompt), not the exemplar's
    // own question.
    assert_eq!(
        warm[1]["messages"],
        json!([
            {"role": "system", "content": "Refund the order."},
            {"role": "user", "content": ""},
        ])
    );
    assert_eq!(warm[1]["stream"], false);
    assert_eq!(batcher.metric("cohort_prefetch_issued_total"), 2.0);
    assert_eq!(batcher.metric("cohort_prefetch_hit_total"), 2.0);
}

#[test]
fn a_tenant_capped_at_no_prefetch_gets_no_warm_ups() {
    // `[knobs.tenants.<t>] max_prefetch = "none"` in the batcher's configuration: that
    // tenant's `x-cohort-prefetch: high` is clamped to none at the front; another tenant
    // walking the same sequence is warmed.
    let upstreams = [Upstream::start("replica-0"), Upstream::start("replica-1")];
    let replicas: Vec<String> = upstreams
        .iter()
        .map(|u| format!("{}=openai+http://127.0.0.1:{}", u.name, u.port))
        .collect();
    let dir = std::env::temp_dir().join(format!(
        "cohort-knobs-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("serve.toml");
    std::fs::write(&path, "[knobs.tenants.capped]\nmax_prefetch = \"none\"\n").unwrap();
    let batcher = front(
        &replicas,
        vec!["--config".into(), path.display().to_string()],
    );
    let port = batcher.spec.front_port.unwrap();
    let walk = |tenant: &str| {
        for session in ["s1", "s2", "s3"] {
            for system in ["Look up the order.", "Refund the order."] {
                let headers = [
                    ("x-cohort-tenant", tenant),
                    ("x-cohort-session", session),
                    ("x-cohort-prefetch", "high"),
                ];
                let response = post_json(port, CHAT, &headers, &chat("m", system));
                assert_eq!(response.status, 200);
                // Deliberate window: past the front's joining window (150 ms), so each
                // step leads its own batch.
                std::thread::sleep(Duration::from_millis(250));
            }
        }
    };
    let issued = || batcher.metric("cohort_prefetch_issued_total");
    walk("capped");
    assert!(stays(QUIET_WINDOW, || issued() == 0.0), "{}", issued());
    // Positive control: another tenant's same walk is warmed, within the same window.
    walk("free");
    assert!(eventually(QUIET_WINDOW, || issued() >= 1.0));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_front_is_no_open_proxy_and_never_logs_prompts() {
    let upstream = Upstream::start("replica-0");
    let elsewhere = Upstream::start("elsewhere");
    let batcher = openai_front(&upstream);
    let port = batcher.spec.front_port.unwrap();
    let secret = "my-account-password-hunter2";
    let body = chat("m", &format!("Remember {secret}."));
    // Absolute-form target and Host naming another server: the front still sends to its
    // configured engine only.
    let raw = format!(
        "POST http://127.0.0.1:{}/v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        elsewhere.port,
        elsewhere.port,
        body.len()
    );
    let mut bytes = raw.into_bytes();
    bytes.extend_from_slice(&body);
    let response = cohort_tests::client::send_raw(port, &bytes).unwrap();
    assert_eq!(response.status, 200);
    assert_eq!(response.header("x-upstream"), Some("replica-0"));
    assert_eq!(elsewhere.count(), 0, "nothing reached the other server");
    // Other paths are not proxied at all.
    let other = post_json(port, "/admin/anything", &[], b"{}");
    assert_eq!(other.status, 404);
    assert!(!batcher.log().contains(secret), "prompt text in the log");
}
