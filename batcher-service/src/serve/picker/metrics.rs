//! The picker's part of `/metrics` (names in docs/METRICS.md): requests by outcome, bypasses
//! by reason, decision time, open ext_proc streams, and responses served by another
//! endpoint than the one picked.

use crate::metrics::{decision_seconds, Histogram, Scrape};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

/// How the picker answered a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Decided by the brain on the request's fingerprint.
    Picked,
    /// Routed without a fingerprint (or with the deadline's fallback); see the reasons.
    Bypassed,
    /// No eligible endpoint is ready: a 503.
    Unavailable,
    /// The subset hint named no eligible endpoint: a 503.
    SubsetEmpty,
}

impl Outcome {
    pub const ALL: [Outcome; 4] = [
        Outcome::Picked,
        Outcome::Bypassed,
        Outcome::Unavailable,
        Outcome::SubsetEmpty,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Picked => "picked",
            Outcome::Bypassed => "bypassed",
            Outcome::Unavailable => "unavailable",
            Outcome::SubsetEmpty => "subset_empty",
        }
    }
}

/// The picker's counters.
pub struct PickerMetrics {
    outcomes: [AtomicU64; Outcome::ALL.len()],
    bypasses: Mutex<BTreeMap<&'static str, u64>>,
    decision_seconds: Histogram,
    streams_open: AtomicI64,
    reattributed: AtomicU64,
    /// Per [`PromptTokens`] outcome: prompts turned into the engine's block keys.
    prompt_tokens: [AtomicU64; PromptTokens::ALL.len()],
}

/// What became of a request's prompt on its way to the engine's token ids
/// (`[kv_events] prompt_tokens`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptTokens {
    /// Rendered and tokenized: the decision can ask the engines what they hold.
    Keyed,
    /// An API the engines' templates do not cover (Responses, Anthropic Messages).
    OtherApi,
    /// The body, the template or the tokenizer refused it.
    Failed,
}

impl PromptTokens {
    pub const ALL: [PromptTokens; 3] = [Self::Keyed, Self::OtherApi, Self::Failed];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Keyed => "keyed",
            Self::OtherApi => "other_api",
            Self::Failed => "failed",
        }
    }
}

impl Default for PickerMetrics {
    fn default() -> Self {
        PickerMetrics {
            outcomes: Default::default(),
            bypasses: Mutex::new(BTreeMap::new()),
            decision_seconds: decision_seconds(),
            streams_open: AtomicI64::new(0),
            reattributed: AtomicU64::new(0),
            prompt_tokens: Default::default(),
        }
    }
}

impl PickerMetrics {
    pub fn outcome(&self, outcome: Outcome) {
        self.outcomes[outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn bypass(&self, reason: &'static str) {
        let mut bypasses = self
            .bypasses
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *bypasses.entry(reason).or_insert(0) += 1;
    }

    pub fn decided(&self, seconds: f64) {
        self.decision_seconds.observe(seconds);
    }

    pub fn stream_opened(&self) {
        self.streams_open.fetch_add(1, Ordering::Relaxed);
    }

    pub fn stream_closed(&self) {
        self.streams_open.fetch_sub(1, Ordering::Relaxed);
    }

    /// Streams open now.
    pub fn streams_open(&self) -> i64 {
        self.streams_open.load(Ordering::Relaxed)
    }

    pub fn reattributed(&self) {
        self.reattributed.fetch_add(1, Ordering::Relaxed);
    }

    pub fn prompt_tokens(&self, outcome: PromptTokens) {
        self.prompt_tokens[outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn write_metrics(&self, scrape: &mut Scrape<'_>) {
        scrape.labelled_counter(
            "cohort_picker_requests_total",
            "Requests the endpoint picker answered, by outcome: picked (the brain decided on \
             the fingerprint), bypassed (no fingerprint, or the deadline passed), unavailable \
             and subset_empty (503).",
            "outcome",
            &Outcome::ALL
                .iter()
                .map(|o| {
                    let n = self.outcomes[*o as usize].load(Ordering::Relaxed);
                    (o.as_str().to_owned(), n as f64)
                })
                .collect::<Vec<_>>(),
        );
        let bypasses: Vec<(String, f64)> = self
            .bypasses
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .iter()
            .map(|(r, n)| (r.to_string(), *n as f64))
            .collect();
        scrape.labelled_counter(
            "cohort_picker_bypass_total",
            "Requests the endpoint picker routed without a fingerprint decision, by reason \
             (the x-cohort-bypass value).",
            "reason",
            &bypasses,
        );
        scrape.labelled_counter(
            "cohort_picker_prompt_tokens_total",
            "Prompts the picker turned into the engine's token blocks for the KV events \
             residency ([kv_events] prompt_tokens), by outcome: keyed, other_api (an API \
             without a chat template: Responses, Anthropic Messages), failed (the body, \
             template or tokenizer refused it).",
            "outcome",
            &PromptTokens::ALL
                .iter()
                .map(|o| {
                    let n = self.prompt_tokens[*o as usize].load(Ordering::Relaxed);
                    (o.as_str().to_owned(), n as f64)
                })
                .collect::<Vec<_>>(),
        );
        scrape.histogram(
            "cohort_picker_decision_seconds",
            "Time from the end of the request body (or the headers) to the picker's answer.",
            &self.decision_seconds,
        );
        scrape.count_gauge(
            "cohort_picker_streams_open",
            "ext_proc streams open (one per HTTP request in Envoy).",
            u64::try_from(self.streams_open()).unwrap_or(0),
        );
        scrape.counter(
            "cohort_picker_reattributed_total",
            "Responses served by another endpoint than the one picked (Envoy went down the \
             fallback list); their load moved to the endpoint that served them.",
            self.reattributed.load(Ordering::Relaxed),
        );
    }
}
