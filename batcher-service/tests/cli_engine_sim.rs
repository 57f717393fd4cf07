//! `cohort engine-sim` end to end, the real binary: `serve` writes its ports file once every
//! replica listens, answers on each port, and exits 0 on SIGTERM; `bound` reads JSONL from
//! stdin and prints the pooled-cache report. Loopback and ephemeral ports only; every wait is
//! bounded.

mod common;

use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn get(port: u16, path: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nhost: 127.0.0.1\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn serve_writes_its_ports_answers_and_stops_on_sigterm() {
    let dir = std::env::temp_dir().join(format!("cohort-engine-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ports_file = dir.join("ports.json");
    let _ = std::fs::remove_file(&ports_file);
    let mut child = Command::new(env!("CARGO_BIN_EXE_cohort"))
        .args(["engine-sim", "serve", "--replicas", "2", "--ports-file"])
        .arg(&ports_file)
        .args(["--time-scale", "0.001", "--slots", "2"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let ports: Vec<u16> = loop {
        if let Ok(text) = std::fs::read_to_string(&ports_file) {
            let v: Value = serde_json::from_str(&text).expect("the ports file is whole JSON");
            break serde_json::from_value(v["ports"].clone()).unwrap();
        }
        assert!(Instant::now() < deadline, "no ports file in 20 s");
        assert!(
            child.try_wait().unwrap().is_none(),
            "engine-sim exited early"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(ports.len(), 2);
    for (i, port) in ports.iter().enumerate() {
        assert!(get(*port, "/health").starts_with("HTTP/1.0 200"));
        let stats = get(*port, "/sim/stats");
        assert!(stats.contains(&format!("\"replica\":{i}")), "{stats}");
    }
    // SIGTERM right away: the handler is installed before the ports file is written.
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("engine-sim did not stop within 10 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bound_reports_the_pooled_hit_ratio_of_stdin() {
    // 64-byte prompts: 16 tokens, 4 blocks of 4. The repeat hits 3 blocks: 12 of 48 tokens.
    let a = format!("{{\"prompt\":\"{}0000\"}}", "a".repeat(60));
    let b = format!("{{\"prompt\":\"{}1111\"}}", "b".repeat(60));
    let input = format!("{a}\n{b}\n{a}\n");
    let (ok, stdout, _) = common::cohort(
        &[
            "engine-sim",
            "bound",
            "--kv-blocks",
            "100",
            "--block-tokens",
            "4",
        ],
        &input,
    );
    assert!(ok);
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["requests"], 3);
    assert_eq!(v["prompt_tokens"], 48);
    assert_eq!(v["hit_tokens"], 12);
    assert_eq!(v["hit_ratio"], 0.25);
    // A missing input file is an error, not an empty report.
    let bad = Command::new(env!("CARGO_BIN_EXE_cohort"))
        .args([
            "engine-sim",
            "bound",
            "--kv-blocks",
            "10",
            "/nonexistent.jsonl",
        ])
        .output()
        .unwrap();
    assert!(!bad.status.success());
}
