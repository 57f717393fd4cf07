//! `cohort report`'s Prometheus side: the PromQL it asks (instant queries of
//! `increase(…[since])` summed by group and unit), a plain-HTTP client for
//! `/api/v1/query`, and the answers turned into per-unit [`Group`]s. Everything but
//! [`Client::query`] is pure and tested here.

use super::estimate::{Bucket, Counts, Group};
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// How long one query may take, connection included.
const QUERY_TIMEOUT: Duration = Duration::from_secs(30);

/// A `--since` value (`30s`, `15m`, `1h`, `2d`: a whole number and one unit) in seconds.
pub fn parse_duration(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?}: add a unit (s, m, h or d), e.g. 15m"))?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: expected a whole number and a unit, e.g. 15m"))?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return Err(format!("{text:?}: the unit is one of s, m, h, d")),
    };
    match number.checked_mul(seconds) {
        Some(0) => Err(format!("{text:?}: the window must be longer than 0")),
        Some(total) => Ok(total),
        None => Err(format!("{text:?}: too long")),
    }
}

/// A route name as the filter writes it into `cohort_route`: characters outside
/// `[A-Za-z0-9_-]` become `_`.
pub fn route_label(route: &str) -> String {
    route
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// What to read: the window, an optional route, optional extra label matchers.
#[derive(Debug, Clone, PartialEq)]
pub struct Scope {
    pub since_s: u64,
    /// A `cohort_route` value (already as the filter writes it).
    pub route: Option<String>,
    /// Extra matchers, as PromQL writes them inside braces (`namespace="llm",job=~"envoy.*"`).
    pub selector: Option<String>,
}

impl Scope {
    /// The label matchers for `groups` (a regex over `cohort_group`).
    fn matchers(&self, groups: &str) -> String {
        let mut matchers = vec![format!("cohort_group=~\"{groups}\"")];
        if let Some(route) = &self.route {
            matchers.push(format!("cohort_route=\"{route}\""));
        }
        if let Some(extra) = self
            .selector
            .as_deref()
            .map(|s| s.trim().trim_matches(','))
            .filter(|s| !s.is_empty())
        {
            matchers.push(extra.to_owned());
        }
        matchers.join(",")
    }

    /// `sum by (<by>) (increase(<metric>{…}[<since>s]))` over Cohort's group and the hold-out.
    fn increase(&self, metric: &str, by: &str) -> String {
        format!(
            "sum by ({by}) (increase({metric}{{{}}}[{}s]))",
            self.matchers("routed|holdout"),
            self.since_s
        )
    }

    /// The PromQL of every query the report makes.
    pub fn queries(&self) -> Queries {
        let by = "cohort_group, cohort_unit";
        Queries {
            responses: self.increase("cohort_responses_total", &format!("{by}, cohort_status")),
            ttfb: self.increase("cohort_response_ttfb_ms_bucket", &format!("{by}, le")),
            prompt: self.increase("cohort_response_prompt_tokens_total", by),
            cached: self.increase("cohort_response_cached_tokens_total", by),
            bypassed: format!(
                "sum by (cohort_reason) (increase(cohort_responses_total{{{}}}[{}s]))",
                self.matchers("bypassed"),
                self.since_s
            ),
        }
    }
}

/// The queries' PromQL, or their answers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Queries<T = String> {
    pub responses: T,
    pub ttfb: T,
    pub prompt: T,
    pub cached: T,
    pub bypassed: T,
}

/// One element of an instant vector.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    fn label(&self, name: &str) -> &str {
        self.labels.get(name).map(String::as_str).unwrap_or("")
    }
}

/// A float as Prometheus writes it in JSON and in `le` (`+Inf`, `NaN`, `250`, `2.5e+03`).
fn parse_float(text: &str) -> Option<f64> {
    text.parse().ok()
}

