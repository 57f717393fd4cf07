//! The per-request cost audit, end to end: real Envoy with the real filter, a real
//! `cohort serve`, recording upstreams as engine replicas. A request's id is Envoy's
//! `x-request-id` (read here from what the engine received); the batcher answers
//! `GET /v1/audit/{id}` and `cohort audit <id>` for the request's tenant, in assign mode
//! and in batch mode (with the front's batch role), and refuses another tenant.

use cohort_tests::batcher::binary;
use cohort_tests::client::{post_json, request};
use cohort_tests::eventually;
use cohort_tests::stack::{Replicas, Stack};
use serde_json::{json, Value};
use std::time::Duration;

const CHAT: &str = "/v1/chat/completions";

fn body(user: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are the support assistant of Example Bank. Answer briefly and politely, and never ask for a full card number."},
            {"role": "user", "content": user},
        ],
        "max_tokens": 8,
    }))
    .unwrap()
}

/// `GET /v1/audit/{id}` on the batcher as `tenant`: (status, JSON).
fn audit(http_port: u16, id: &str, tenant: &str) -> (u16, Value) {
    let response = request(
        http_port,
        "GET",
        &format!("/v1/audit/{id}"),
        &[("x-cohort-tenant", tenant)],
        b"",
    )
    .expect("the batcher answers");
    (
        response.status,
        serde_json::from_slice(&response.body).unwrap(),
    )
}

/// The request ids the engines received, with the replica that got each.
fn received_ids(stack: &Stack) -> Vec<(String, String)> {
    stack
        .upstreams()
        .flat_map(|u| {
            u.received()
                .into_iter()
                .filter_map(|r| {
                    r.header("x-request-id")
                        .map(|id| (id.to_owned(), u.name.clone()))
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn assign_mode_requests_are_audited_for_their_tenant_only() {
    let stack = Stack::assign()
        .filter(json!({"assign_deadline_ms": 2000, "trust_tenant_header": true}))
        .start();
    let batcher = stack.batcher();
    let listen = stack.port();
    for user in [
        "how do I reset my PIN?",
        "my card was declined",
        "how do I reset my PIN?",
    ] {
        let response = post_json(
            listen,
            CHAT,
            &[("x-cohort-tenant", "tenant-a")],
            &body(user),
        );
        assert_eq!(response.status, 200);
    }
    let ids = received_ids(&stack);
    assert_eq!(ids.len(), 3);
    let http = batcher.spec.http_port;
    for (id, replica) in &ids {
        // The end of the request reaches the batcher on the observation stream.
        assert!(eventually(Duration::from_secs(5), || {
            audit(http, id, "tenant-a").1["status"] == 200
        }));
        let (status, record) = audit(http, id, "tenant-a");
        println!("{}", serde_json::to_string(&record).unwrap());
        assert_eq!(status, 200);
        assert_eq!(record["request_id"], id.as_str());
        assert_eq!(record["mode"], "assign");
        assert_eq!(
            record["replica"],
            replica.as_str(),
            "the replica that got it"
        );
        assert!(record["prompt_tokens_est"].as_u64().unwrap() > 20);
        assert!(record["prefix_blocks"].as_u64().unwrap() >= 1);
        assert!(record["first_byte_ms"].is_u64());
        assert!(record["prefill_ms_est"].as_f64().unwrap() >= 0.0);
        assert!(record["batch_role"].is_null());
        // Another tenant, or no tenant, learns nothing.
        assert_eq!(audit(http, id, "tenant-b").0, 404);
        assert_eq!(audit(http, id, "").0, 404);
    }
    // The third request repeats the first's prompt on the same replica: its prefix is
    // matched in full there.
    let (_, last) = audit(
        http,
        &ids.iter().find(|(_, r)| *r == ids[0].1).unwrap().0,
        "tenant-a",
    );
    assert!(last["prefix_blocks"].as_u64().unwrap() >= 1);
    let repeats: Vec<Value> = ids
        .iter()
        .map(|(id, _)| audit(http, id, "tenant-a").1)
        .filter(|r| r["matched_blocks"] == r["prefix_blocks"])
        .collect();
    assert!(!repeats.is_empty(), "the repeated prompt found its prefix");
    assert!(repeats
        .iter()
        .all(|r| r["cached_tokens_est"] == r["prompt_tokens_est"]));

    // A request the filter passed through (not JSON): its reason, for its tenant.
    let before = received_ids(&stack).len();
    let response = post_json(listen, CHAT, &[("x-cohort-tenant", "tenant-a")], b"{oops");
    assert_eq!(response.status, 200);
    let ids_now = received_ids(&stack);
    assert_eq!(ids_now.len(), before + 1);
    let seen: std::collections::BTreeSet<&String> = ids.iter().map(|(id, _)| id).collect();
    let (bypassed, _) = ids_now.iter().find(|(id, _)| !seen.contains(id)).unwrap();
    assert!(eventually(Duration::from_secs(5), || {
        audit(http, bypassed, "tenant-a").0 == 200
    }));
    let (_, record) = audit(http, bypassed, "tenant-a");
    println!("{}", serde_json::to_string(&record).unwrap());
    assert_eq!(record["bypass"], "invalid_json");
    assert_eq!(record["mode"], "assign");
    assert_eq!(audit(http, bypassed, "tenant-b").0, 404);

    // The command line: the same record, exit 0; another tenant, exit 1.
    let (id, _) = &ids[0];
    let out = std::process::Command::new(binary())
        .args([
            "audit",
            id,
            "--batcher",
            &format!("127.0.0.1:{http}"),
            "--tenant",
            "tenant-a",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["request_id"], id.as_str());
    let out = std::process::Command::new(binary())
        .args([
            "audit",
            id,
            "--batcher",
            &format!("127.0.0.1:{http}"),
            "--tenant",
            "tenant-b",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    drop(stack);
}

#[test]
fn batch_mode_requests_are_audited_with_their_batch_role() {
    // One at a time: the request goes through the front only while Envoy connects to it
    // within its 250 ms connect timeout, which a loaded machine can miss.
    let _alone = cohort_tests::one_at_a_time();
    let stack = Stack::batch()
        .upstreams(2)
        .replicas(Replicas::Adapter("vllm"))
        .filter(json!({"assign_deadline_ms": 2000, "trust_tenant_header": true}))
        .start();
    let batcher = stack.batcher();
    let response = post_json(
        stack.port(),
        CHAT,
        &[("x-cohort-tenant", "tenant-a")],
        &body("how do I reset my PIN?"),
    );
    assert_eq!(response.status, 200);
    assert!(
        response.header("x-cohort-batch").is_some(),
        "answered through the front"
    );
    let ids = received_ids(&stack);
    assert_eq!(ids.len(), 1);
    let (id, replica) = &ids[0];
    let http = batcher.spec.http_port;
    assert!(eventually(Duration::from_secs(5), || {
        audit(http, id, "tenant-a").1["status"] == 200
    }));
    let (status, record) = audit(http, id, "tenant-a");
    println!("{}", serde_json::to_string(&record).unwrap());
    assert_eq!(status, 200);
    assert_eq!(record["mode"], "batch");
    assert_eq!(record["batch_role"], "leader");
    assert_eq!(record["answered_by"], replica.as_str());
    assert_eq!(record["warmed"], false);
    assert_eq!(audit(http, id, "tenant-b").0, 404);
}
