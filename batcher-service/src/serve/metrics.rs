//! Prometheus text exposition for `/metrics`: a small writer and a lock-free histogram.
//!
//! The values themselves live where they are counted (the [`Brain`](super::brain::Brain)'s
//! atomics, the store's and the policy's snapshots); a scrape reads them all at once and
//! writes the text format (version 0.0.4). Writing the format directly keeps every metric
//! next to the code that owns it, with no registry to keep in sync.
//!
//! Every name starts with `cohort_`; the list with meanings is in `docs/BATCHER.md`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Builds one exposition page.
#[derive(Default)]
pub struct Page {
    text: String,
}

impl Page {
    fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    pub fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.header(name, "counter", help);
        let _ = writeln!(self.text, "{name} {value}");
    }

    pub fn gauge(&mut self, name: &str, help: &str, value: f64) {
        self.header(name, "gauge", help);
        let _ = writeln!(self.text, "{name} {value}");
    }

    /// A metric with one label: `kind` is `counter` or `gauge`.
    pub fn labelled(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        label: &str,
        values: &[(String, f64)],
    ) {
        self.header(name, kind, help);
        for (value_label, value) in values {
            let _ = writeln!(
                self.text,
                "{name}{{{label}=\"{}\"}} {value}",
                escape(value_label)
            );
        }
    }

    pub fn histogram(&mut self, name: &str, help: &str, histogram: &Histogram) {
        self.header(name, "histogram", help);
        let mut cumulative = 0;
        for (bound, bucket) in histogram.bounds.iter().zip(&histogram.buckets) {
            cumulative += bucket.load(Ordering::Relaxed);
            let _ = writeln!(self.text, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let count = histogram.count.load(Ordering::Relaxed);
        let _ = writeln!(self.text, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = histogram.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(self.text, "{name}_sum {sum}");
        let _ = writeln!(self.text, "{name}_count {count}");
    }

    pub fn finish(self) -> String {
        self.text
    }
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A histogram of durations in seconds with fixed buckets, safe to observe from any thread.
pub struct Histogram {
    bounds: Vec<f64>,
    buckets: Vec<AtomicU64>,
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &[f64]) -> Histogram {
        Histogram {
            bounds: bounds.to_vec(),
            buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }

    /// Buckets from 10 µs to 1 s, for in-process decision times.
    pub fn decision_seconds() -> Histogram {
        Histogram::new(&[
            0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
            0.1, 1.0,
        ])
    }

    pub fn observe(&self, seconds: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| seconds <= b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let micros = (seconds.max(0.0) * 1e6) as u64;
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_text_format() {
        let histogram = Histogram::new(&[0.1, 1.0]);
        histogram.observe(0.05);
        histogram.observe(0.5);
        histogram.observe(5.0);
        let mut page = Page::default();
        page.counter("cohort_x_total", "x things", 3);
        page.labelled("cohort_y", "gauge", "y", "replica", &[("a\"b".into(), 1.5)]);
        page.histogram("cohort_z_seconds", "z", &histogram);
        let text = page.finish();
        assert!(text.contains("# TYPE cohort_x_total counter\ncohort_x_total 3\n"));
        assert!(text.contains("cohort_y{replica=\"a\\\"b\"} 1.5\n"));
        assert!(text.contains("cohort_z_seconds_bucket{le=\"0.1\"} 1\n"));
        assert!(text.contains("cohort_z_seconds_bucket{le=\"1\"} 2\n"));
        assert!(text.contains("cohort_z_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(text.contains("cohort_z_seconds_count 3\n"));
        assert!(text.contains("cohort_z_seconds_sum 5.55\n"));
    }
}
