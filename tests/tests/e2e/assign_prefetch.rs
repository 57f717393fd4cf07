//! Prefetch in assign mode, end to end: real Envoy with the real filter in assign mode,
//! real `cohort serve` over real gRPC with the replicas' URLs, three recording upstream
//! engines (`batcher-service/src/front/assigned.rs`).
//!
//! - the batcher learns cohort sequences from Assigns, asks the filter for one body per
//!   cohort (`exemplar_wanted`), and warms the predicted next cohort on its owner replica
//!   with one output token, computing the shared prefix only;
//! - `x-cohort-prefetch: none` warms nothing, nor does a request without a session, and
//!   the batcher's `[knobs]` cap a tenant;
//! - a prefix that still counts as held on its owner (within its cache TTL, not evicted
//!   from the modelled cache) is not warmed again.
//!
//! The system prompts are about 900 bytes (three of the filter's 256-byte blocks shared):
//! with `kv_blocks_per_replica = 2` the batcher never counts one as held, so it warms.
//!
//! Needs `scripts/setup` (Envoy), `scripts/build-wasm` (the filter) and the `cohort`
//! binary; `scripts/test` does all three.

use cohort_tests::client::post_json;
use cohort_tests::stack::{Replicas, Stack};
use cohort_tests::{eventually, one_at_a_time, stays, QUIET_WINDOW};
use serde_json::{json, Value};
use std::time::Duration;

const CHAT: &str = "/v1/chat/completions";
/// A modelled prefix cache of two blocks per replica: smaller than a system prompt.
const SMALL_CACHE: &str = "[policy]\nkv_blocks_per_replica = 2\n";
/// The batcher's count of requests whose end the filter reported.
const END_REPORTS: &str = "cohort_progress_reports_total{phase=\"end\"}";

/// Three generic OpenAI-compatible engines behind Envoy in assign mode; `serve_toml` is
/// the batcher's configuration file, if any.
fn stack(serve_toml: Option<&str>) -> Prefetch {
    let stack = Stack::assign()
        .replicas(Replicas::Adapter("openai"))
        .filter(json!({"trust_tenant_header": true}));
    Prefetch(
        match serve_toml {
            Some(toml) => stack.serve_toml(toml),
            None => stack,
        }
        .start(),
    )
}

/// The stack, with the walks of these tests.
struct Prefetch(Stack);

/// A conversation step: an application's system prompt, with the session's question.
fn body(system: &str, question: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"model": "m", "messages": [
        {"role": "system", "content": format!("{system} {}", "Be brief and polite. ".repeat(40))},
        {"role": "user", "content": question},
    ]}))
    .unwrap()
}

impl Prefetch {
    /// Sends one step of `session`; returns the replica that answered once the filter's
    /// observation of it (its exemplar included) and its end reached the batcher.
    fn send(&self, tenant: &str, session: &str, level: &str, system: &str) -> String {
        let headers = [
            ("x-cohort-tenant", tenant),
            ("x-cohort-session", session),
            ("x-cohort-prefetch", level),
        ];
        let question = format!("Question of {session}");
        let b = self.0.batcher();
        let observations = b.metric("cohort_observations_total");
        let ends = b.metric(END_REPORTS);
        let response = post_json(self.0.port(), CHAT, &headers, &body(system, &question));
        assert_eq!(response.status, 200, "{}", response.text());
        assert!(
            eventually(Duration::from_secs(5), || b
                .metric("cohort_observations_total")
                > observations
                && b.metric(END_REPORTS) > ends),
            "the observation and the end of {session}'s request reached the batcher"
        );
        response.header("x-upstream").unwrap_or_default().to_owned()
    }

    /// Sessions walk "look up" then "refund"; returns where each went the last time.
    fn walk(&self, tenant: &str, sessions: &[&str], level: &str) -> (String, String) {
        let mut went = (String::new(), String::new());
        for session in sessions {
            went.0 = self.send(tenant, session, level, "Look up the customer's order.");
            went.1 = self.send(tenant, session, level, "Refund the customer's order.");
        }
        went
    }

    /// Warm-ups received so far: (replica, body).
    fn warmups(&self) -> Vec<(String, Value)> {
        self.0
            .upstreams()
            .flat_map(|u| {
                u.received()
                    .into_iter()
                    .filter(|r| r.method == "POST")
                    .map(|r| {
                        (
                            u.name.clone(),
                            serde_json::from_slice::<Value>(&r.body).unwrap(),
                        )
                    })
            })
            .filter(|(_, b)| b["max_tokens"] == 1)
            .collect()
    }
}

