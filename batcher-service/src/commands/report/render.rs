//! `cohort report`'s output: the comparison as a table with its verdicts and the method's
//! footer, or as JSON for scripts. Pure: text in, text out.

use super::estimate::{
    Comparison, Measure, Outcome, Row, Side, Threshold, TooSmall, CONFIDENCE, UNITS,
};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// What the report was asked.
#[derive(Debug, Clone)]
pub struct Header {
    pub prometheus: String,
    /// `--since` as given.
    pub since: String,
    pub route: Option<String>,
    pub selector: Option<String>,
}

/// How the intervals are made, and the threshold (the footer of the table).
pub fn method(threshold: &Threshold) -> String {
    format!(
        "Method: users are the units. The filter splits users into {UNITS} units (cohort_unit: a random \
         eighth of the users each, in both groups). Each value is computed on all of a group's data; \
         its variance from the spread of the per-unit values (s²/k over the k units with data); the \
         difference's {level}% interval by Welch's t with Welch-Satterthwaite degrees of freedom. \
         \"better\" or \"worse\" when the interval excludes 0. No verdict when a group has fewer than \
         {min} responses or fewer than {units} of the {UNITS} units with at least {per_unit} responses each \
         (for TTFT: of the responses its histogram sampled).",
        level = CONFIDENCE * 100.0,
        min = threshold.min_responses,
        units = threshold.min_units,
        per_unit = threshold.min_unit_responses,
    )
}

/// What sharing the replicas means for reading the difference.
pub const INTERFERENCE: &str =
    "Both groups share the same replicas: held-out requests land on caches \
     Cohort warms and on replicas Cohort loads. The difference measures Cohort at the current \
     rollout share, not a full rollout against none; it usually understates the cache effect.";

/// The width the table's notes wrap at.
const WIDTH: usize = 96;

/// `text` broken into lines of at most `width` characters at spaces (a longer word stays
/// whole), each ending in a newline.
fn wrap(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            out.push_str(&line);
            out.push('\n');
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

fn label(measure: Measure) -> &'static str {
    match measure {
        Measure::TtftP50 => "TTFT p50",
        Measure::TtftP95 => "TTFT p95",
        Measure::CachedShare => "cached-token share",
        Measure::ErrorRate => "5xx rate",
    }
}

/// A value of `measure` as the table shows it.
fn value(measure: Measure, v: f64) -> String {
    match measure {
        Measure::TtftP50 | Measure::TtftP95 => format!("{v:.1} ms"),
        Measure::CachedShare => format!("{:.1}%", v * 100.0),
        Measure::ErrorRate => format!("{:.2}%", v * 100.0),
    }
}

/// A difference of `measure` (ms, or percentage points), signed.
fn difference(measure: Measure, d: f64) -> String {
    let unit = match measure {
        Measure::TtftP50 | Measure::TtftP95 => "ms",
        Measure::CachedShare | Measure::ErrorRate => "pp",
    };
    format!("{} {unit}", bound(measure, d))
}

/// A signed difference in the measure's unit (ms, or percentage points), rounded; a value
/// that rounds to zero is `+0.0`, never `-0.0`.
fn bound(measure: Measure, d: f64) -> String {
    let (value, decimals) = match measure {
        Measure::TtftP50 | Measure::TtftP95 => (d, 1),
        Measure::CachedShare => (d * 100.0, 1),
        Measure::ErrorRate => (d * 100.0, 2),
    };
    let text = format!("{value:+.decimals$}");
    if text
        .trim_start_matches(['+', '-'])
        .trim_matches(['0', '.'])
        .is_empty()
    {
        text.replacen('-', "+", 1)
    } else {
        text
    }
}

fn scope(header: &Header) -> String {
    let mut scope = format!("last {}", header.since);
    if let Some(route) = &header.route {
        scope.push_str(&format!(", route {route}"));
    }
    if let Some(selector) = &header.selector {
        scope.push_str(&format!(", {{{selector}}}"));
    }
    scope
}

fn too_small(who: &str, small: &TooSmall, threshold: &Threshold) -> String {
    format!(
        "Too small to conclude: {who} has {:.0} responses, {} of the {UNITS} units with at least {} \
         responses (a verdict needs {} responses and {} such units in each group).",
        small.responses,
        small.units,
        threshold.min_unit_responses,
        threshold.min_responses,
        threshold.min_units
    )
}

