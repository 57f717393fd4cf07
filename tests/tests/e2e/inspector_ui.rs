//! The inspector page in a real browser: headless Chromium loads `/ui` from a running
//! batcher that real Envoy + the real filter have been feeding observations, a prompt is
//! typed into the playground, and the page shows its fingerprint (computed in the browser
//! by the wasm-bindgen build of the core) and the batcher's nearest cohort. The browser
//! build must give the same sketch bytes as the native core (which the filter's wasm build
//! matches, `wasm_parity.rs`) on a fixed corpus. A screenshot is saved to
//! `target/test-artifacts/inspector.png`.
//!
//! Needs `scripts/setup` (Envoy, Chromium, wasm-bindgen) and `scripts/build-wasm` (the
//! filter and `target/ui/pkg`).

use cohort_fingerprint::record::{fingerprint_line, LineDefaults};
use cohort_tests::batcher::{Batcher, BatcherSpec};
use cohort_tests::chromium::Chromium;
use cohort_tests::client::post_json;
use cohort_tests::config::{self, set_endpoints, set_filter};
use cohort_tests::envoy::Envoy;
use cohort_tests::upstream::Upstream;
use cohort_tests::{free_port, workspace};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const CHAT: &str = "/v1/chat/completions";
const PROMPT: &str = "How can I reset my card PIN, customer 42?";

fn chat(user: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"model": "m", "messages": [
        {"role": "system", "content": "You are the Example Bank assistant."},
        {"role": "user", "content": user},
    ]}))
    .unwrap()
}

fn native_sketch(line: &str) -> Value {
    let record = fingerprint_line(line.as_bytes(), 1, &LineDefaults::default());
    serde_json::to_value(record).unwrap()["sketch_i8"].clone()
}

#[test]
fn the_playground_fingerprints_in_the_browser_and_names_the_nearest_cohort() {
    let assets = workspace().join("target/ui");
    assert!(
        assets.join("pkg/cohort_fingerprint_web_bg.wasm").exists(),
        "target/ui/pkg missing: run scripts/build-wasm (with wasm-bindgen from scripts/setup)"
    );
    let replicas: Vec<Upstream> = (0..3)
        .map(|i| Upstream::start(&format!("replica-{i}")))
        .collect();
    let batcher = Batcher::start(BatcherSpec {
        grpc_port: free_port(),
        http_port: free_port(),
        replicas: (0..3).map(|i| format!("replica-{i}")).collect(),
        shard_index: 0,
        shard_count: 1,
        front_port: None,
        extra_args: vec!["--ui-assets".into(), assets.to_string_lossy().into_owned()],
    });
    let mut envoy_config = config::load("assign");
    for (i, r) in replicas.iter().enumerate() {
        set_endpoints(&mut envoy_config, &format!("replica-{i}"), &[r.port]);
    }
    let ports: Vec<u16> = replicas.iter().map(|r| r.port).collect();
    set_endpoints(&mut envoy_config, "all-replicas", &ports);
    set_endpoints(
        &mut envoy_config,
        "cohort-batcher-0",
        &[batcher.spec.grpc_port],
    );
    set_filter(
        &mut envoy_config,
        &json!({"mode": "assign", "assign_deadline_ms": 250, "batcher_clusters": ["cohort-batcher-0"]})
            .to_string(),
    );
    let envoy = Envoy::start(&envoy_config);

    // Traffic of two intents, observed by the batcher through the filter.
    for i in 0..6 {
        for user in [
            format!("How can I reset my card PIN, customer {i}?"),
            format!("What will the weather be in Paris on day {i}?"),
        ] {
            assert_eq!(
                post_json(envoy.listen_port, CHAT, &[], &chat(&user)).status,
                200
            );
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while batcher.metric("cohort_observations_total") < 12.0 {
        assert!(Instant::now() < deadline, "observations did not arrive");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The batcher's own answer for the prompt: the cohort it assigns (x-cohort-cluster).
    post_json(envoy.listen_port, CHAT, &[], &chat(PROMPT));
    let assigned = replicas
        .iter()
        .flat_map(|r| r.received())
        .find(|r| String::from_utf8_lossy(&r.body).contains(PROMPT))
        .and_then(|r| r.header("x-cohort-cluster").map(str::to_owned))
        .expect("the prompt reached a replica with a cohort");

    let mut browser = Chromium::open(&format!("http://127.0.0.1:{}/ui", batcher.spec.http_port));
    browser.wait_for(
        "document.body?.dataset.ready === '1'",
        Duration::from_secs(30),
    );
    browser.eval("document.getElementById('prompt').focus()");
    browser.type_text(PROMPT);
    browser.press_enter();
    browser.wait_for(
        "document.getElementById('nearest').dataset.state === 'done'",
        Duration::from_secs(10),
    );
    let shown = browser.eval("document.getElementById('fingerprint').dataset.sketch");
    let shown: Value = serde_json::from_str(shown.as_str().unwrap()).unwrap();
    assert_eq!(
        shown,
        native_sketch(&json!({"text": PROMPT}).to_string()),
        "the browser's sketch is the core's"
    );
    let nearest = browser.eval("document.getElementById('nearest').dataset.first");
    assert_eq!(
        nearest.as_str(),
        Some(assigned.as_str()),
        "the playground names the cohort the batcher assigns"
    );
    browser.wait_for(
        "document.querySelectorAll('#cohorts tbody tr').length >= 2",
        Duration::from_secs(10),
    );

    // The browser build against the native core on a fixed corpus.
    let corpus = std::fs::read_to_string(workspace().join("data/samples/requests.jsonl")).unwrap();
    let lines: Vec<&str> = corpus.lines().filter(|l| !l.trim().is_empty()).collect();
    let in_browser = browser.eval(&format!(
        "JSON.stringify(window.cohortSketches({}))",
        serde_json::to_string(&lines).unwrap()
    ));
    let in_browser: Vec<Value> = serde_json::from_str(in_browser.as_str().unwrap()).unwrap();
    assert_eq!(in_browser.len(), lines.len());
    for (line, sketch) in lines.iter().zip(&in_browser) {
        assert_eq!(sketch, &native_sketch(line), "{line}");
    }

    let png = browser.screenshot();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let dir = workspace().join("target/test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("inspector.png"), png).unwrap();
}
