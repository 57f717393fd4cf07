//! The inspector page in a real browser: headless Chromium loads `/ui` from a running
//! batcher that real Envoy + the real filter have been feeding observations, a prompt is
//! typed into the playground, and the page shows its fingerprint (computed in the browser
//! by the wasm-bindgen build of the core) and the batcher's nearest cohort. The browser
//! build must give the same sketch bytes as the native core (which the filter's wasm build
//! matches, `wasm_parity.rs`) on a fixed corpus. The Replicas panel lists every replica of
//! the stack with its numbers: probed health, requests in flight (one held open), its share
//! of the recent Assigns, time to first byte from the filter's reports, prefix blocks held.
//! A screenshot is saved to `target/test-artifacts/inspector.png`.
//!
//! Needs `scripts/setup` (Envoy, Chromium, wasm-bindgen) and `scripts/build-wasm` (the
//! filter and `target/ui/pkg`).

use cohort_fingerprint::record::{fingerprint_line, LineDefaults};
use cohort_tests::chromium::Chromium;
use cohort_tests::client::{post_json, post_stream};
use cohort_tests::stack::{Replicas, Stack};
use cohort_tests::{eventually, workspace};
use serde_json::{json, Value};
use std::time::Duration;

const CHAT: &str = "/v1/chat/completions";
const PROMPT: &str = "How can I reset my card PIN, customer 42?";
/// How late replica-1 answers: its time to first byte stands out in the Replicas panel.
const SLOW: Duration = Duration::from_millis(300);

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
    // Replicas known by URL, so the batcher probes them (its front listens, unused).
    let stack = Stack::assign()
        .replicas(Replicas::Adapter("openai"))
        .batcher_args(&["--ui-assets", &assets.to_string_lossy()])
        .start();
    let (envoy, batcher) = (&stack.envoy, stack.batcher());

    // Traffic of two intents, observed by the batcher through the filter; replica-1 is slow.
    stack.upstream(1).set_delay(SLOW);
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
    assert!(
        eventually(Duration::from_secs(20), || batcher
            .metric("cohort_observations_total")
            >= 12.0),
        "observations did not arrive"
    );
    // The batcher's own answer for the prompt: the cohort it assigns (x-cohort-cluster).
    post_json(envoy.listen_port, CHAT, &[], &chat(PROMPT));
    let assigned = stack
        .upstreams()
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

    // The Replicas panel, with one request held open: its first event went by (a first
    // byte reported), its last waits.
    let events = ["data: {\"n\":1}\n\n", "data: [DONE]\n\n"];
    let gates: Vec<_> = stack.upstreams().map(|u| u.set_sse(&events)).collect();
    let mut held = post_stream(envoy.listen_port, CHAT, &[], &chat("Is my card blocked?"));
    assert_eq!(held.status, 200);
    assert_eq!(held.next_data().as_deref(), Some("{\"n\":1}"));
    browser.wait_for(
        "[...document.querySelectorAll('#replicas td[data-col=in_flight]')].some((td) => td.textContent === '1')",
        Duration::from_secs(10),
    );
    let shown = browser.eval(
        "JSON.stringify([...document.querySelectorAll('#replicas tbody tr')].map((tr) => \
         Object.fromEntries([...tr.cells].map((td) => [td.dataset.col, td.textContent]))))",
    );
    let rows: Vec<Value> = serde_json::from_str(shown.as_str().unwrap()).unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    let replicas: Vec<&str> = stack.upstreams().map(|u| u.name.as_str()).collect();
    assert_eq!(names, replicas, "one row per replica: {rows:?}");
    // A number at the start of a cell ("12", "40 ms", "57 % (8)").
    let number = |row: &Value, col: &str| -> Option<f64> {
        let text = row[col].as_str().unwrap_or_default();
        text.split_whitespace().next()?.parse().ok()
    };
    let (mut shares, mut in_flight, mut medians) = (0.0, 0.0, Vec::new());
    for row in &rows {
        assert_eq!(row["health"], "up", "{row}");
        assert!(
            row["probe"]
                .as_str()
                .unwrap_or_default()
                .starts_with("answered "),
            "probed: {row}"
        );
        assert_eq!(row["kv_events"], "not published", "{row}");
        let blocks = number(row, "blocks").unwrap_or_else(|| panic!("blocks: {row}"));
        let share = number(row, "share").unwrap_or_else(|| panic!("share: {row}"));
        in_flight += number(row, "in_flight").unwrap_or_else(|| panic!("in flight: {row}"));
        shares += share;
        // A replica that was assigned requests holds their blocks and had their first
        // bytes reported: both quantiles are numbers, p50 ≤ p95.
        if share > 0.0 {
            assert!(blocks > 0.0, "{row}");
            let (p50, p95) = (number(row, "ttft_p50"), number(row, "ttft_p95"));
            assert!(
                matches!((p50, p95), (Some(a), Some(b)) if a <= b),
                "TTFT numbers: {row}"
            );
            medians.push((row["name"].clone(), p50.unwrap_or_default()));
        } else {
            assert_eq!(row["ttft_p50"], "—", "{row}");
        }
    }
    assert_eq!(in_flight, 1.0, "the held request only: {rows:?}");
    assert!((shares - 100.0).abs() <= 2.0, "shares add up: {rows:?}");
    // Where the slow replica was assigned requests, its median is at least its delay and
    // above every other replica's: each TTFT is its own replica's.
    let slow = stack.upstream(1).name.as_str();
    if let Some(&(_, slow_p50)) = medians.iter().find(|(name, _)| name == slow) {
        assert!(slow_p50 >= SLOW.as_millis() as f64, "{rows:?}");
        for (name, p50) in medians.iter().filter(|(name, _)| name != slow) {
            assert!(*p50 < slow_p50, "{name}: {rows:?}");
        }
    }
    let png = browser.screenshot();
    gates.iter().for_each(|gate| gate.release());
    assert_eq!(held.next_data().as_deref(), Some("[DONE]"));

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

    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let dir = workspace().join("target/test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("inspector.png"), png).unwrap();
}