/// The report as text.
pub fn text(
    header: &Header,
    comparison: &Comparison,
    bypassed: &BTreeMap<String, f64>,
    threshold: &Threshold,
) -> String {
    let mut out = format!(
        "Cohort against its hold-out: {} (Prometheus {})\n\n",
        scope(header),
        header.prometheus
    );
    if comparison.outcome == Outcome::NoData {
        out.push_str(&wrap(
            "No data: no Cohort-routed or held-out responses in the window (cohort_responses_total). \
             Check that Prometheus scrapes the proxies' /stats/prometheus, the route and selector, \
             and that the filter handled LLM API requests in the window.",
            WIDTH,
        ));
        return out;
    }
    out.push_str(&format!(
        "{:<20} {:>11} {:>11} {:>12}  {:<20} {}\n",
        "",
        "Cohort",
        "hold-out",
        "difference",
        format!("{:.0}% CI", CONFIDENCE * 100.0),
        "verdict"
    ));
    out.push_str(&format!(
        "{:<20} {:>11.0} {:>11.0}\n",
        "responses", comparison.cohort.responses, comparison.holdout.responses
    ));
    for row in &comparison.rows {
        out.push_str(&table_row(row));
    }
    out.push('\n');
    let (c, h) = (&comparison.cohort, &comparison.holdout);
    out.push_str(&wrap(
        &format!(
            "Units with at least {min} responses: Cohort {} of {UNITS}, hold-out {} of {UNITS}. \
             TTFT from the responses the histograms sampled: Cohort {:.0} ({} units with {min}), \
             hold-out {:.0} ({}).",
            comparison.cohort_units,
            comparison.holdout_units,
            c.ttft_samples(),
            comparison.cohort_sampled_units,
            h.ttft_samples(),
            comparison.holdout_sampled_units,
            min = threshold.min_unit_responses,
        ),
        WIDTH,
    ));
    if let Some((side, small)) = comparison.rows.iter().find_map(|r| r.too_small) {
        let who = match side {
            Side::Cohort => "Cohort's group",
            Side::Holdout => "the hold-out",
        };
        out.push_str(&wrap(
            &format!(
                "TTFT too small to conclude: {who}'s TTFB histogram sampled {:.0} responses, {} of \
                 the {UNITS} units with at least {} (the filter records one response in \
                 histogram_sample_every; lower it, or widen --since).",
                small.responses, small.units, threshold.min_unit_responses
            ),
            WIDTH,
        ));
    }
    let bypassed_total: f64 = bypassed.values().sum();
    if bypassed_total > 0.0 {
        let reasons: Vec<String> = bypassed
            .iter()
            .filter(|(_, n)| **n > 0.0)
            .map(|(reason, n)| format!("{reason} {n:.0}"))
            .collect();
        out.push_str(&wrap(
            &format!(
                "Bypassed (in neither group): {bypassed_total:.0} responses ({}).",
                reasons.join(", ")
            ),
            WIDTH,
        ));
    }
    match comparison.outcome {
        Outcome::NoHoldout => out.push_str(&wrap(
            "No hold-out: no held-out responses in the window (rollout.share is 1, or nothing was \
             held out), so there is nothing to compare Cohort against. Keep a hold-out \
             (rollout.share below 1) to measure Cohort's effect.",
            WIDTH,
        )),
        Outcome::NoCohort => out.push_str(&wrap(
            "No Cohort-routed responses in the window (rollout.share 0, or every request was \
             bypassed): nothing to compare.",
            WIDTH,
        )),
        Outcome::HoldoutTooSmall(small) => {
            out.push_str(&wrap(&too_small("the hold-out", &small, threshold), WIDTH));
        }
        Outcome::CohortTooSmall(small) => {
            out.push_str(&wrap(
                &too_small("Cohort's group", &small, threshold),
                WIDTH,
            ));
        }
        Outcome::Compared | Outcome::NoData => {}
    }
    out.push('\n');
    out.push_str(&wrap(&method(threshold), WIDTH));
    out.push_str(&wrap(INTERFERENCE, WIDTH));
    out
}

fn table_row(row: &Row) -> String {
    let m = row.measure;
    let missing = || "-".to_owned();
    let cohort = row.cohort.map_or_else(missing, |e| value(m, e.value));
    let holdout = row.holdout.map_or_else(missing, |e| value(m, e.value));
    let diff = row
        .point_difference
        .map_or_else(missing, |d| difference(m, d));
    let ci = row.difference.map_or_else(missing, |d| {
        format!("[{}, {}]", bound(m, d.low), bound(m, d.high))
    });
    format!(
        "{:<20} {cohort:>11} {holdout:>11} {diff:>12}  {ci:<20} {}\n",
        label(m),
        row.verdict.text()
    )
}

