//! `cohort engine-sim` end to end, the real binary: `serve` writes its ports file once every
//! replica listens, answers on each port, and exits 0 on SIGTERM; with `--kv-events-port` it
//! publishes on the ports it names; `bound` reads JSONL from stdin and prints the pooled-cache
//! report. Loopback and ephemeral ports only (the events test asks the system for two free
//! ports in a row); every wait is bounded.

mod common;

use serde_json::Value;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn exchange(port: u16, request: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn get(port: u16, path: &str) -> String {
    exchange(
        port,
        &format!("GET {path} HTTP/1.0\r\nhost: 127.0.0.1\r\n\r\n"),
    )
}

/// The JSON body of an answer.
fn body(answer: &str) -> Value {
    let (_, body) = answer.split_once("\r\n\r\n").unwrap();
    serde_json::from_str(body).unwrap()
}

/// A fresh temporary folder for one test's ports file.
fn ports_file(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cohort-engine-sim-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("ports.json");
    let _ = std::fs::remove_file(&file);
    file
}

/// Starts `cohort engine-sim serve` with `args` and waits for its ports file.
fn serve(ports_file: &Path, args: &[&str]) -> (Child, Vec<u16>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cohort"))
        .args(["engine-sim", "serve", "--ports-file"])
        .arg(ports_file)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let ports: Vec<u16> = loop {
        if let Ok(text) = std::fs::read_to_string(ports_file) {
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
    (child, ports)
}

/// Sends SIGTERM and asserts a clean exit within 10 s.
fn stop(mut child: Child, ports_file: &Path) {
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
    if let Some(dir) = ports_file.parent() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn serve_writes_its_ports_answers_and_stops_on_sigterm() {
    let file = ports_file("serve");
    let (child, ports) = serve(
        &file,
        &["--replicas", "2", "--time-scale", "0.001", "--slots", "2"],
    );
    assert_eq!(ports.len(), 2);
    for (i, port) in ports.iter().enumerate() {
        assert!(get(*port, "/health").starts_with("HTTP/1.0 200"));
        let stats = get(*port, "/sim/stats");
        assert!(stats.contains(&format!("\"replica\":{i}")), "{stats}");
        assert_eq!(body(&get(*port, "/server_info"))["kv_events"], Value::Null);
    }
    // SIGTERM right away: the handler is installed before the ports file is written.
    stop(child, &file);
}

/// A port whose successor is free too (both released again: another process could take
/// them before the test binds them, which fails the test rather than passing it wrongly).
fn two_free_ports() -> u16 {
    for _ in 0..50 {
        let first = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = first.local_addr().unwrap().port();
        if port < u16::MAX && TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
    panic!("no two free ports in a row");
}

#[test]
fn serve_publishes_kv_events_on_the_ports_it_is_given() {
    let file = ports_file("events");
    let base = two_free_ports();
    let base_arg = base.to_string();
    let args = [
        "--replicas",
        "1",
        "--time-scale",
        "0.001",
        "--kv-events-port",
        &base_arg,
    ];
    let (child, ports) = serve(&file, &args);
    let events = body(&get(ports[0], "/server_info"))["kv_events"].clone();
    assert_eq!(events["endpoint"], format!("tcp://127.0.0.1:{base}"));
    assert_eq!(
        events["replay_endpoint"],
        format!("tcp://127.0.0.1:{}", base + 1)
    );
    assert_eq!(events["buffer_steps"], 1000);
    // The sockets listen where the endpoints say.
    assert!(TcpStream::connect(("127.0.0.1", base)).is_ok());
    assert!(TcpStream::connect(("127.0.0.1", base + 1)).is_ok());
    let chat = r#"{"messages":[{"role":"user","content":"a prompt long enough to fill a few blocks of sixteen tokens, and then some more"}],"max_tokens":1}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.0\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{chat}",
        chat.len()
    );
    assert!(exchange(ports[0], &request).starts_with("HTTP/1.0 200"));
    let reset = "POST /reset_prefix_cache HTTP/1.0\r\nhost: 127.0.0.1\r\ncontent-length: 0\r\n\r\n";
    assert!(exchange(ports[0], reset).starts_with("HTTP/1.0 200"));
    let events = body(&get(ports[0], "/server_info"))["kv_events"].clone();
    assert_eq!(
        events["published"], 2,
        "the prefill's blocks, then the reset"
    );
    stop(child, &file);
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
