//! A real Prometheus server (Debian's `/usr/bin/prometheus`, which `scripts/setup`
//! installs) scraping the test's targets every second, and its query API. Shared by the
//! alert-rule test and `cohort report`'s end-to-end test.

use serde_json::Value as Json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// `/usr/bin/<name>` from Debian's `prometheus` package (`prometheus`, `promtool`); panics
/// with the fix when it is missing.
pub fn tool(name: &str) -> PathBuf {
    let path = PathBuf::from("/usr/bin").join(name);
    assert!(
        path.exists(),
        "{}: missing; scripts/setup installs Debian's prometheus package",
        path.display()
    );
    path
}

/// A scrape target: job name, `host:port`, metrics path.
pub struct Target<'a> {
    pub job: &'a str,
    pub address: String,
    pub path: &'a str,
}

/// A Prometheus server on a free port; killed (and its data removed) when dropped.
pub struct Prometheus {
    child: Child,
    pub port: u16,
    dir: PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Prometheus {
    /// Scrapes `targets` every second and evaluates `rule_files` every second. Returns once
    /// its API answers.
    pub fn start(targets: &[Target], rule_files: &[&Path]) -> Prometheus {
        let rules: Vec<String> = rule_files
            .iter()
            .map(|f| format!("{:?}", f.display().to_string()))
            .collect();
        let mut config = format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nrule_files: [{}]\nscrape_configs:\n",
            rules.join(", ")
        );
        for Target { job, address, path } in targets {
            config.push_str(&format!(
                "- job_name: {job}\n  metrics_path: {path}\n  static_configs: [{{targets: [\"{address}\"]}}]\n"
            ));
        }
        crate::with_port_retries("prometheus", |_| {
            let port = crate::free_port();
            let dir = std::env::temp_dir()
                .join(format!("cohort-prometheus-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let file = dir.join("prometheus.yml");
            std::fs::write(&file, &config).unwrap();
            let log = dir.join("prometheus.log");
            let child = Command::new(tool("prometheus"))
                .arg(format!("--config.file={}", file.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .expect("prometheus starts");
            let mut prometheus = Prometheus { child, port, dir };
            let ready = crate::eventually(std::time::Duration::from_secs(20), || {
                matches!(prometheus.child.try_wait(), Ok(Some(_)))
                    || crate::client::request(port, "GET", "/-/ready", &[], b"")
                        .is_ok_and(|r| r.status == 200)
            });
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            match prometheus.child.try_wait() {
                Ok(Some(status)) if crate::port_was_taken(&text) => {
                    Err(format!("prometheus exited with {status}: {text}"))
                }
                Ok(Some(status)) => panic!("prometheus exited with {status}: {text}"),
                _ if !ready => {
                    let _ = prometheus.child.kill();
                    panic!("prometheus not ready in 20 s: {text}")
                }
                _ => Ok(prometheus),
            }
        })
    }

    /// `GET path_and_query` on its HTTP API, as JSON; panics when it does not answer JSON.
    pub fn api(&self, path_and_query: &str) -> Json {
        let response = crate::client::request(self.port, "GET", path_and_query, &[], b"")
            .expect("prometheus answers");
        serde_json::from_slice(&response.body)
            .unwrap_or_else(|e| panic!("{path_and_query}: {e}: {}", response.text()))
    }

    /// Evaluates `query` now; panics on an error, returns the result vector.
    pub fn query(&self, query: &str) -> Vec<Json> {
        let answer = self.api(&format!("/api/v1/query?query={}", percent_encode(query)));
        assert_eq!(answer["status"], "success", "{query}: {answer}");
        answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Waits until every target was scraped (`up` is 1 for each; Prometheus applies new
    /// targets a few seconds after it starts): a counter series born before its target's
    /// first scrape would have its first value left out of `increase()`.
    pub fn wait_scraped(&self, targets: usize) {
        let mut up = Vec::new();
        assert!(
            crate::eventually(std::time::Duration::from_secs(30), || {
                up = self.query("up == 1");
                up.len() == targets
            }),
            "targets not scraped in 30 s: up {up:?}"
        );
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// Percent-encodes a query-string value.
pub fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A sample's value (`value: [time, "text"]`) as a number.
pub fn sample_value(sample: &Json) -> f64 {
    sample["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("a sample without a value: {sample}"))
}