/// The report as JSON: the same numbers, unrounded.
pub fn json(
    header: &Header,
    comparison: &Comparison,
    bypassed: &BTreeMap<String, f64>,
    threshold: &Threshold,
) -> Value {
    let estimate = |e: Option<super::estimate::Estimate>| {
        e.map(|e| json!({"value": e.value, "variance": e.variance, "units": e.units}))
    };
    let (outcome, small) = match comparison.outcome {
        Outcome::Compared => ("compared", None),
        Outcome::NoData => ("no_data", None),
        Outcome::NoHoldout => ("no_holdout", None),
        Outcome::NoCohort => ("no_cohort", None),
        Outcome::HoldoutTooSmall(s) => ("too_small_holdout", Some(s)),
        Outcome::CohortTooSmall(s) => ("too_small_cohort", Some(s)),
    };
    json!({
        "prometheus": header.prometheus,
        "since": header.since,
        "route": header.route,
        "selector": header.selector,
        "outcome": outcome,
        "too_small": small.map(|s| json!({"responses": s.responses, "units": s.units})),
        "threshold": {
            "min_responses": threshold.min_responses,
            "min_units": threshold.min_units,
            "min_unit_responses": threshold.min_unit_responses,
        },
        "confidence": CONFIDENCE,
        "groups": {
            "cohort": {
                "responses": comparison.cohort.responses,
                "responses_5xx": comparison.cohort.responses_5xx,
                "ttft_samples": comparison.cohort.ttft_samples(),
                "units_with_min_responses": comparison.cohort_units,
                "units_with_min_ttft_samples": comparison.cohort_sampled_units,
            },
            "holdout": {
                "responses": comparison.holdout.responses,
                "responses_5xx": comparison.holdout.responses_5xx,
                "ttft_samples": comparison.holdout.ttft_samples(),
                "units_with_min_responses": comparison.holdout_units,
                "units_with_min_ttft_samples": comparison.holdout_sampled_units,
            },
        },
        "bypassed": bypassed,
        "measures": comparison.rows.iter().map(|row| json!({
            "measure": row.measure.name(),
            "cohort": estimate(row.cohort),
            "holdout": estimate(row.holdout),
            "difference": row.point_difference,
            "ci": row.difference.map(|d| json!({"low": d.low, "high": d.high, "df": d.df})),
            "verdict": row.verdict.text(),
            "too_small": row.too_small.map(|(side, s)| json!({
                "group": match side { Side::Cohort => "cohort", Side::Holdout => "holdout" },
                "samples": s.responses,
                "units": s.units,
            })),
        })).collect::<Vec<_>>(),
        "method": method(threshold),
        "interference": INTERFERENCE,
    })
}

#[cfg(test)]
mod tests {
    use super::super::estimate::{compare, Bucket, Counts, Group};
    use super::*;

    fn unit(n: f64, ttft_bucket: f64) -> Counts {
        Counts {
            responses: n,
            responses_5xx: 0.0,
            ttfb: vec![
                Bucket {
                    le: ttft_bucket / 2.0,
                    count: 0.0,
                },
                Bucket {
                    le: ttft_bucket,
                    count: n,
                },
                Bucket {
                    le: f64::INFINITY,
                    count: n,
                },
            ],
            prompt_tokens: 100.0 * n,
            cached_tokens: 50.0 * n,
        }
    }

    fn group(n: &[f64], ttft_bucket: f64) -> Group {
        Group {
            units: n
                .iter()
                .enumerate()
                .map(|(i, &n)| (i.to_string(), unit(n, ttft_bucket)))
                .collect(),
        }
    }

    fn header() -> Header {
        Header {
            prometheus: "http://prom:9090".into(),
            since: "1h".into(),
            route: Some("chat".into()),
            selector: None,
        }
    }

    #[test]
    fn a_comparison_prints_each_measure_with_its_interval_verdict_and_the_method() {
        let cohort = group(&[40.0, 41.0, 39.0, 40.0, 42.0, 38.0, 40.0, 40.0], 250.0);
        let holdout = group(&[40.0, 44.0, 36.0, 40.0, 40.0, 41.0, 39.0, 40.0], 50.0);
        // Spread the medians a little so that the variances are not zero.
        let mut cohort = cohort;
        for (i, u) in cohort.units.values_mut().enumerate() {
            u.ttfb[0].count = i as f64;
        }
        let mut holdout = holdout;
        for (i, u) in holdout.units.values_mut().enumerate() {
            u.ttfb[0].count = 2.0 * i as f64;
        }
        let threshold = Threshold::default();
        let comparison = compare(&cohort, &holdout, &threshold);
        let mut bypassed = BTreeMap::new();
        bypassed.insert("breaker_open".to_owned(), 3.0);
        let text = text(&header(), &comparison, &bypassed, &threshold);
        assert!(
            text.starts_with("Cohort against its hold-out: last 1h, route chat"),
            "{text}"
        );
        let p50 = text.lines().find(|l| l.starts_with("TTFT p50")).unwrap();
        assert!(p50.ends_with("worse"), "{p50}");
        assert!(p50.contains("[+"), "{p50}");
        let cached = text
            .lines()
            .find(|l| l.starts_with("cached-token share"))
            .unwrap();
        assert!(
            cached.contains("50.0%") && cached.contains("+0.0 pp"),
            "{cached}"
        );
        assert!(
            text.contains("responses                    320         320"),
            "{text}"
        );
        assert!(text.contains("Bypassed (in neither group): 3 responses (breaker_open 3)."));
        assert!(text.contains("Method: users are the units."));
        assert!(text.contains("Welch's t"));
        assert!(text.contains("Both groups share the same replicas"));
        assert!(!text.contains("Too small"));

        let json = json(&header(), &comparison, &bypassed, &threshold);
        assert_eq!(json["outcome"], "compared");
        assert_eq!(json["measures"][0]["measure"], "ttft_p50_ms");
        assert_eq!(json["measures"][0]["verdict"], "worse");
        assert!(json["measures"][0]["ci"]["low"].as_f64().unwrap() > 0.0);
    }

