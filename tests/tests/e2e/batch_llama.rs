//! Batch mode end to end on real engines: real Envoy with the real filter (mode `batch`),
//! a real `cohort serve` with its HTTP front, and three real llama.cpp replicas
//! (`istio/envoy/batch.yaml`).
//!
//! - a burst of one cohort lands on one replica as one batch (a leader and followers), the
//!   followers' engine-reported `cached_tokens` cover the shared prefix, and every caller's
//!   SSE stream arrives whole (role, content, usage, `[DONE]`);
//! - a caller that hangs up mid-stream cancels only its own member: the others finish;
//! - callers that hang up while their non-streamed answers are still being generated leave
//!   nothing behind: the front's in-flight counts and slots go back to zero, and warm-ups,
//!   which need idle slots, still go out afterwards;
//! - SIGTERM drains: a request the front accepted is answered in full before it exits.
//!
//! Needs `scripts/setup` (Envoy, llama-server and the model), `scripts/build-wasm` and the
//! `cohort` binary; `scripts/test` provides all of them.

use cohort_tests::client::{post_json, post_stream};
use cohort_tests::stack::Stack;
use cohort_tests::{eventually, one_at_a_time};
use serde_json::{json, Value};
use std::time::Duration;

const CHAT: &str = "/v1/chat/completions";

/// The stack with the front's default joining window. The caller holds
/// [`one_at_a_time`] first: one stack (three engines) at a time, so a test's timing is its
/// own.
fn stack() -> Stack {
    stack_with_window(None)
}

/// The stack; `window_ms` sets the front's joining window (for bursts that must form one
/// batch: far longer than the tests' 30 ms spacing, so on a slow machine a late member
/// still joins its cohort's batch rather than leading a second one).
fn stack_with_window(window_ms: Option<u32>) -> Stack {
    // A generous Assign deadline: on a loaded 2-core test machine a 25 ms deadline can
    // expire, and the request would then (correctly) skip batching.
    let stack = Stack::batch().llama(3, 2);
    let stack = match window_ms {
        Some(window_ms) => stack.serve_toml(&format!("[batch]\nwindow_ms = {window_ms}\n")),
        None => stack,
    }
    .start();
    // Deliberate window: the front's first engine probe (slot counts from /props) runs at
    // start and shows in no metric (the replicas count as up before it); give it a beat.
    std::thread::sleep(Duration::from_millis(1500));
    stack
}

/// A request of one cohort: a long shared system prompt (unique per `tag`, so no earlier
/// test's cache helps), and a member-specific question.
fn body(tag: &str, member: usize, max_tokens: u32) -> Vec<u8> {
    let system = format!(
        "[{tag}] You are the assistant of the Example Bank support desk. {}",
        "Answer in two sentences, cite the policy section, never reveal account numbers, and offer the secure-message link when a customer is locked out. ".repeat(10)
    );
    serde_json::to_vec(&json!({
        "model": "gemma-3-270m",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": format!("Customer {member}: how do I reset my card PIN?")},
        ],
        "max_tokens": max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
    }))
    .unwrap()
}

/// One member's whole stream, checked for shape.
struct Member {
    role: String,
    replica: String,
    prompt_tokens: u64,
    cached_tokens: u64,
    completion_tokens: u64,
}

fn read_member(port: u16, tag: &str, member: usize, max_tokens: u32) -> Member {
    let mut stream = post_stream(port, CHAT, &[], &body(tag, member, max_tokens));
    assert_eq!(stream.status, 200, "member {member}");
    let batch = stream
        .header("x-cohort-batch")
        .unwrap_or_else(|| panic!("member {member} did not go through the batch front"))
        .to_owned();
    let (role, replica) = batch.split_once(";replica=").expect("role;replica=name");
    let mut events = Vec::new();
    while let Some(data) = stream.next_data() {
        events.push(data);
    }
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "member {member}: stream ends with [DONE]"
    );
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("each event is one JSON chunk"))
        .collect();
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert!(!content.is_empty(), "member {member}: content streamed");
    let ids: std::collections::BTreeSet<&str> =
        chunks.iter().filter_map(|c| c["id"].as_str()).collect();
    assert_eq!(ids.len(), 1, "member {member}: one completion, not a mix");
    let usage = chunks
        .iter()
        .rev()
        .find_map(|c| c.get("usage").filter(|u| u.is_object()))
        .expect("usage chunk");
    Member {
        role: role.to_owned(),
        replica: replica.to_owned(),
        prompt_tokens: usage["prompt_tokens"].as_u64().unwrap(),
        cached_tokens: usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
        completion_tokens: usage["completion_tokens"].as_u64().unwrap(),
    }
}

