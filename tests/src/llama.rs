//! A real llama.cpp `llama-server` replica for one test: Gemma 3 270M from
//! `scripts/install-engine`, on a free port, `--metrics`, killed when dropped.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Llama {
    child: Child,
    pub port: u16,
    log: std::path::PathBuf,
}

impl Llama {
    /// Starts a replica with `slots` parallel slots and no host-RAM prompt cache (a
    /// prefix is reused only from the slot that computed it, as in production with
    /// memory pressure), and waits until `/health` answers 200.
    pub fn start(slots: usize) -> Llama {
        let root = crate::workspace();
        let server = root.join(".cohort/bin/llama-server");
        let model = root.join(".cohort/models/gemma-3-270m-q4_k_m.gguf");
        assert!(
            server.exists() && model.exists(),
            "llama-server or the model is missing: run scripts/install-engine"
        );
        crate::with_port_retries("llama-server", |_| {
            let port = crate::free_port();
            let log = std::env::temp_dir()
                .join(format!("cohort-llama-{}-{port}.log", std::process::id()));
            let child = Command::new(&server)
                .args(["-m", &model.to_string_lossy()])
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .args(["-c", &(2048 * slots).to_string(), "-np", &slots.to_string()])
                .args(["-t", "1", "--cache-ram", "0", "--swa-full", "--metrics"])
                .args(["--chat-template-file"])
                .arg(root.join("data/engines/gemma_chat_template.jinja"))
                .args(["-a", "gemma-3-270m"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).expect("llama-server log"))
                .spawn()
                .expect("start llama-server");
            let mut llama = Llama { child, port, log };
            llama.wait_healthy().map(|()| llama)
        })
    }

    /// Waits for `/health`; `Err(log)` when it exited because its port was taken.
    fn wait_healthy(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(r) = crate::client::request(self.port, "GET", "/health", &[], b"") {
                if r.status == 200 {
                    return Ok(());
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                if crate::port_was_taken(&log) {
                    return Err(log);
                }
                panic!("llama-server exited with {status}:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("llama-server not healthy in 60 s");
    }

    /// The engine's own counter `name` from `/metrics` (e.g. `llamacpp:prompt_tokens_total`).
    pub fn metric(&self, name: &str) -> f64 {
        let page = crate::client::request(self.port, "GET", "/metrics", &[], b"")
            .expect("metrics")
            .text();
        page.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0.0)
    }
}

impl Drop for Llama {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}
