//! A real `cohort serve` process for one test: started on given ports, ready when its
//! `/readyz` answers 200, read through `/metrics`, stopped with SIGTERM, killed with
//! SIGKILL to test what the filter does when the batcher vanishes, or frozen with SIGSTOP
//! (and thawed with SIGCONT) to test a batcher that is there but does not answer.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The `cohort` binary built with this test (`target/<profile>/cohort`), or `COHORT_BIN`.
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("COHORT_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> → target/<profile>/cohort
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("cohort"))
        .expect("target directory");
    assert!(
        path.exists(),
        "{}: not built; run `cargo build -p cohort-cli` (cargo test --workspace does)",
        path.display()
    );
    path
}

/// How to start one batcher.
#[derive(Debug, Clone)]
pub struct BatcherSpec {
    pub grpc_port: u16,
    pub http_port: u16,
    /// Static replicas (`--replica`); empty with discovery (`--discovery-dns` in
    /// `extra_args`).
    pub replicas: Vec<String>,
    pub shard_index: u32,
    pub shard_count: u32,
    /// Batch mode's front port (the replicas then carry URLs: `name=http://…`).
    pub front_port: Option<u16>,
    /// The endpoint picker's port (`--picker-listen`: ext_proc and gRPC health), if any.
    pub picker_port: Option<u16>,
    /// More `cohort serve` arguments (e.g. `--config FILE`).
    pub extra_args: Vec<String>,
}

/// A running batcher; killed when dropped.
pub struct Batcher {
    child: Option<Child>,
    pub spec: BatcherSpec,
    log: PathBuf,
}

impl Batcher {
    /// Starts `cohort serve` as `spec` says and waits until it is ready. When one of its
    /// ports was taken before it bound it, it starts again on new free ports (`spec` then
    /// holds the ports it runs on).
    pub fn start(spec: BatcherSpec) -> Batcher {
        crate::with_port_retries("cohort serve", |attempt| {
            let mut spec = spec.clone();
            if attempt > 0 {
                spec.grpc_port = crate::free_port();
                spec.http_port = crate::free_port();
                spec.front_port = spec.front_port.map(|_| crate::free_port());
                spec.picker_port = spec.picker_port.map(|_| crate::free_port());
            }
            let log = std::env::temp_dir().join(format!(
                "cohort-batcher-{}-{}.log",
                std::process::id(),
                spec.grpc_port
            ));
            let mut batcher = Batcher {
                child: None,
                spec,
                log,
            };
            batcher.spawn().map(|()| batcher)
        })
    }

    fn spawn(&mut self) -> Result<(), String> {
        let spec = &self.spec;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(binary())
            .arg("serve")
            .args(["--grpc-listen", &format!("127.0.0.1:{}", spec.grpc_port)])
            .args(["--http-listen", &format!("127.0.0.1:{}", spec.http_port)])
            .args(["--shard-index", &spec.shard_index.to_string()])
            .args(["--shard-count", &spec.shard_count.to_string()])
            .args(
                (!spec.replicas.is_empty())
                    .then(|| ["--replica".to_owned(), spec.replicas.join(",")])
                    .iter()
                    .flatten(),
            )
            .args(
                spec.front_port
                    .map(|port| ["--front-listen".to_owned(), format!("127.0.0.1:{port}")])
                    .iter()
                    .flatten(),
            )
            .args(
                spec.picker_port
                    .map(|port| ["--picker-listen".to_owned(), format!("127.0.0.1:{port}")])
                    .iter()
                    .flatten(),
            )
            .args(&spec.extra_args)
            .env_remove("COHORT_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start cohort serve");
        self.child = Some(child);
        self.wait_ready()
    }

    /// Waits for `/readyz`; `Err(log)` when it exited because a port was taken.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(response) =
                crate::client::request(self.spec.http_port, "GET", "/readyz", &[], b"")
            {
                if response.status == 200 {
                    return Ok(());
                }
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                let log = self.log();
                self.child = None;
                if crate::port_was_taken(&log) {
                    return Err(log);
                }
                panic!("cohort serve exited with {status}:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("cohort serve not ready in 20 s:\n{}", self.log());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The `/metrics` page.
    pub fn metrics(&self) -> String {
        crate::client::request(self.spec.http_port, "GET", "/metrics", &[], b"")
            .map(|r| r.text())
            .unwrap_or_default()
    }

    /// With `COHORT_METRICS_DUMP=DIR`, the last `/metrics` page of every batcher a test
    /// started is kept in `DIR` (`scripts/metrics-shape` compares the pages of two builds:
    /// the same names, types and labels).
    fn dump_metrics(&self) {
        let Some(dir) = std::env::var_os("COHORT_METRICS_DUMP") else {
            return;
        };
        if self.child.is_none() {
            return;
        }
        let page = self.metrics();
        if page.is_empty() {
            return;
        }
        let dir = PathBuf::from(dir);
        let _ = std::fs::create_dir_all(&dir);
        let name = format!("{}-{}.txt", std::process::id(), self.spec.grpc_port);
        let _ = std::fs::write(dir.join(name), page);
    }

    /// Waits up to `within` for `done`, panicking with `what`, the metrics and the log.
    pub fn wait_until(&self, what: &str, within: Duration, done: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + within;
        while !done() {
            assert!(
                std::time::Instant::now() < deadline,
                "timed out: {what}\n{}\n{}",
                self.metrics(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One sample of `/metrics` by its full name with labels (`name` or `name{l="v"}`).
    pub fn metric(&self, series: &str) -> f64 {
        self.metrics()
            .lines()
            .find_map(|line| {
                let (name, value) = line.rsplit_once(' ')?;
                (name == series).then(|| value.parse().ok()).flatten()
            })
            .unwrap_or(0.0)
    }

    /// The process id while it runs (for `/proc` samples).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGSTOP: the batcher freezes; its sockets stay open and nothing answers.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT after [`Batcher::freeze`].
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        if let Some(pid) = self.pid() {
            let status = Command::new("kill")
                .args([signal, &pid.to_string()])
                .status()
                .expect("run kill");
            assert!(status.success(), "kill {signal} {pid}");
        }
    }

    /// SIGKILL: the batcher vanishes without a goodbye.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again with the same ports and settings (a pod restarted in place).
    pub fn restart(&mut self) {
        self.kill9();
        if let Err(log) = self.spawn() {
            panic!("cohort serve could not bind its ports again:\n{log}");
        }
    }

    /// SIGTERM and wait: the graceful path.
    pub fn terminate(&mut self) -> Option<ExitStatus> {
        self.signal("-TERM");
        let mut child = self.child.take()?;
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        child.wait().ok()
    }
}

impl Drop for Batcher {
    fn drop(&mut self) {
        self.dump_metrics();
        self.kill9();
    }
}