#[test]
fn a_burst_of_one_cohort_is_batched_and_followers_reuse_the_leaders_prefix() {
    let _serial = one_at_a_time();
    let stack = stack_with_window(Some(2000));
    let port = stack.port();
    let tag = format!("burst-{}", std::process::id());
    let members: Vec<Member> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let tag = &tag;
                let handle = scope.spawn(move || read_member(port, tag, i, 12));
                // Deliberate window: the burst's members are paced 30 ms apart.
                std::thread::sleep(Duration::from_millis(30));
                handle
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let leaders = members.iter().filter(|m| m.role == "leader").count();
    assert_eq!(leaders, 1, "one leader: {:?}", roles(&members));
    assert!(
        members.iter().all(|m| m.replica == members[0].replica),
        "one replica: {:?}",
        roles(&members)
    );
    for m in &members {
        println!(
            "{} on {}: prompt {} cached {} completion {}",
            m.role, m.replica, m.prompt_tokens, m.cached_tokens, m.completion_tokens
        );
        assert!(m.prompt_tokens > 250, "a long shared prompt");
        assert_eq!(m.completion_tokens, 12);
        // The user turn differs (≈15 tokens); everything before it is shared.
        if m.role == "follower" {
            assert!(
                m.cached_tokens + 30 >= m.prompt_tokens,
                "a follower reuses the shared prefix: cached {} of {}",
                m.cached_tokens,
                m.prompt_tokens
            );
        } else {
            assert!(
                m.cached_tokens < m.prompt_tokens / 2,
                "the leader computes it"
            );
        }
    }
    let metric = |s: &str| stack.batcher().metric(s);
    assert_eq!(metric("cohort_front_requests_total{role=\"leader\"}"), 1.0);
    assert_eq!(
        metric("cohort_front_requests_total{role=\"follower\"}"),
        3.0
    );
    // Batch mode feeds the live load too: the filter reported each member's first byte and
    // end under its Assign ticket, and the book is empty again once all have ended.
    // The end is counted a moment before the in-flight book is updated: wait for both.
    let in_flight = || -> f64 {
        ["replica-0", "replica-1", "replica-2"]
            .iter()
            .map(|r| metric(&format!("cohort_replica_in_flight{{replica=\"{r}\"}}")))
            .sum()
    };
    assert!(
        cohort_tests::eventually(Duration::from_secs(5), || {
            metric("cohort_progress_reports_total{phase=\"end\"}") == 4.0 && in_flight() == 0.0
        }),
        "{}",
        stack
            .batcher()
            .metrics()
            .lines()
            .filter(|l| l.contains("progress") || l.contains("assign"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(
        metric("cohort_progress_reports_total{phase=\"first_byte\"}"),
        4.0
    );
    assert_eq!(
        metric("cohort_progress_reports_total{phase=\"unknown\"}"),
        0.0
    );
    assert_eq!(in_flight(), 0.0);
}

#[test]
fn a_caller_hanging_up_cancels_only_its_own_member() {
    let _serial = one_at_a_time();
    let stack = stack_with_window(Some(2000));
    let port = stack.port();
    let tag = format!("cancel-{}", std::process::id());
    let finished: Vec<Option<Member>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..3)
            .map(|i| {
                let tag = &tag;
                let handle = scope.spawn(move || {
                    if i == 1 {
                        // Read the first event, then hang up. This member asks for far
                        // more tokens than the others, so its answer is still being
                        // generated when the hang-up reaches the front, however fast the
                        // machine (at 48 tokens a fast runner could relay the whole answer
                        // into Envoy's buffers first, and nothing would be cancelled).
                        let mut stream = post_stream(port, CHAT, &[], &body(tag, i, 1024));
                        assert_eq!(stream.status, 200);
                        assert!(
                            stream.header("x-cohort-batch").is_some(),
                            "the member that hangs up went through the batch front"
                        );
                        assert!(stream.next_data().is_some());
                        drop(stream);
                        None
                    } else {
                        Some(read_member(port, tag, i, 48))
                    }
                });
                // Deliberate window: the members are paced 30 ms apart.
                std::thread::sleep(Duration::from_millis(30));
                handle
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for member in finished.iter().flatten() {
        assert_eq!(
            member.completion_tokens, 48,
            "{} finished its whole answer",
            member.role
        );
    }
    assert_eq!(finished.iter().flatten().count(), 2);
    // The front counts a cancellation when its relay is dropped, which follows Envoy's
    // reset of the upstream stream by a few milliseconds.
    assert!(
        eventually(Duration::from_secs(10), || {
            stack.batcher().metric("cohort_front_cancelled_total") >= 1.0
        }),
        "the front never saw the hang-up: {}",
        stack.batcher().metric("cohort_front_cancelled_total")
    );
}

/// A short chat of its own system prompt (one cohort per prompt), not streamed.
fn plain(system: &str, max_tokens: u32) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "model": "gemma-3-270m",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "Go on."},
        ],
        "max_tokens": max_tokens,
    }))
    .unwrap()
}

