//! The alert rules (`monitoring/cohort-alerts.yaml`) checked by a real Prometheus:
//!
//! - `promtool check rules` accepts them, and `promtool test rules` runs their unit tests
//!   (`monitoring/cohort-alerts.test.yaml`: each alert fires on a series that should trip it
//!   and stays silent on one that should not);
//! - the PrometheusRule (`monitoring/prometheusrule.yaml`) carries the same groups;
//! - every metric a rule reads is documented (docs/METRICS.md);
//! - a real Prometheus scrapes a running Envoy with the filter (assign mode) and a real
//!   `cohort serve`, loads the rules (all healthy), and evaluates every rule and every
//!   dashboard query (`istio/dashboards/cohort.json`) without error, with the filter's and
//!   the batcher's series present.
//!
//! Needs Debian's `prometheus` package (`scripts/setup` installs it).

use cohort_tests::client::post_json;
use cohort_tests::prometheus::{tool, Prometheus, Target};
use cohort_tests::stack::Stack;
use cohort_tests::{eventually, workspace};
use serde_json::Value as Json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn rules_file() -> PathBuf {
    workspace().join("monitoring/cohort-alerts.yaml")
}

fn run(command: &mut Command) -> String {
    let out = command.output().expect("runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{command:?} failed:\n{text}");
    text
}

/// Every rule of the rules file: (name, expression).
fn rules() -> Vec<(String, String)> {
    let doc: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(rules_file()).unwrap()).unwrap();
    let mut out = Vec::new();
    for group in doc["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            out.push((
                rule["alert"].as_str().unwrap().to_owned(),
                rule["expr"].as_str().unwrap().trim().to_owned(),
            ));
        }
    }
    out
}

