//! `/metrics`: the Prometheus exposition, written by `prometheus-client` (the Prometheus
//! project's Rust client) in the OpenMetrics text format.
//!
//! The values live where they are counted (the brain's atomics, the store's and the
//! policy's snapshots, the front's counters, the engines' last reports); each part that
//! owns some implements [`MetricSource`] and writes them at scrape time through a
//! [`Scrape`]. One [`Metrics`] registry per `cohort serve` holds the sources.
//!
//! Names are given as Prometheus stores them: a counter's name ends in `_total` here and
//! in docs/METRICS.md, where every name is listed with its meaning (OpenMetrics names the
//! family without the suffix; [`Scrape`] strips it). This module is a leaf of the binary.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::fmt;
use std::sync::Arc;

pub use prometheus_client::metrics::histogram::Histogram;

/// The content type of [`Metrics::render`]'s page.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A part of the batcher that has metrics to report at each scrape.
pub trait MetricSource: Send + Sync + 'static {
    fn write_metrics(&self, scrape: &mut Scrape<'_>);
}

impl<F: Fn(&mut Scrape<'_>) + Send + Sync + 'static> MetricSource for F {
    fn write_metrics(&self, scrape: &mut Scrape<'_>) {
        self(scrape)
    }
}

/// The registry of one `cohort serve`.
#[derive(Default)]
pub struct Metrics {
    registry: Registry,
}

impl Metrics {
    pub fn add(&mut self, source: Arc<dyn MetricSource>) {
        self.registry.register_collector(Box::new(Source(source)));
    }

    /// The page (OpenMetrics text, ending `# EOF`).
    pub fn render(&self) -> String {
        let mut text = String::new();
        if let Err(error) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::warn!(%error, "cannot encode /metrics");
        }
        text
    }
}

/// The page of one source alone (tests).
#[cfg(test)]
pub fn render_one(source: impl MetricSource) -> String {
    let mut metrics = Metrics::default();
    metrics.add(Arc::new(source));
    metrics.render()
}

struct Source(Arc<dyn MetricSource>);

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("cohort metric source")
    }
}

impl Collector for Source {
    fn encode(&self, encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let mut scrape = Scrape {
            encoder,
            result: Ok(()),
        };
        self.0.write_metrics(&mut scrape);
        scrape.result
    }
}

/// Writes one source's metrics during a scrape. Writing never fails for the caller: the
/// first encoding error is kept and ends the scrape.
pub struct Scrape<'a> {
    encoder: DescriptorEncoder<'a>,
    result: fmt::Result,
}

/// A label value in the text format (`prometheus-client` writes values as given).
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// One-label values as rows of label values.
fn one_label(values: &[(String, f64)]) -> Vec<(Vec<String>, f64)> {
    values.iter().map(|(l, v)| (vec![l.clone()], *v)).collect()
}

/// A counter's family name as OpenMetrics wants it: without `_total`.
fn family(name: &str, kind: MetricType) -> &str {
    match kind {
        MetricType::Counter => name.strip_suffix("_total").unwrap_or(name),
        _ => name,
    }
}

