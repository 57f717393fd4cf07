//! Cohort against its own hold-out, end to end: real Envoy with the real filter
//! (`istio/envoy/affinity.yaml`, rollout share 0.5 keyed by `x-user-id`) in front of two
//! real engine-sim replicas (which report `usage.prompt_tokens_details.cached_tokens`), a
//! real Prometheus scraping Envoy every second, and the real `cohort report`.
//!
//! Cohort's group is made slower on purpose: Envoy's fault filter, after the cohort filter,
//! delays every request that carries `x-cohort-key` (only Cohort-routed requests do) by
//! 150 ms. Then:
//!
//! - `cohort report --route chat` finds TTFT p50 higher for Cohort, with a 95% interval
//!   that excludes 0, and says "worse";
//! - on a second listener (route `tiny`, rollout share 0.99) the hold-out is a handful of
//!   users, and the report says "too small to conclude" instead of a verdict;
//! - every query of the dashboard's "Cohort vs hold-out" row returns series (of both groups
//!   where it splits by group), and its p50 query shows Cohort slower.

use cohort_tests::client::{verdict, Connection};
use cohort_tests::config::set_endpoints;
use cohort_tests::engine_sim::EngineSim;
use cohort_tests::prometheus::{sample_value, Prometheus, Target};
use cohort_tests::stack::Stack;
use cohort_tests::{eventually, free_port, one_at_a_time, with_port_retries, workspace};
use serde_json::{json, Value as Json};
use serde_yaml::Value as Yaml;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const CHAT: &str = "/v1/chat/completions";
/// The fault filter's delay on Cohort-routed requests.
const DELAY_MS: u64 = 150;

/// A chat request of `user` of app `app`: a long shared system prompt per app (what the
/// engines' prefix caches hold) and a short unique question.
fn chat(app: usize, user: &str, n: usize) -> Vec<u8> {
    let system = format!(
        "You are the support assistant of app {app}. {}",
        "Answer briefly, cite the order number, never invent a refund policy. ".repeat(8)
    );
    serde_json::to_vec(&json!({
        "model": "sim-model",
        "max_tokens": 2,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": format!("{user}: where is order {n}?")},
        ],
    }))
    .unwrap()
}

/// The cohort filter's entry in a listener's HTTP filter chain.
fn http_filters(listener: &mut Yaml) -> &mut Vec<Yaml> {
    listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
        .as_sequence_mut()
        .expect("an HTTP filter chain")
}

/// The plugin configuration of a listener's cohort filter.
fn set_plugin(listener: &mut Yaml, plugin: &Json) {
    let cohort = http_filters(listener)
        .iter_mut()
        .find(|f| f["name"].as_str() == Some("cohort"))
        .expect("a cohort filter");
    cohort["typed_config"]["config"]["configuration"]["value"] = Yaml::from(plugin.to_string());
}

/// Names the listener's (only) route and its route configuration `name`.
fn name_route(listener: &mut Yaml, name: &str) {
    let route_config =
        &mut listener["filter_chains"][0]["filters"][0]["typed_config"]["route_config"];
    route_config["name"] = Yaml::from(name);
    route_config["virtual_hosts"][0]["routes"][0]["name"] = Yaml::from(name);
}

fn plugin(share: f64) -> Json {
    json!({
        "mode": "affinity",
        "rollout": {"share": share, "key_header": "x-user-id"},
        // Every response in the TTFB histograms (the default samples one in 8): the test's
        // groups are a few hundred responses.
        "histogram_sample_every": 1,
        // The breaker would (rightly) open on the injected slowdown and hold every request
        // out; the test measures the slowdown instead.
        "breaker": {"enabled": false},
    })
}

/// Sends `requests` (user index, request number) to `port` from `clients` threads; returns
/// the responses per group (`routed`, `holdout`) as the `x-cohort` header says.
fn send(port: u16, clients: usize, users: &[String], requests: usize) -> BTreeMap<String, u64> {
    let counts = Mutex::new(BTreeMap::<String, u64>::new());
    std::thread::scope(|scope| {
        for client in 0..clients {
            let counts = &counts;
            scope.spawn(move || {
                let mut connection = Connection::new(port);
                let mut mine = BTreeMap::<String, u64>::new();
                for n in (client..requests).step_by(clients) {
                    let user = &users[n % users.len()];
                    let body = chat(n % users.len() % 4, user, n);
                    let response = connection
                        .post_json(CHAT, &[("x-user-id", user)], &body)
                        .expect("request completes");
                    assert_eq!(response.status, 200, "{}", response.text());
                    *mine
                        .entry(verdict(response.header("x-cohort")))
                        .or_default() += 1;
                }
                let mut counts = counts.lock().unwrap();
                for (group, n) in mine {
                    *counts.entry(group).or_default() += n;
                }
            });
        }
    });
    counts.into_inner().unwrap()
}