/// The instant vector of an `/api/v1/query` answer (`status` 200 or not); `Err` with what
/// Prometheus said (its `errorType` and `error`), or with the start of a body that is not
/// its API's.
pub fn parse_vector(http_status: u16, body: &[u8]) -> Result<Vec<Sample>, String> {
    let snippet = || String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
    let json: Value = serde_json::from_slice(body).map_err(|_| {
        format!(
            "not a Prometheus API answer (HTTP {http_status}): {:?}",
            snippet()
        )
    })?;
    if json["status"] != "success" {
        return Err(format!(
            "Prometheus answered HTTP {http_status}, {}: {}",
            json["errorType"].as_str().unwrap_or("no errorType"),
            json["error"].as_str().unwrap_or("no error message")
        ));
    }
    let data = &json["data"];
    if data["resultType"] != "vector" {
        return Err(format!(
            "expected an instant vector, got resultType {}",
            data["resultType"]
        ));
    }
    let results = data["result"]
        .as_array()
        .ok_or_else(|| format!("no result array in {:?}", snippet()))?;
    results
        .iter()
        .map(|item| {
            let labels = item["metric"]
                .as_object()
                .ok_or_else(|| format!("a sample without labels: {item}"))?
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect();
            let value = item["value"][1]
                .as_str()
                .and_then(parse_float)
                .ok_or_else(|| format!("a sample without a value: {item}"))?;
            Ok(Sample { labels, value })
        })
        .collect()
}

/// The groups' per-unit counts from the answers: Cohort's (`routed`) and the hold-out's.
/// Series of other groups and non-finite values are skipped; a series without
/// `cohort_unit` counts as unit `""`.
pub fn assemble(answers: &Queries<Vec<Sample>>) -> (Group, Group) {
    let mut groups = [Group::default(), Group::default()];
    let mut each = |samples: &[Sample], add: &dyn Fn(&mut Counts, &Sample)| {
        for sample in samples.iter().filter(|s| s.value.is_finite()) {
            let group = match sample.label("cohort_group") {
                "routed" => &mut groups[0],
                "holdout" => &mut groups[1],
                _ => continue,
            };
            add(group.unit(sample.label("cohort_unit")), sample);
        }
    };
    each(&answers.responses, &|c, s| {
        c.responses += s.value;
        if s.label("cohort_status") == "5xx" {
            c.responses_5xx += s.value;
        }
    });
    each(&answers.ttfb, &|c, s| {
        if let Some(le) = parse_float(s.label("le")) {
            c.ttfb.push(Bucket { le, count: s.value });
        }
    });
    each(&answers.prompt, &|c, s| c.prompt_tokens += s.value);
    each(&answers.cached, &|c, s| c.cached_tokens += s.value);
    let [cohort, holdout] = groups;
    (cohort, holdout)
}

/// Bypassed responses by reason.
pub fn bypassed(samples: &[Sample]) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for s in samples.iter().filter(|s| s.value.is_finite()) {
        *out.entry(s.label("cohort_reason").to_owned()).or_default() += s.value;
    }
    out
}

/// Percent-encodes a query-string value.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `--prometheus`'s base URL, checked: plain `http://host[:port][/path prefix]`.
pub fn base_url(url: &str) -> Result<String, String> {
    let url = url.trim().trim_end_matches('/');
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| format!("--prometheus {url:?}: not a URL ({e})"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(format!(
                "--prometheus {url:?}: https is not supported; reach Prometheus over plain HTTP \
                 (e.g. kubectl port-forward svc/prometheus 9090)"
            ))
        }
        _ => return Err(format!("--prometheus {url:?}: expected http://HOST:PORT")),
    }
    if uri.host().is_none() || uri.query().is_some() {
        return Err(format!("--prometheus {url:?}: expected http://HOST:PORT"));
    }
    Ok(url.to_owned())
}

/// A plain-HTTP client for one Prometheus server's query API.
pub struct Client {
    base: String,
    http: HyperClient<HttpConnector, Empty<Bytes>>,
    /// The evaluation time of every query (Unix seconds), so the answers agree.
    time: f64,
}