#[test]
fn assign_mode_warms_the_predicted_cohort_on_its_owner() {
    let _serial = one_at_a_time();
    let stack = stack(Some(SMALL_CACHE));
    // Two sessions walk lookup → refund: the batcher learns the step and, for each cohort,
    // asks the filter for one body.
    let (_, refund_on) = stack.walk("t", &["s1", "s2"], "high");
    assert!(
        eventually(Duration::from_secs(3), || stack.warmups().len() == 1),
        "the second walk's lookup predicted refund: {:?}",
        stack.warmups()
    );
    // A third user session's lookup: refund is warmed again on its owner, after the lookup's
    // first byte.
    let before = stack.warmups().len();
    stack.send("t", "s3", "high", "Look up the customer's order.");
    assert!(eventually(Duration::from_secs(3), || {
        stack.warmups().len() > before
    }));
    let warm = stack.warmups();
    for (replica, body) in &warm {
        assert_eq!(replica, &refund_on, "warmed where refund's prefix lives");
        // The shared prefix only: the system prompt, an empty user turn, one token.
        assert_eq!(body["messages"][1], json!({"role": "user", "content": ""}));
        assert!(body["messages"][0]["content"]
            .as_str()
            .unwrap()
            .starts_with("Refund the customer's order."));
        assert_eq!(body["stream"], false);
    }
    let b = stack.0.batcher();
    assert_eq!(b.metric("cohort_prefetch_issued_total"), warm.len() as f64);
    assert!(
        b.metric("cohort_prefetch_hit_total") >= 1.0,
        "refund came while warm"
    );
    // `none` warms nothing.
    let before = stack.warmups().len();
    stack.send("t", "s4", "none", "Look up the customer's order.");
    assert!(
        stays(QUIET_WINDOW, || stack.warmups().len() == before),
        "x-cohort-prefetch: none"
    );
    // Without a session, the tenant's interleaved requests predict nothing worth warming.
    stack.walk("t", &["", "", ""], "high");
    assert!(
        stays(QUIET_WINDOW, || stack.warmups().len() == before),
        "no x-cohort-session"
    );
    // Positive control: the same lookup with a session and `high`, after both, is warmed
    // within the same window.
    stack.send("t", "s5", "high", "Look up the customer's order.");
    assert!(
        eventually(QUIET_WINDOW, || stack.warmups().len() > before),
        "a session's lookup at high is warmed within {QUIET_WINDOW:?}"
    );
}

#[test]
fn the_batchers_knob_policy_caps_a_tenants_prefetch_in_assign_mode() {
    let _serial = one_at_a_time();
    let stack = stack(Some(&format!(
        "{SMALL_CACHE}[knobs.tenants.capped]\nmax_prefetch = \"none\"\n"
    )));
    stack.walk("capped", &["s1", "s2", "s3"], "high");
    assert!(
        stays(QUIET_WINDOW, || stack.warmups().is_empty()),
        "{:?}",
        stack.warmups()
    );
    // Positive control: another tenant's same walk is warmed within the same window.
    stack.walk("free", &["s1", "s2", "s3"], "high");
    assert!(eventually(QUIET_WINDOW, || !stack.warmups().is_empty()));
}

#[test]
fn a_prefix_held_within_its_cache_ttl_is_not_warmed_again() {
    // The default modelled cache holds the prompts: refund's prefix counts as held on its
    // owner for its TTL (600 s), so predicting refund warms nothing.
    let _serial = one_at_a_time();
    let held = stack(None);
    held.walk("t", &["s1", "s2", "s3"], "high");
    assert!(
        stays(QUIET_WINDOW, || held.warmups().is_empty()),
        "{:?}",
        held.warmups()
    );
    let b = held.0.batcher();
    assert!(
        b.metric("cohort_prefetch_hit_total") == 0.0
            && b.metric("cohort_prefetch_miss_total") == 0.0,
        "refund arrived warm, by the model: neither a hit nor a miss"
    );
    drop(held);
    // Positive control: the same walk where the modelled cache cannot hold the prompt (two
    // blocks per replica), so refund's prefix is not held: it is warmed, within the same
    // window.
    let not_held = stack(Some(SMALL_CACHE));
    not_held.walk("t", &["s1", "s2", "s3"], "high");
    assert!(
        eventually(QUIET_WINDOW, || !not_held.warmups().is_empty()),
        "a prefix not held is warmed"
    );
}