impl Scrape<'_> {
    fn one(&mut self, name: &str, help: &str, metric: &dyn EncodeMetric) {
        if self.result.is_err() {
            return;
        }
        let kind = metric.metric_type();
        self.result = self
            .encoder
            .encode_descriptor(family(name, kind), help, None, kind)
            .and_then(|encoder| metric.encode(encoder));
    }

    /// A counter (`name` ends in `_total`).
    pub fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.one(name, help, &ConstCounter::new(value));
    }

    pub fn gauge(&mut self, name: &str, help: &str, value: f64) {
        self.one(name, help, &ConstGauge::new(value));
    }

    /// A gauge whose values are counts (written without a fraction).
    pub fn count_gauge(&mut self, name: &str, help: &str, value: u64) {
        self.one(
            name,
            help,
            &ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX)),
        );
    }

    pub fn histogram(&mut self, name: &str, help: &str, histogram: &Histogram) {
        self.one(name, help, histogram);
    }

    /// A counter with one label (`name` ends in `_total`).
    pub fn labelled_counter(
        &mut self,
        name: &str,
        help: &str,
        label: &str,
        values: &[(String, f64)],
    ) {
        self.rows(
            (name, help, MetricType::Counter),
            &[label],
            &one_label(values),
            ConstCounter::new,
        );
    }

    /// A counter with several labels (`name` ends in `_total`): one value per row of
    /// label values, in `labels` order.
    pub fn counter_by(
        &mut self,
        name: &str,
        help: &str,
        labels: &[&str],
        rows: &[(Vec<String>, f64)],
    ) {
        self.rows(
            (name, help, MetricType::Counter),
            labels,
            rows,
            ConstCounter::new,
        );
    }

    /// A gauge with several labels.
    pub fn gauge_by(
        &mut self,
        name: &str,
        help: &str,
        labels: &[&str],
        rows: &[(Vec<String>, f64)],
    ) {
        self.rows(
            (name, help, MetricType::Gauge),
            labels,
            rows,
            ConstGauge::new,
        );
    }

    /// One metric of type `kind` per row of label values (in `labels` order), each made
    /// by `metric`.
    fn rows<M: EncodeMetric>(
        &mut self,
        (name, help, kind): (&str, &str, MetricType),
        labels: &[&str],
        rows: &[(Vec<String>, f64)],
        metric: impl Fn(f64) -> M,
    ) {
        if self.result.is_err() {
            return;
        }
        self.result = (|| {
            let mut encoder =
                self.encoder
                    .encode_descriptor(family(name, kind), help, None, kind)?;
            for (values, value) in rows {
                let escaped: Vec<String> = values.iter().map(|v| escape(v)).collect();
                let pairs: Vec<(&str, &str)> = labels
                    .iter()
                    .copied()
                    .zip(escaped.iter().map(String::as_str))
                    .collect();
                metric(*value).encode(encoder.encode_family(&pairs)?)?;
            }
            Ok(())
        })();
    }

    /// A gauge with one label.
    pub fn labelled_gauge(
        &mut self,
        name: &str,
        help: &str,
        label: &str,
        values: &[(String, f64)],
    ) {
        self.rows(
            (name, help, MetricType::Gauge),
            &[label],
            &one_label(values),
            ConstGauge::new,
        );
    }
}

/// A histogram of durations in seconds with the given bucket bounds (`+Inf` added).
pub fn histogram(bounds: &[f64]) -> Histogram {
    Histogram::new(bounds.iter().copied())
}

/// Buckets from 10 µs to 1 s, for in-process decision times.
pub fn decision_seconds() -> Histogram {
    histogram(&[
        0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
        0.1, 1.0,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_text_format() {
        let histogram = Arc::new(histogram(&[0.1, 1.0]));
        histogram.observe(0.05);
        histogram.observe(0.5);
        histogram.observe(5.0);
        let text = render_one(move |scrape: &mut Scrape<'_>| {
            scrape.counter("cohort_x_total", "x things", 3);
            scrape.labelled_gauge("cohort_y", "y", "replica", &[("a\"b".into(), 1.5)]);
            scrape.histogram("cohort_z_seconds", "z", &histogram);
            scrape.count_gauge("cohort_w", "w", 7);
        });
        assert!(
            text.contains("# TYPE cohort_x counter\ncohort_x_total 3\n"),
            "{text}"
        );
        assert!(
            text.contains("cohort_y{replica=\"a\\\"b\"} 1.5\n"),
            "{text}"
        );
        assert!(
            text.contains("cohort_z_seconds_bucket{le=\"0.1\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("cohort_z_seconds_bucket{le=\"1.0\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("cohort_z_seconds_bucket{le=\"+Inf\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("cohort_z_seconds_count 3\n"), "{text}");
        assert!(text.contains("cohort_z_seconds_sum 5.55\n"), "{text}");
        assert!(text.contains("cohort_w 7\n"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
