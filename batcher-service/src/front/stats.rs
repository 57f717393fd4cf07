//! The front's counters and histograms, and their part of the `/metrics` page.

use crate::metrics::{histogram, Histogram, Scrape};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Why a request went to an engine without batching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direct {
    /// The body is not JSON or not an API shape the fingerprint knows.
    Unparsed,
    /// Too many followers held already (backpressure).
    Overflow,
    /// It shares less than `batch.min_shared` of its prompt with its cohort's open batch.
    Unshared,
}

#[derive(Default)]
pub struct FrontStats {
    pub leaders: AtomicU64,
    pub followers: AtomicU64,
    pub direct_unparsed: AtomicU64,
    pub direct_overflow: AtomicU64,
    pub direct_unshared: AtomicU64,
    /// Requests sent to another replica because theirs was unreachable.
    pub failovers: AtomicU64,
    /// Requests answered 502 because no replica was reachable.
    pub unreachable: AtomicU64,
    /// Callers that went away before their response ended.
    pub cancelled: AtomicU64,
    pub lora_loads: AtomicU64,
    pub lora_load_errors: AtomicU64,
    batch_size: BatchSizes,
    pub queue_wait: QueueWait,
    pub heatmap: Heatmap,
}

/// Time to first byte of the front's requests over the last minutes, for the inspector's
/// live heatmap: one column per `COLUMN` of wall time, one row per latency bucket.
pub struct Heatmap {
    started: Instant,
    columns: Mutex<VecDeque<(u64, [u32; HEATMAP_ROWS.len() + 1])>>,
}

/// Upper bounds of the heatmap's rows, ms (a last row takes the rest).
pub const HEATMAP_ROWS: [u64; 9] = [25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000];
const COLUMN: Duration = Duration::from_secs(10);
const COLUMNS: usize = 30;

impl Default for Heatmap {
    fn default() -> Self {
        Heatmap {
            started: Instant::now(),
            columns: Mutex::new(VecDeque::new()),
        }
    }
}

impl Heatmap {
    pub fn record(&self, first_byte: Duration) {
        let column = self.started.elapsed().as_secs() / COLUMN.as_secs();
        let ms = first_byte.as_millis() as u64;
        let row = HEATMAP_ROWS
            .iter()
            .position(|&b| ms <= b)
            .unwrap_or(HEATMAP_ROWS.len());
        let mut columns = self.columns.lock().unwrap_or_else(|e| e.into_inner());
        if columns.back().is_none_or(|(c, _)| *c != column) {
            columns.push_back((column, [0; HEATMAP_ROWS.len() + 1]));
            while columns.len() > COLUMNS {
                columns.pop_front();
            }
        }
        if let Some((_, counts)) = columns.back_mut() {
            counts[row] += 1;
        }
    }

    /// `{"rows_ms": [...], "column_s": 10, "columns": [{"age_s", "counts"}]}`, oldest first.
    pub fn to_json(&self) -> serde_json::Value {
        let now = self.started.elapsed().as_secs() / COLUMN.as_secs();
        let columns = self.columns.lock().unwrap_or_else(|e| e.into_inner());
        serde_json::json!({
            "rows_ms": HEATMAP_ROWS,
            "column_s": COLUMN.as_secs(),
            "columns": columns.iter().map(|(c, counts)| serde_json::json!({
                "age_s": (now - c) * COLUMN.as_secs(),
                "counts": counts.to_vec(),
            })).collect::<Vec<_>>(),
        })
    }
}

pub struct BatchSizes(pub Histogram);
pub struct QueueWait(pub Histogram);

impl Default for BatchSizes {
    fn default() -> Self {
        BatchSizes(histogram(&[1.0, 2.0, 4.0, 8.0, 16.0, 32.0]))
    }
}

impl Default for QueueWait {
    fn default() -> Self {
        QueueWait(histogram(&[
            0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
        ]))
    }
}

impl FrontStats {
    pub fn direct(&self, why: Direct) {
        match why {
            Direct::Unparsed => &self.direct_unparsed,
            Direct::Overflow => &self.direct_overflow,
            Direct::Unshared => &self.direct_unshared,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    pub fn batch_closed(&self, members: usize) {
        self.batch_size.0.observe(members as f64);
    }

    pub fn write(&self, scrape: &mut Scrape<'_>) {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed) as f64;
        scrape.labelled_counter(
            "cohort_front_requests_total",
            "Requests the batch front sent, by role: leader (opened a batch), follower (joined one), direct (not batched).",
            "role",
            &[
                ("leader".into(), n(&self.leaders)),
                ("follower".into(), n(&self.followers)),
                (
                    "direct".into(),
                    n(&self.direct_unparsed) + n(&self.direct_overflow) + n(&self.direct_unshared),
                ),
            ],
        );
        scrape.labelled_counter(
            "cohort_front_direct_total",
            "Requests sent on without batching, by reason (unparsed body; overflow: hold queue full; unshared: too little prompt in common with its batch's leader).",
            "reason",
            &[
                ("unparsed".into(), n(&self.direct_unparsed)),
                ("overflow".into(), n(&self.direct_overflow)),
                ("unshared".into(), n(&self.direct_unshared)),
            ],
        );
        scrape.counter(
            "cohort_front_failovers_total",
            "Requests sent to another replica because theirs was unreachable.",
            self.failovers.load(Ordering::Relaxed),
        );
        scrape.counter(
            "cohort_front_unreachable_total",
            "Requests answered 502 because no engine replica was reachable.",
            self.unreachable.load(Ordering::Relaxed),
        );
        scrape.counter(
            "cohort_front_cancelled_total",
            "Callers that went away before their response ended (their engine request was cancelled).",
            self.cancelled.load(Ordering::Relaxed),
        );
        scrape.histogram(
            "cohort_batch_size",
            "Members per closed batch (leader included).",
            &self.batch_size.0,
        );
        scrape.histogram(
            "cohort_queue_wait_seconds",
            "Time a follower was held for its leader's prefix.",
            &self.queue_wait.0,
        );
        scrape.counter(
            "cohort_lora_loads_total",
            "LoRA adapters loaded on engine replicas.",
            self.lora_loads.load(Ordering::Relaxed),
        );
        scrape.counter(
            "cohort_lora_load_errors_total",
            "LoRA adapter loads that failed (the request went on; the engine answers it).",
            self.lora_load_errors.load(Ordering::Relaxed),
        );
    }
}
