//! A real Envoy process for one test: the repository's configs adapted by
//! [`crate::config`], started on
//! free ports.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The Envoy binary: `COHORT_ENVOY`, else `.cohort/bin/envoy` (installed by scripts/setup).
pub fn binary() -> PathBuf {
    std::env::var_os("COHORT_ENVOY")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::workspace().join(".cohort/bin/envoy"))
}

/// A running Envoy; stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Envoy {
    child: Child,
    pub admin_port: u16,
    pub listen_port: u16,
    dir: PathBuf,
}

impl Envoy {
    /// `istio/envoy/assign.yaml` pointed at the batcher shards on `batcher_grpc`
    /// (`cohort-batcher-<i>`) and the engine replicas on `replicas`, with the given plugin
    /// configuration (JSON); its admin and listener ports are set when it starts.
    pub fn assign_config(
        batcher_grpc: &[u16],
        replicas: &[u16],
        plugin: &str,
    ) -> serde_yaml::Value {
        use crate::config;
        let mut yaml = config::load("assign");
        config::set_assign_endpoints(&mut yaml, batcher_grpc, replicas);
        config::set_filter(&mut yaml, plugin);
        yaml
    }

    /// `istio/envoy/endpoint-picker.yaml` pointed at the picker (`cohort serve
    /// --picker-listen`) on `picker_port` and at the engine replicas on `replicas` (the
    /// pool); FailClose with the body streamed full-duplex, as the file ships
    /// ([`crate::config::set_picker_fail_open`] and [`crate::config::set_picker_body`] make
    /// the variants).
    pub fn endpoint_picker_config(picker_port: u16, replicas: &[u16]) -> serde_yaml::Value {
        use crate::config;
        let mut yaml = config::load("endpoint-picker");
        config::set_picker_endpoints(&mut yaml, picker_port, replicas);
        yaml
    }

    /// `istio/envoy/batch.yaml` pointed at one batcher shard (gRPC and front) and the engine
    /// replicas on `replicas`, with the given plugin configuration (JSON).
    pub fn batch_config(
        batcher_grpc: u16,
        front: u16,
        replicas: &[u16],
        plugin: &str,
    ) -> serde_yaml::Value {
        use crate::config;
        let mut yaml = config::load("batch");
        config::set_batch_endpoints(&mut yaml, batcher_grpc, front, replicas);
        config::set_filter(&mut yaml, plugin);
        yaml
    }

    /// Waits until batch mode's front and the `replicas` replicas behind it (its
    /// fallback) passed their first health check.
    pub fn wait_front_healthy(&self, replicas: usize) {
        assert!(
            self.wait_for_stat(
                "cluster.cohort-front-0.membership_healthy",
                replicas as u64 + 1,
                Duration::from_secs(10)
            ),
            "the batch front and its replicas not healthy in 10 s"
        );
    }

    /// Starts Envoy with `config` (YAML) on free admin and listener ports (set here, see
    /// [`crate::config::set_ports`]) and waits until its admin `/ready` answers 200; it logs
    /// warnings and errors only. A port taken before Envoy bound it is retried on new ports.
    pub fn start(config: &serde_yaml::Value) -> Envoy {
        Envoy::start_logging(config, "warning")
    }

    /// As [`Envoy::start`], logging at `level` (`info` is Envoy's default level: tests
    /// that read the log for leaked prompt text run it there).
    pub fn start_logging(config: &serde_yaml::Value, level: &str) -> Envoy {
        crate::with_port_retries("envoy", |_| {
            let (admin_port, listen_port) = (crate::free_port(), crate::free_port());
            let mut config = config.clone();
            crate::config::set_ports(&mut config, admin_port, listen_port);
            Envoy::try_start(&config, admin_port, listen_port, level)
        })
    }