/// Runs `cohort report` with `args` after the subcommand: (exit success, stdout, stderr).
fn run_report(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(cohort_tests::batcher::binary())
        .arg("report")
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("cohort runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `cohort report` over the last 5 minutes of route `route`, with `extra` arguments;
/// returns its standard output; panics unless it exits 0.
fn report(prometheus: &Prometheus, route: &str, format: &str, extra: &[&str]) -> String {
    let url = prometheus.url();
    let mut args = vec!["--prometheus", &url, "--since", "5m"];
    args.extend(["--route", route, "--format", format]);
    args.extend(extra);
    let (ok, stdout, stderr) = run_report(&args);
    assert!(ok, "cohort report {args:?} failed: {stdout}{stderr}");
    stdout
}

/// The measure `name` of a JSON report.
fn measure<'a>(report: &'a Json, name: &str) -> &'a Json {
    report["measures"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["measure"] == name)
        .unwrap_or_else(|| panic!("no {name} in {report}"))
}

/// The (title, query) of every panel of the dashboard row `row`, with Grafana's variables
/// filled as the alert test fills them and `$route` set to `route`.
fn row_queries(row: &str, route: &str) -> Vec<(String, String)> {
    let path = workspace().join("istio/dashboards/cohort.json");
    let dashboard: Json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    let start = panels
        .iter()
        .position(|p| p["type"] == "row" && p["title"] == row)
        .unwrap_or_else(|| panic!("no row {row:?}"));
    panels[start + 1..]
        .iter()
        .take_while(|p| p["type"] != "row")
        .flat_map(|p| {
            p["targets"].as_array().unwrap().iter().map(move |t| {
                let expr = t["expr"].as_str().unwrap().replace("$route", route);
                (
                    p["title"].as_str().unwrap().to_owned(),
                    crate::alerts::fill_variables(&expr, "engines"),
                )
            })
        })
        .collect()
}

