//! Headless Chromium (Debian's `chromium`) driven over the DevTools protocol, for tests of
//! web pages: open a URL, evaluate JavaScript, type text, press keys, take a screenshot.
//! The browser runs with a throwaway profile and is killed when dropped.

use serde_json::{json, Value};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

pub struct Chromium {
    child: Child,
    profile: PathBuf,
    socket: WebSocket<MaybeTlsStream<TcpStream>>,
    next_id: u64,
}

impl Chromium {
    /// Starts the browser on `url` and attaches to its page.
    pub fn open(url: &str) -> Chromium {
        let profile = std::env::temp_dir().join(format!(
            "cohort-chromium-{}-{}",
            std::process::id(),
            crate::free_port()
        ));
        std::fs::create_dir_all(&profile).unwrap();
        let child = Command::new("chromium")
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--remote-debugging-port=0",
                "--window-size=1280,1400",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromium (Debian package `chromium`; scripts/setup installs it)");
        // Chromium writes its DevTools port into the profile once it listens.
        let port_file = profile.join("DevToolsActivePort");
        let deadline = Instant::now() + Duration::from_secs(30);
        let port: u16 = loop {
            if let Some(port) = std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|t| t.lines().next()?.trim().parse().ok())
            {
                break port;
            }
            assert!(Instant::now() < deadline, "chromium did not start in 30 s");
            std::thread::sleep(Duration::from_millis(100));
        };
        let page_url = loop {
            // DevTools answers only requests whose Host is an IP or localhost.
            let raw = b"GET /json/list HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n";
            let targets = crate::client::send_raw(port, raw)
                .ok()
                .and_then(|r| serde_json::from_slice::<Value>(&r.body).ok());
            let page = targets.and_then(|t| {
                t.as_array()?
                    .iter()
                    .find(|t| t["type"] == "page")
                    .and_then(|t| t["id"].as_str())
                    .map(|id| format!("ws://127.0.0.1:{port}/devtools/page/{id}"))
            });
            if let Some(url) = page {
                break url;
            }
            assert!(Instant::now() < deadline, "no page target in chromium");
            std::thread::sleep(Duration::from_millis(100));
        };
        let (socket, _) = tungstenite::connect(page_url).expect("DevTools WebSocket");
        Chromium {
            child,
            profile,
            socket,
            next_id: 1,
        }
    }

    /// Sends one DevTools command and returns its result.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let message = json!({"id": id, "method": method, "params": params}).to_string();
        self.socket.send(Message::text(message)).unwrap();
        loop {
            let Message::Text(text) = self.socket.read().expect("DevTools reply") else {
                continue;
            };
            let reply: Value = serde_json::from_str(&text).unwrap();
            if reply["id"] == id {
                assert!(reply.get("error").is_none(), "{method}: {reply}");
                return reply["result"].clone();
            }
        }
    }

    /// Evaluates `expression` in the page (awaiting promises) and returns its value.
    pub fn eval(&mut self, expression: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        );
        assert!(
            result.get("exceptionDetails").is_none(),
            "{expression}: {result}"
        );
        result["result"]["value"].clone()
    }

    /// Waits until `expression` is truthy.
    pub fn wait_for(&mut self, expression: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.eval(&format!("Boolean({expression})")) == json!(true) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("timed out waiting for {expression}");
    }

    /// Types `text` into the focused element, as keyboard input.
    pub fn type_text(&mut self, text: &str) {
        self.call("Input.insertText", json!({"text": text}));
    }

    /// Presses and releases Enter.
    pub fn press_enter(&mut self) {
        for kind in ["keyDown", "keyUp"] {
            self.call(
                "Input.dispatchKeyEvent",
                json!({"type": kind, "key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13, "text": if kind == "keyDown" { "\r" } else { "" }}),
            );
        }
    }

    /// A PNG screenshot of the page.
    pub fn screenshot(&mut self) -> Vec<u8> {
        use base64::Engine as _;
        let shot = self.call(
            "Page.captureScreenshot",
            json!({"format": "png", "captureBeyondViewport": true}),
        );
        base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .unwrap()
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}
