//! Real engines: three llama-server replicas behind real Envoy, once with Cohort in its
//! default demo mode (assign: the filter and `cohort serve`) and once round-robin, on the
//! same requests (`scripts/demo`, which the README runs as the live demo). The engines' own
//! `cached_tokens` must show that Cohort's routing lets them reuse more of the prompt.
//!
//! Needs scripts/setup (Envoy, the filter, llama-server and the model).

use std::process::Command;

const REQUESTS: u64 = 48;

#[test]
fn the_demo_routing_yields_more_engine_cached_prompt_tokens_than_round_robin() {
    // One at a time: three real engines take the machine.
    let _alone = cohort_tests::one_at_a_time();
    let workspace = cohort_tests::workspace();
    let out = std::env::temp_dir().join(format!(
        "cohort-demo-{}-{}.json",
        std::process::id(),
        cohort_tests::free_port()
    ));
    // The demo with this checkout's `cohort`, the one the tests run (the README's demo
    // runs the release build scripts/setup makes).
    let status = Command::new(workspace.join("scripts/demo"))
        .args(["--requests", &REQUESTS.to_string(), "--json"])
        .arg(&out)
        .env("COHORT_BIN", cohort_tests::batcher::binary())
        .current_dir(&workspace)
        .status()
        .expect("scripts/demo runs");
    assert!(status.success(), "scripts/demo failed: {status}");
    let phases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    std::fs::remove_file(&out).unwrap();

    let total = |phase: &str, field: &str| phases[phase]["all"][field].as_u64().unwrap();
    for phase in ["cohort assign", "round-robin"] {
        assert_eq!(
            total(phase, "requests"),
            REQUESTS,
            "{phase}: every request answered"
        );
        assert!(
            total(phase, "prompt_tokens") > REQUESTS * 50,
            "{phase}: engines reported prompt tokens"
        );
    }
    assert_eq!(
        total("cohort assign", "prompt_tokens"),
        total("round-robin", "prompt_tokens")
    );
    let (cohort, round_robin) = (
        total("cohort assign", "cached_tokens"),
        total("round-robin", "cached_tokens"),
    );
    println!("cached prompt tokens: cohort {cohort}, round-robin {round_robin}");
    assert!(
        cohort > round_robin,
        "cohort {cohort} cached tokens vs round-robin {round_robin}"
    );
}