#[test]
fn cohort_report_finds_an_injected_slowdown_and_says_when_the_hold_out_is_too_small() {
    let _machine = one_at_a_time();
    let started = Instant::now();
    let sims: Vec<EngineSim> = with_port_retries("engine-sim", |_| {
        (0..2)
            .map(|_| EngineSim::start_at(Ipv4Addr::LOCALHOST, free_port(), 0.02))
            .collect()
    });
    let sim_ports: Vec<u16> = sims.iter().map(|s| s.port).collect();
    let tiny_port = free_port();
    let stack = Stack::plain("affinity")
        .upstreams(0)
        .filter(plugin(0.5))
        .envoy_config(move |yaml, _| {
            set_endpoints(yaml, "engines", &sim_ports);
            // Histograms reach /stats/prometheus at each stats flush: every second.
            yaml["stats_flush_interval"] = Yaml::from("1s");
            let listeners = yaml["static_resources"]["listeners"]
                .as_sequence_mut()
                .unwrap();
            // A second listener, route `tiny`, holding out 1% of users; no fault.
            let mut tiny = listeners[0].clone();
            tiny["name"] = Yaml::from("tiny");
            tiny["address"]["socket_address"]["port_value"] = Yaml::from(tiny_port);
            name_route(&mut tiny, "tiny");
            set_plugin(&mut tiny, &plugin(0.99));
            // The main listener, route `chat`: Cohort-routed requests (they carry
            // x-cohort-key) wait DELAY_MS in the fault filter after the cohort filter.
            let main = &mut listeners[0];
            name_route(main, "chat");
            let fault: Yaml = serde_yaml::from_str(&format!(
                r#"
name: envoy.filters.http.fault
typed_config:
  "@type": type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault
  delay:
    fixed_delay: {}s
    percentage: {{numerator: 100, denominator: HUNDRED}}
  headers:
  - name: x-cohort-key
    present_match: true
"#,
                DELAY_MS as f64 / 1000.0
            ))
            .unwrap();
            let chain = http_filters(main);
            let cohort = chain
                .iter()
                .position(|f| f["name"].as_str() == Some("cohort"))
                .unwrap();
            chain.insert(cohort + 1, fault);
            listeners.push(tiny);
        })
        .start();
    let prometheus = Prometheus::start(
        &[Target {
            job: "envoy",
            address: format!("127.0.0.1:{}", stack.envoy.admin_port),
            path: "/stats/prometheus",
        }],
        &[],
    );
    prometheus.wait_scraped(1);
    println!("started in {:.1} s", started.elapsed().as_secs_f64());

    // Main phase: 400 users, half of them held out; 16 clients (the routed requests wait).
    let users: Vec<String> = (0..400).map(|u| format!("user-{u}")).collect();
    let main_counts = send(stack.port(), 16, &users, 1_200);
    println!(
        "route chat: {main_counts:?} after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        main_counts.keys().collect::<Vec<_>>(),
        ["holdout", "routed"]
    );

    // Tiny hold-out: distinct users, one request each, until a few were held out; then
    // each held-out user sends 4 more.
    let mut tiny_counts = BTreeMap::<String, u64>::new();
    let mut held_out = Vec::new();
    let mut connection = Connection::new(tiny_port);
    for n in 0..3_000 {
        let user = format!("tiny-{n}");
        let response = connection
            .post_json(CHAT, &[("x-user-id", &user)], &chat(n % 4, &user, n))
            .expect("request completes");
        assert_eq!(response.status, 200, "{}", response.text());
        let group = verdict(response.header("x-cohort"));
        if group == "holdout" {
            held_out.push(user);
        }
        *tiny_counts.entry(group).or_default() += 1;
        if held_out.len() >= 4 && n >= 300 {
            break;
        }
    }
    assert!(
        !held_out.is_empty(),
        "nobody held out on tiny: {tiny_counts:?}"
    );
    for (group, n) in send(tiny_port, 2, &held_out, 4 * held_out.len()) {
        *tiny_counts.entry(group).or_default() += n;
    }
    println!(
        "route tiny: {tiny_counts:?} after {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // Prometheus has every response (counters are exact), and a flush later the histograms.
    let scraped = |route: &str, metric: &str| -> BTreeMap<String, u64> {
        prometheus
            .query(&format!(
                "sum by (cohort_group) ({metric}{{cohort_route=\"{route}\"}})"
            ))
            .iter()
            .map(|s| {
                (
                    s["metric"]["cohort_group"]
                        .as_str()
                        .unwrap_or("")
                        .to_owned(),
                    sample_value(s) as u64,
                )
            })
            .collect()
    };
    assert!(
        eventually(Duration::from_secs(20), || {
            scraped("chat", "cohort_responses_total") == main_counts
                && scraped("tiny", "cohort_responses_total") == tiny_counts
                && scraped("chat", "cohort_response_ttfb_ms_count") == main_counts
        }),
        "Prometheus has {:?} and {:?} (histograms {:?}); sent {main_counts:?} and {tiny_counts:?}",
        scraped("chat", "cohort_responses_total"),
        scraped("tiny", "cohort_responses_total"),
        scraped("chat", "cohort_response_ttfb_ms_count"),
    );
    // One more scrape for the last histogram flush of the other route.
    std::thread::sleep(Duration::from_secs(2));

    // The report on route chat: Cohort slower, confidently; the verdict says worse.
    let table = report(&prometheus, "chat", "table", &[]);
    println!("{table}");
    let p50_line = table
        .lines()
        .find(|l| l.starts_with("TTFT p50"))
        .unwrap_or_else(|| panic!("no TTFT p50 line in\n{table}"));
    assert!(p50_line.ends_with("worse"), "{p50_line}");
    assert!(table.contains("Welch") && table.contains("share the same replicas"));
    // The same through an extra matcher (the scrape job), as JSON.
    let json: Json = serde_json::from_str(&report(
        &prometheus,
        "chat",
        "json",
        &["--selector", r#"job="envoy""#],
    ))
    .unwrap();
    assert_eq!(json["outcome"], "compared", "{json}");
    let p50 = measure(&json, "ttft_p50_ms");
    let (difference, low, high) = (
        p50["difference"].as_f64().unwrap(),
        p50["ci"]["low"].as_f64().unwrap(),
        p50["ci"]["high"].as_f64().unwrap(),
    );
    assert!(
        difference > DELAY_MS as f64 / 2.0 && low > 0.0 && high >= difference,
        "TTFT p50 difference {difference} [{low}, {high}]"
    );
    assert_eq!(p50["verdict"], "worse");
    // Both groups' responses are counted as increase() counts them: a series born inside
    // the window loses what came before its first scrape (up to a second of its traffic,
    // of ~10 s here; increase() extrapolates half a scrape back).
    for (group, key) in [("routed", "cohort"), ("holdout", "holdout")] {
        let counted = json["groups"][key]["responses"].as_f64().unwrap();
        let sent = main_counts[group] as f64;
        assert!(
            counted >= 0.75 * sent && counted <= 1.05 * sent,
            "{group}: {counted} of {sent}"
        );
    }
    // The engines' usage reached the report: most prompt tokens were cached (the shared
    // system prompts), in both groups.
    let cached = measure(&json, "cached_token_share");
    for group in ["cohort", "holdout"] {
        let share = cached[group]["value"].as_f64().unwrap();
        assert!(share > 0.5 && share < 1.0, "{group}: cached share {share}");
    }

    // Route tiny: too small to conclude.
    let tiny_table = report(&prometheus, "tiny", "table", &[]);
    println!("{tiny_table}");
    assert!(
        tiny_table.contains("Too small to conclude: the hold-out has"),
        "{tiny_table}"
    );
    for line in tiny_table.lines().filter(|l| l.starts_with("TTFT")) {
        assert!(line.ends_with("too small to conclude"), "{line}");
    }
    let tiny_json: Json = serde_json::from_str(&report(&prometheus, "tiny", "json", &[])).unwrap();
    assert_eq!(tiny_json["outcome"], "too_small_holdout", "{tiny_json}");

    // No series for a route: it says so. Prometheus unreachable, a server that is not
    // Prometheus, a matcher Prometheus rejects: an error that says which, exit status 1.
    let none = report(&prometheus, "no-such-route", "table", &[]);
    assert!(none.contains("No data:"), "{none}");
    let closed = format!("http://127.0.0.1:{}", free_port());
    let admin = format!("http://127.0.0.1:{}", stack.envoy.admin_port);
    for (args, expected) in [
        (
            vec!["--prometheus", closed.as_str()],
            "cannot reach Prometheus",
        ),
        (
            vec!["--prometheus", admin.as_str()],
            "not a Prometheus API answer",
        ),
        (
            vec!["--prometheus", &prometheus.url(), "--selector", "job=="],
            "bad_data",
        ),
    ] {
        let (ok, stdout, stderr) = run_report(&args);
        assert!(
            !ok && stderr.contains(expected),
            "{args:?}: {stdout}{stderr}"
        );
    }

    // The dashboard row: every query answers, both groups where it splits by group; the
    // p50 line shows Cohort slower.
    let queries = row_queries("Cohort vs hold-out", "chat");
    assert!(queries.len() >= 8, "{queries:?}");
    let mut heatmap_groups = Vec::new();
    for (title, query) in &queries {
        let result = prometheus.query(query);
        assert!(!result.is_empty(), "{title}: {query} has no series");
        let groups: Vec<&str> = result
            .iter()
            .filter_map(|s| s["metric"]["cohort_group"].as_str())
            .collect();
        if query.contains("by (cohort_group") {
            for group in ["routed", "holdout"] {
                assert!(groups.contains(&group), "{title}: no {group} in {result:?}");
            }
        }
        if title.starts_with("TTFT heatmap") {
            heatmap_groups.extend(
                ["routed", "holdout"]
                    .into_iter()
                    .filter(|g| query.contains(&format!("cohort_group=\"{g}\""))),
            );
        }
        println!("{title}: {} series", result.len());
    }
    heatmap_groups.sort_unstable();
    assert_eq!(heatmap_groups, ["holdout", "routed"]);
    let (_, p50_query) = queries
        .iter()
        .find(|(_, q)| q.starts_with("histogram_quantile(0.5,"))
        .expect("a p50 query");
    let p50_by_group: BTreeMap<String, f64> = prometheus
        .query(p50_query)
        .iter()
        .map(|s| {
            (
                s["metric"]["cohort_group"].as_str().unwrap().to_owned(),
                sample_value(s),
            )
        })
        .collect();
    assert!(
        p50_by_group["routed"] - p50_by_group["holdout"] > DELAY_MS as f64 / 2.0,
        "p50 by group: {p50_by_group:?}"
    );
    println!(
        "p50 by group {p50_by_group:?}; {:.1} s in all",
        started.elapsed().as_secs_f64()
    );
}