    /// One try: `Err` (with the log) when Envoy exited because a port was taken.
    fn try_start(
        config: &serde_yaml::Value,
        admin_port: u16,
        listen_port: u16,
        level: &str,
    ) -> Result<Envoy, String> {
        let dir =
            std::env::temp_dir().join(format!("cohort-envoy-{}-{listen_port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config_path = dir.join("envoy.yaml");
        std::fs::write(&config_path, serde_yaml::to_string(config).unwrap()).unwrap();
        let log = std::fs::File::create(dir.join("envoy.log")).unwrap();
        let binary = binary();
        assert!(
            binary.exists(),
            "{}: not found; run scripts/setup",
            binary.display()
        );
        let child = Command::new(&binary)
            .arg("-c")
            .arg(&config_path)
            .args(["--use-dynamic-base-id", "--concurrency", "2", "-l", level])
            .current_dir(crate::workspace())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        let mut envoy = Envoy {
            child,
            admin_port,
            listen_port,
            dir,
        };
        match envoy.wait_ready() {
            Ok(()) => Ok(envoy),
            Err(log) if crate::port_was_taken(&log) => Err(log),
            Err(log) => panic!("envoy exited before ready:\n{log}"),
        }
    }

    /// Waits for admin `/ready`; `Err(log)` when Envoy exited first.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Err(format!("exit {status}\n{}", self.log()));
            }
            if let Ok((200, _)) = admin_get(self.admin_port, "/ready") {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("envoy not ready after 30 s:\n{}", self.log());
    }

    /// The process id (for `/proc` samples).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Envoy's own log (at the level it was started with).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("envoy.log")).unwrap_or_default()
    }

    /// An admin endpoint's body.
    pub fn admin(&self, path: &str) -> String {
        admin_get(self.admin_port, path).expect("admin answers").1
    }

    /// The value of one counter or gauge from `/stats`, 0 when absent.
    pub fn stat(&self, name: &str) -> u64 {
        self.admin(&format!("/stats?filter=^{}$", name.replace('.', "\\.")))
            .lines()
            .find_map(|line| {
                let (n, v) = line.split_once(": ")?;
                (n == name).then(|| v.trim().parse().ok()).flatten()
            })
            .unwrap_or(0)
    }
}

impl Envoy {
    /// The sum of every series of `metric` in `/stats/prometheus` (the form Prometheus
    /// scrapes: tags extracted as labels) whose labels include all of `labels`; a
    /// histogram's count is `<metric>_count`.
    pub fn series_sum(&self, metric: &str, labels: &[(&str, &str)]) -> f64 {
        self.series(metric, labels).iter().map(|(_, v)| v).sum()
    }

    /// Every series of `metric` in `/stats/prometheus` with all of `labels`: its label
    /// text (`{a="1",b="2"}`) and value.
    pub fn series(&self, metric: &str, labels: &[(&str, &str)]) -> Vec<(String, f64)> {
        let wanted: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        self.admin("/stats/prometheus")
            .lines()
            .filter_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                let rest = series.strip_prefix(metric)?;
                if !(rest.is_empty() || rest.starts_with('{')) {
                    return None;
                }
                let inner = rest.trim_start_matches('{').trim_end_matches('}');
                let present: Vec<&str> = inner.split(',').collect();
                wanted
                    .iter()
                    .all(|w| present.contains(&w.as_str()))
                    .then(|| Some((rest.to_owned(), value.parse().ok()?)))
                    .flatten()
            })
            .collect()
    }

    /// Waits until stat `name` reaches `at_least` (e.g. a cluster's `membership_healthy`
    /// after its first health checks); returns whether it did within `timeout`.
    pub fn wait_for_stat(&self, name: &str, at_least: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.stat(name) < at_least {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            let _ = std::fs::remove_dir_all(&self.dir);
            return;
        }
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                let _ = std::fs::remove_dir_all(&self.dir);
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// GET on the admin port: (status, body).
fn admin_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let response = crate::client::request(port, "GET", path, &[], b"")?;
    Ok((response.status, response.text()))
}
