//! # cohort-fuzz-targets — every fuzz target of Cohort, once, as a plain function
//!
//! Each target takes arbitrary bytes and checks invariants of one input surface, not only
//! "no panic": determinism, value ranges, that headers the filter would write are visible
//! ASCII, that normalisation is idempotent, that what a parser accepts reads back the same.
//! A violated invariant panics. Two drivers call these functions:
//!
//! - the libFuzzer bins in `fuzz/fuzz_targets/` (`scripts/fuzz SECONDS`, nightly and
//!   cargo-fuzz), for long coverage-guided runs;
//! - `tests/replay.rs` on stable Rust (`cargo test -p cohort-fuzz-targets`, part of the
//!   workspace test): it replays the committed seeds (`fuzz/corpus/<target>/`) and every
//!   crash ever found (`fuzz/regressions/<target>/`), then runs the seeded mutator of
//!   [`mutate`] for a few seconds per target.
//!
//! | target | surface |
//! |---|---|
//! | [`body`] | a request body on every API path and mode, through the core and the filter's decisions |
//! | [`line`] | a `cohort fingerprint` input line (body, text line, envelope with header knobs) |
//! | [`normalize`] | intent-text normalisation and masking |
//! | [`sketch`] | sketch versions 1 and 2 in every mode, WordPiece, the table format |
//! | [`knobs`] | knob headers: arbitrary names, non-UTF-8, NaN/inf/huge values |
//! | [`assign_reply`] | the batcher's `AssignReply` protobuf as the filter decodes it |
//! | [`filter_config`] | the filter's plugin configuration JSON |
//! | [`response_usage`] | the end of an engine's response, as the filter reads its cached tokens |
//! | [`kv_events`] | a payload of vLLM's KV events stream, decoded and applied, and a stream of them through one replica's sequencing |
//! | [`prompt_tokens`] | a request body rendered, tokenized and keyed in the engine's blocks, by engine-sim's tokenizer and a model's (the shipped Gemma chat template) |

pub mod assign_reply;
pub mod body;
mod check;
pub mod filter_config;
pub mod knobs;
pub mod kv_events;
pub mod line;
pub mod mutate;
pub mod normalize;
pub mod prompt_tokens;
pub mod response_usage;
pub mod sketch;

/// One fuzz target: its name (the directory of its seeds) and its function.
#[derive(Clone, Copy)]
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]),
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "body",
        run: body::body,
    },
    Target {
        name: "line",
        run: line::line,
    },
    Target {
        name: "normalize",
        run: normalize::normalize,
    },
    Target {
        name: "sketch",
        run: sketch::sketch,
    },
    Target {
        name: "knobs",
        run: knobs::knobs,
    },
    Target {
        name: "assign_reply",
        run: assign_reply::assign_reply,
    },
    Target {
        name: "filter_config",
        run: filter_config::filter_config,
    },
    Target {
        name: "response_usage",
        run: response_usage::response_usage,
    },
    Target {
        name: "kv_events",
        run: kv_events::kv_events,
    },
    Target {
        name: "prompt_tokens",
        run: prompt_tokens::prompt_tokens,
    },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().copied().find(|t| t.name == name)
}