impl Client {
    /// A client for `base` (from [`base_url`]) evaluating at `time`.
    pub fn new(base: String, time: f64) -> Client {
        Client {
            base,
            http: HyperClient::builder(TokioExecutor::new()).build_http(),
            time,
        }
    }

    /// Runs one instant query.
    pub async fn query(&self, promql: &str) -> Result<Vec<Sample>> {
        let url = format!(
            "{}/api/v1/query?query={}&time={:.3}",
            self.base,
            encode(promql),
            self.time
        );
        let uri: hyper::Uri = url.parse().with_context(|| format!("bad URL {url}"))?;
        let request = hyper::Request::get(uri)
            .header("accept", "application/json")
            .body(Empty::new())?;
        let exchange = async {
            let response = self.http.request(request).await?;
            let status = response.status().as_u16();
            let body = response.into_body().collect().await?.to_bytes();
            anyhow::Ok((status, body))
        };
        let (status, body) = match tokio::time::timeout(QUERY_TIMEOUT, exchange).await {
            Ok(answer) => {
                answer.with_context(|| format!("cannot reach Prometheus at {}", self.base))?
            }
            Err(_) => bail!(
                "Prometheus at {} did not answer within {} s",
                self.base,
                QUERY_TIMEOUT.as_secs()
            ),
        };
        parse_vector(status, &body)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("query {promql}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_one_unit() {
        assert_eq!(parse_duration("30s"), Ok(30));
        assert_eq!(parse_duration("15m"), Ok(900));
        assert_eq!(parse_duration("1h"), Ok(3_600));
        assert_eq!(parse_duration("2d"), Ok(172_800));
        for bad in [
            "",
            "15",
            "m",
            "1.5h",
            "1h30m",
            "-1h",
            "0s",
            "3w",
            "99999999999999999999d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn route_names_are_written_as_the_filter_writes_them() {
        assert_eq!(route_label("chat"), "chat");
        assert_eq!(route_label("llm/chat.v1"), "llm_chat_v1");
        assert_eq!(route_label("a-b_C9"), "a-b_C9");
    }

    #[test]
    fn the_queries_sum_by_group_and_unit_over_the_window() {
        let scope = Scope {
            since_s: 300,
            route: Some("chat".into()),
            selector: Some(r#"namespace="llm", job=~"envoy.*","#.into()),
        };
        let q = scope.queries();
        assert_eq!(
            q.ttfb,
            r#"sum by (cohort_group, cohort_unit, le) (increase(cohort_response_ttfb_ms_bucket{cohort_group=~"routed|holdout",cohort_route="chat",namespace="llm", job=~"envoy.*"}[300s]))"#
        );
        assert_eq!(
            q.responses,
            r#"sum by (cohort_group, cohort_unit, cohort_status) (increase(cohort_responses_total{cohort_group=~"routed|holdout",cohort_route="chat",namespace="llm", job=~"envoy.*"}[300s]))"#
        );
        let bare = Scope {
            since_s: 3_600,
            route: None,
            selector: None,
        };
        assert_eq!(
            bare.queries().bypassed,
            r#"sum by (cohort_reason) (increase(cohort_responses_total{cohort_group=~"bypassed"}[3600s]))"#
        );
        assert_eq!(
            bare.queries().cached,
            r#"sum by (cohort_group, cohort_unit) (increase(cohort_response_cached_tokens_total{cohort_group=~"routed|holdout"}[3600s]))"#
        );
    }

    #[test]
    fn answers_are_parsed_and_errors_say_what_prometheus_said() {
        let ok = br#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"cohort_group":"routed","cohort_unit":"3","le":"+Inf"},"value":[1700000000.5,"41.5"]},
            {"metric":{},"value":[1700000000.5,"NaN"]}]}}"#;
        let samples = parse_vector(200, ok).unwrap();
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[0].value, 41.5);
        assert_eq!(samples[0].label("le"), "+Inf");
        assert!(samples[1].value.is_nan());
        let bad = br#"{"status":"error","errorType":"bad_data","error":"1:5: parse error"}"#;
        let e = parse_vector(400, bad).unwrap_err();
        assert!(
            e.contains("HTTP 400") && e.contains("bad_data") && e.contains("parse error"),
            "{e}"
        );
        let html = b"<html>404 page not found</html>";
        let e = parse_vector(404, html).unwrap_err();
        assert!(e.contains("not a Prometheus API answer (HTTP 404)"), "{e}");
        let matrix = br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert!(parse_vector(200, matrix).unwrap_err().contains("matrix"));
    }

    fn sample(labels: &[(&str, &str)], value: f64) -> Sample {
        Sample {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            value,
        }
    }

    #[test]
    fn answers_become_per_unit_counts_of_each_group() {
        let answers = Queries {
            responses: vec![
                sample(
                    &[
                        ("cohort_group", "routed"),
                        ("cohort_unit", "0"),
                        ("cohort_status", "2xx"),
                    ],
                    9.0,
                ),
                sample(
                    &[
                        ("cohort_group", "routed"),
                        ("cohort_unit", "0"),
                        ("cohort_status", "5xx"),
                    ],
                    1.0,
                ),
                sample(
                    &[
                        ("cohort_group", "holdout"),
                        ("cohort_unit", "7"),
                        ("cohort_status", "2xx"),
                    ],
                    4.0,
                ),
                sample(
                    &[("cohort_group", "bypassed"), ("cohort_status", "2xx")],
                    50.0,
                ),
                sample(
                    &[
                        ("cohort_group", "holdout"),
                        ("cohort_unit", "7"),
                        ("cohort_status", "4xx"),
                    ],
                    f64::NAN,
                ),
            ],
            ttfb: vec![
                sample(
                    &[
                        ("cohort_group", "routed"),
                        ("cohort_unit", "0"),
                        ("le", "100"),
                    ],
                    6.0,
                ),
                sample(
                    &[
                        ("cohort_group", "routed"),
                        ("cohort_unit", "0"),
                        ("le", "+Inf"),
                    ],
                    10.0,
                ),
            ],
            prompt: vec![sample(
                &[("cohort_group", "holdout"), ("cohort_unit", "7")],
                400.0,
            )],
            cached: vec![sample(
                &[("cohort_group", "holdout"), ("cohort_unit", "7")],
                100.0,
            )],
            bypassed: vec![
                sample(&[("cohort_reason", "breaker_open")], 7.0),
                sample(&[("cohort_reason", "body_too_large")], 1.0),
            ],
        };
        let (cohort, holdout) = assemble(&answers);
        let unit0 = &cohort.units["0"];
        assert_eq!((unit0.responses, unit0.responses_5xx), (10.0, 1.0));
        assert_eq!(
            unit0.ttfb,
            vec![
                Bucket {
                    le: 100.0,
                    count: 6.0
                },
                Bucket {
                    le: f64::INFINITY,
                    count: 10.0
                }
            ]
        );
        assert_eq!(cohort.units.len(), 1);
        let unit7 = &holdout.units["7"];
        assert_eq!(
            (unit7.responses, unit7.prompt_tokens, unit7.cached_tokens),
            (4.0, 400.0, 100.0)
        );
        let by_reason = bypassed(&answers.bypassed);
        assert_eq!(by_reason["breaker_open"], 7.0);
        assert_eq!(by_reason.values().sum::<f64>(), 8.0);
    }

    #[test]
    fn only_plain_http_urls_are_taken() {
        assert_eq!(
            base_url("http://127.0.0.1:9090/").as_deref(),
            Ok("http://127.0.0.1:9090")
        );
        assert_eq!(
            base_url("http://prom.example/prometheus").as_deref(),
            Ok("http://prom.example/prometheus")
        );
        assert!(base_url("https://prom.example")
            .unwrap_err()
            .contains("https"));
        for bad in ["127.0.0.1:9090", "ftp://x", "http://x/?q=1", "not a url"] {
            assert!(base_url(bad).is_err(), "{bad}");
        }
        assert_eq!(encode("a b{c=\"d\"}"), "a%20b%7Bc%3D%22d%22%7D");
    }
}