    #[test]
    fn differences_are_signed_and_zero_is_never_negative() {
        assert_eq!(difference(Measure::TtftP50, 167.74), "+167.7 ms");
        assert_eq!(difference(Measure::TtftP95, -2.06), "-2.1 ms");
        assert_eq!(difference(Measure::CachedShare, -0.000_04), "+0.0 pp");
        assert_eq!(difference(Measure::ErrorRate, 0.0123), "+1.23 pp");
        assert_eq!(bound(Measure::ErrorRate, -0.000_01), "+0.00");
        assert_eq!(bound(Measure::CachedShare, -0.2), "-20.0");
    }

    #[test]
    fn ttft_rows_say_when_the_histogram_sampled_too_few() {
        let threshold = Threshold::default();
        let cohort = group(&[100.0; 8], 250.0);
        let mut holdout = group(&[100.0; 8], 50.0);
        for u in holdout.units.values_mut() {
            for b in &mut u.ttfb {
                b.count = (b.count / 8.0).floor();
            }
        }
        let comparison = compare(&cohort, &holdout, &threshold);
        let text = text(&header(), &comparison, &BTreeMap::new(), &threshold);
        assert!(
            text.contains("TTFT too small to conclude: the hold-out's TTFB histogram sampled 96"),
            "{text}"
        );
        let p50 = text.lines().find(|l| l.starts_with("TTFT p50")).unwrap();
        assert!(p50.ends_with("too small to conclude"), "{p50}");
        let rate = text.lines().find(|l| l.starts_with("5xx rate")).unwrap();
        assert!(rate.ends_with("no detectable difference"), "{rate}");
        let json = json(&header(), &comparison, &BTreeMap::new(), &threshold);
        assert_eq!(json["outcome"], "compared");
        assert_eq!(json["measures"][0]["too_small"]["group"], "holdout");
        assert_eq!(json["groups"]["holdout"]["ttft_samples"], 96.0);
    }

    #[test]
    fn notes_wrap_at_spaces() {
        assert_eq!(wrap("aa bb cc dd", 5), "aa bb\ncc dd\n");
        assert_eq!(wrap("a verylongword b", 4), "a\nverylongword\nb\n");
        assert_eq!(wrap("", 10), "");
        let text = text(
            &header(),
            &compare(
                &group(&[100.0; 8], 250.0),
                &Group::default(),
                &Threshold::default(),
            ),
            &BTreeMap::new(),
            &Threshold::default(),
        );
        assert!(text.lines().all(|l| l.chars().count() <= WIDTH), "{text}");
    }

    #[test]
    fn a_tiny_hold_out_or_none_says_so_instead_of_a_verdict() {
        let threshold = Threshold::default();
        let cohort = group(&[100.0; 8], 250.0);
        let tiny = group(&[5.0, 3.0, 0.0, 0.0, 30.0, 0.0, 0.0, 1.0], 50.0);
        let comparison = compare(&cohort, &tiny, &threshold);
        let text = text(&header(), &comparison, &BTreeMap::new(), &threshold);
        assert!(
            text.contains("Too small to conclude: the hold-out has 39 responses, 1 of the 8 units"),
            "{text}"
        );
        let p50 = text.lines().find(|l| l.starts_with("TTFT p50")).unwrap();
        assert!(p50.ends_with("too small to conclude"), "{p50}");
        assert!(!text.contains("Bypassed"));
        let json = json(&header(), &comparison, &BTreeMap::new(), &threshold);
        assert_eq!(json["outcome"], "too_small_holdout");
        assert_eq!(json["too_small"]["responses"], 39.0);

        let none = compare(&cohort, &Group::default(), &threshold);
        let text = super::text(&header(), &none, &BTreeMap::new(), &threshold);
        assert!(text.contains("No hold-out:"), "{text}");
        let nothing = compare(&Group::default(), &Group::default(), &threshold);
        let text = super::text(&header(), &nothing, &BTreeMap::new(), &threshold);
        assert!(
            text.contains("No data:") && !text.contains("TTFT"),
            "{text}"
        );
    }
}