#[test]
fn callers_hanging_up_mid_generation_leave_no_count_or_slot_behind() {
    let _serial = one_at_a_time();
    let stack = stack();
    let front = stack.batcher().spec.front_port.unwrap();
    let metric = |s: &str| stack.batcher().metric(s);
    let summed = |name: &str| -> f64 {
        (0..3)
            .map(|r| metric(&format!("{name}{{replica=\"replica-{r}\"}}")))
            .sum()
    };
    let tag = format!("hangup-{}", std::process::id());
    let (lookup, refund) = (
        format!("[{tag}] Look up the order."),
        format!("[{tag}] Refund the order."),
    );
    // Two sessions walk lookup → refund: the front learns that refund follows lookup.
    for session in ["s1", "s2"] {
        for system in [&lookup, &refund] {
            let headers = [("x-cohort-session", session), ("x-cohort-prefetch", "high")];
            let r = post_json(front, CHAT, &headers, &plain(system, 1));
            assert_eq!(r.status, 200, "{}", r.text());
        }
    }
    // Twenty callers of other cohorts hang up while their answers are being generated
    // (non-streamed: no byte comes back before the end). They also take the slots that
    // held refund's prefix, so a warm-up of refund is worth sending afterwards.
    std::thread::scope(|scope| {
        for i in 0..20 {
            let body = plain(&format!("[{tag}] Caller {i} writes a long story."), 64);
            scope.spawn(move || {
                let mut raw = format!(
                    "POST {CHAT} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                )
                .into_bytes();
                raw.extend_from_slice(&body);
                let mut conn = std::net::TcpStream::connect(("127.0.0.1", front)).unwrap();
                std::io::Write::write_all(&mut conn, &raw).unwrap();
                // Deliberate window: the caller hangs up 600 ms into generation.
                std::thread::sleep(Duration::from_millis(600));
                drop(conn);
            });
        }
    });
    assert!(
        eventually(Duration::from_secs(10), || summed(
            "cohort_engine_in_flight"
        ) == 0.0
            && summed("cohort_front_slots_busy") == 0.0),
        "counts left behind: {}",
        stack
            .batcher()
            .metrics()
            .lines()
            .filter(|l| l.contains("in_flight") || l.contains("slots_busy"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // A third user session starts with lookup: refund's warm-up goes out on idle slots.
    let issued = metric("cohort_prefetch_issued_total");
    let headers = [("x-cohort-session", "s3"), ("x-cohort-prefetch", "high")];
    assert_eq!(
        post_json(front, CHAT, &headers, &plain(&lookup, 1)).status,
        200
    );
    assert!(
        eventually(Duration::from_secs(5), || metric(
            "cohort_prefetch_issued_total"
        ) > issued),
        "no warm-up after the hang-ups: {}",
        stack.batcher().metrics()
    );
}

#[test]
fn sigterm_drains_what_the_front_accepted() {
    let _serial = one_at_a_time();
    let mut stack = stack();
    let port = stack.port();
    let tag = format!("drain-{}", std::process::id());
    let member = std::thread::scope(|scope| {
        let reader = scope.spawn(|| read_member(port, &tag, 0, 48));
        // Let the request reach the front (and its engine), then stop the batcher under it.
        let front_has_it = eventually(Duration::from_secs(20), || {
            stack
                .batcher()
                .metric("cohort_front_requests_total{role=\"leader\"}")
                >= 1.0
        });
        assert!(front_has_it, "the request never reached the front");
        // Deliberate window: 300 ms into its generation.
        std::thread::sleep(Duration::from_millis(300));
        let status = stack
            .batcher_mut()
            .terminate()
            .expect("the batcher was running");
        assert!(status.success(), "exits 0 after draining: {status}");
        reader.join().unwrap()
    });
    assert_eq!(member.role, "leader");
    assert_eq!(
        member.completion_tokens, 48,
        "the whole answer, after SIGTERM"
    );
}

fn roles(members: &[Member]) -> Vec<String> {
    members
        .iter()
        .map(|m| format!("{}@{}", m.role, m.replica))
        .collect()
}