#[test]
fn promtool_checks_the_rules_and_runs_their_unit_tests() {
    let promtool = tool("promtool");
    let checked = run(Command::new(&promtool)
        .arg("check")
        .arg("rules")
        .arg(rules_file()));
    assert!(checked.contains("SUCCESS: 9 rules found"), "{checked}");
    let tested = run(Command::new(&promtool)
        .arg("test")
        .arg("rules")
        .arg("cohort-alerts.test.yaml")
        .current_dir(workspace().join("monitoring")));
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn the_prometheus_rule_carries_the_same_groups_and_every_metric_is_documented() {
    let plain: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(rules_file()).unwrap()).unwrap();
    let operator: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(workspace().join("monitoring/prometheusrule.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(operator["kind"], "PrometheusRule");
    assert_eq!(operator["spec"]["groups"], plain["groups"]);

    let documented = std::fs::read_to_string(workspace().join("docs/METRICS.md")).unwrap();
    for (alert, expr) in rules() {
        for name in expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("cohort_"))
        {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            assert!(
                documented.contains(&format!("`{family}")),
                "{alert} reads {name}, which docs/METRICS.md does not list"
            );
        }
    }
}

/// Every `expr` in the dashboard, with Grafana's variables filled in.
pub fn dashboard_queries(engine_service: &str) -> Vec<String> {
    fn walk(value: &Json, out: &mut Vec<String>) {
        match value {
            Json::Object(map) => {
                for (key, v) in map {
                    match (key.as_str(), v) {
                        ("expr", Json::String(expr)) => out.push(expr.clone()),
                        _ => walk(v, out),
                    }
                }
            }
            Json::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let path: &Path = &workspace().join("istio/dashboards/cohort.json");
    let dashboard: Json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut exprs = Vec::new();
    walk(&dashboard, &mut exprs);
    exprs
        .into_iter()
        .map(|e| fill_variables(&e, engine_service))
        .collect()
}

/// A dashboard query with Grafana's variables filled in: a 1 m rate interval, a 1 h range,
/// the engines' Service host, every route.
pub fn fill_variables(expr: &str, engine_service: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$__range", "1h")
        .replace("$engine_service", engine_service)
        .replace("$route", ".*")
}

#[test]
fn a_real_prometheus_scrapes_envoy_and_the_batcher_and_evaluates_every_rule_and_panel() {
    let stack = Stack::assign().upstreams(2).start();
    let (envoy, batcher) = (&stack.envoy, stack.batcher());
    let prometheus = Prometheus::start(
        &[
            Target {
                job: "envoy",
                address: format!("127.0.0.1:{}", envoy.admin_port),
                path: "/stats/prometheus",
            },
            Target {
                job: "cohort-batcher",
                address: format!("127.0.0.1:{}", batcher.spec.http_port),
                path: "/metrics",
            },
        ],
        &[&rules_file()],
    );
    // Traffic while Prometheus scrapes: assigned requests, and one bypass.
    let started = Instant::now();
    let mut sent = 0;
    while started.elapsed() < Duration::from_secs(6) {
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"system","content":"You are app {}."}},{{"role":"user","content":"refund order {sent}"}}]}}"#,
            sent % 3
        );
        assert_eq!(
            post_json(
                envoy.listen_port,
                "/v1/chat/completions",
                &[],
                body.as_bytes()
            )
            .status,
            200
        );
        sent += 1;
        // Deliberate window: the requests are paced 50 ms apart, over several scrapes.
        std::thread::sleep(Duration::from_millis(50));
    }
    post_json(envoy.listen_port, "/v1/chat/completions", &[], b"{oops");
    // Both targets up, and the rules loaded and healthy.
    let mut up = Vec::new();
    assert!(
        eventually(Duration::from_secs(30), || {
            up = prometheus.query("up == 1");
            up.len() == 2 && !prometheus.query("cohort_requests_total").is_empty()
        }),
        "targets not scraped: up {up:?}"
    );
    // Every rule evaluated once, and enough scrapes for the rates below.
    let evaluated = |rules: &Json| {
        rules["data"]["groups"].as_array().is_some_and(|groups| {
            groups
                .iter()
                .flat_map(|g| g["rules"].as_array().into_iter().flatten())
                .all(|rule| rule["health"] == "ok")
        })
    };
    let compute_query = "1 - sum by (band) (increase(cohort_cached_tokens_est_total[1h])) / sum by (band) (increase(cohort_prompt_tokens_est_total[1h]))";
    assert!(
        eventually(Duration::from_secs(30), || {
            evaluated(&prometheus.api("/api/v1/rules"))
                && !prometheus.query(compute_query).is_empty()
        }),
        "rules not evaluated: {}",
        prometheus.api("/api/v1/rules")
    );
    let loaded = prometheus.api("/api/v1/rules");
    let loaded_rules: Vec<&Json> = loaded["data"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .collect();
    assert_eq!(loaded_rules.len(), rules().len(), "{loaded}");
    for rule in &loaded_rules {
        assert_eq!(rule["health"], "ok", "{rule}");
    }
    // Every rule and panel query evaluates; the series they read from both targets exist.
    for (alert, expr) in rules() {
        prometheus.query(&expr);
        println!("rule {alert}: evaluates");
    }
    let queries = dashboard_queries("engines");
    assert!(queries.len() >= 20);
    for query in &queries {
        prometheus.query(query);
    }
    println!("{} dashboard queries evaluate", queries.len());
    // The operator views have data: compute per token by length, and the pivot.
    let compute = prometheus.query(compute_query);
    assert!(!compute.is_empty(), "no compute-per-token band");
    for present in [
        "cohort_requests_total",
        "cohort_fingerprinted_total",
        "cohort_bypass_invalid_json_total",
        "cohort_assign_ok_total",
        "cohort_breaker_state",
        "cohort_assign_total",
        "cohort_replica_assigned_total",
        "cohort_assign_decision_seconds_bucket",
        "cohort_prompt_tokens_est_total",
        "cohort_pivot_requests_total",
    ] {
        let got = prometheus.query(present);
        assert!(!got.is_empty(), "{present} not scraped");
    }
    // The CPU store: no GPU gauge at all (absent, not zero).
    assert!(prometheus.query("cohort_gpu_utilization").is_empty());
    let fingerprinted = prometheus.query("sum(cohort_fingerprinted_total)");
    let value: f64 = fingerprinted[0]["value"][1]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(value >= 1.0, "{fingerprinted:?}");
    println!("{sent} requests sent; Prometheus saw {value} fingerprinted");
}
