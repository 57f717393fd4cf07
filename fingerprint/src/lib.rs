//! # cohort-fingerprint — the pure core of Cohort
//!
//! Turns one LLM API request body into the identities Cohort routes and batches on:
//!
//! 1. [`api`] parses OpenAI chat/completions/responses and Anthropic messages bodies into a
//!    [`canonical`] prompt (model, system, tools, turns in order);
//! 2. [`prefix`] hashes fixed-size blocks of it into a chain (like an engine's KV blocks)
//!    and hashes the stable prefix (model + system + tools);
//! 3. the intent text (the last user turn, or `x-original-query`) is [`normalize`]d,
//!    [`mask`]ed and [`sketch`]ed into 32 int8 dimensions (version 2: the masked words'
//!    [`wordpiece`] pieces summed over a table distilled from all-MiniLM-L6-v2, embedded
//!    in the crate; docs/SKETCH.md);
//! 4. [`key`] derives the routing key from the tenant salt, the anchor (stable prefix or
//!    cohort) and the app's key.
//!
//! [`learned`] cohorts group a tenant's bare prompts by the traffic seen, where the
//! filter keeps a table of them. [`knobs`] parses the client's header knobs. [`record`] is the JSONL line format of
//! `cohort fingerprint` and of the wasm build.
//!
//! No I/O, no global state, no panics on any input: failures are [`FingerprintError`]s.
//! Everything is integer arithmetic or IEEE-exact, so native and wasm32 builds produce the
//! same bytes.

pub mod api;
#[cfg(feature = "banking77")]
pub mod banking77;
mod bert_unicode;
pub mod canonical;
pub mod error;
pub mod headers;
pub mod json;
pub mod key;
pub mod knobs;
pub mod learned;
pub mod mask;
pub mod normalize;
pub mod prefix;
pub mod record;
pub mod shard;
pub mod sketch;
#[cfg(test)]
mod test_text;
pub mod word;
pub mod wordpiece;

pub use canonical::{Api, CanonicalPrompt, Extent};
pub use error::FingerprintError;
pub use key::{Anchor, RoutingKey, TenantSalt};
pub use knobs::{Knobs, ParsedKnobs, RawKnobs};
pub use mask::Token;
pub use sketch::codebook::{Codebook, CODEBOOK_VERSION};
pub use sketch::{SemanticMode, Sketch, SKETCH_DIMS, SKETCH_VERSION};

/// Default largest body the core parses (the filter's own buffer limit is lower).
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// One request as the core sees it: the body plus what the headers said.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub body: &'a [u8],
    /// HTTP path, when known; decides the API shape.
    pub path: Option<&'a str>,
    /// `x-original-query`: the user's words when a front end wrapped them in a template.
    pub original_query: Option<&'a str>,
    /// `x-cohort-routing-key`: mixed into the routing key.
    pub app_routing_key: Option<&'a str>,
    pub salt: TenantSalt,
    pub semantic_mode: SemanticMode,
    pub max_body_bytes: usize,
    /// Compute the prefix block chain ([`Fingerprint::prefix_blocks`]). Off, the
    /// conversation is not written or hashed: the blocks come back empty and
    /// `prompt_bytes` 0, and everything else is the same.
    pub block_hashes: bool,
    /// `x-cohort-batch-threshold` (0.1–0.9): which codebook level the cohort id comes
    /// from, coarse to fine ([`sketch::codebook`]).
    pub batch_threshold: f32,
}

impl<'a> Request<'a> {
    /// A request with only a body; everything else at its default.
    pub fn new(body: &'a [u8]) -> Self {
        Request {
            body,
            path: None,
            original_query: None,
            app_routing_key: None,
            salt: TenantSalt::default(),
            semantic_mode: SemanticMode::default(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            block_hashes: true,
            batch_threshold: knobs::Knobs::default().batch_threshold,
        }
    }
}

/// Seeds the hash of a text's anchor words.
const ANCHOR_SEED: u64 = 0x616e_6368_6f72_7331;
/// Mixed into the cohort code of a topic-mode and a hybrid-mode sketch (even numbers).
const TOPIC_SEED: u64 = 0x746f_7069_635f_6d64 & !1;
const HYBRID_SEED: u64 = 0x6879_6272_6964_6d64 & !1;

/// The semantic part of a fingerprint: masked tokens, their sketch, and the text's anchors.
#[derive(Debug, Clone, PartialEq)]
pub struct IntentSketch {
    pub tokens: Vec<Token>,
    pub sketch: Sketch,
    /// Hash of the words of the text's anchors (`【…】`, [`mask`]), 0 when it has none.
    pub anchor: u64,
    /// What the sketch weighs: cohorts of different modes are kept apart.
    pub mode: SemanticMode,
}

impl IntentSketch {
    /// Normalises, masks and sketches `text`.
    pub fn of_text(text: &str, mode: SemanticMode) -> IntentSketch {
        let (tokens, anchors) = mask::tokenize_anchored(&normalize::normalize(text));
        let sketch = Sketch::from_tokens(&tokens, mode);
        let anchor = if anchors.is_empty() {
            0
        } else {
            let mut words = String::new();
            for word in &anchors {
                words.push_str(word.as_str());
                words.push('\u{1f}');
            }
            xxhash_rust::xxh3::xxh3_64_with_seed(words.as_bytes(), ANCHOR_SEED) | 1
        };
        IntentSketch {
            tokens,
            sketch,
            anchor,
            mode,
        }
    }

    /// The masked tokens joined by spaces, for humans and logs.
    pub fn masked_text(&self) -> String {
        let parts: Vec<_> = self.tokens.iter().map(Token::as_text).collect();
        parts.join(" ")
    }

    /// The cohort code under a batch threshold: the nearest centroid of the shipped
    /// codebook at the level the threshold picks ([`sketch::codebook`]); the routing key's
    /// cohort anchor. Not salted; the cohort id shown to anyone is [`TenantSalt::cohort`]
    /// of it ([`Fingerprint::cohort`]).
    ///
    /// A text with anchors gets the code of its centroid *and* its anchor words: requests
    /// that differ only in an anchored value ("recommend 【Electronics】" and "recommend
    /// 【Books】") get different cohorts. Such codes have the top bit set; codebook codes
    /// never do.
    ///
    /// A sketch of another semantic mode than `intent` (the default) gets its centroid's
    /// code mixed with the mode the same way, so a topic cohort and an intent cohort that
    /// fall into one cell stay apart (the codebook's cells are one partition of sketch
    /// space, whatever a sketch weighs).
    pub fn cohort(&self, batch_threshold: f32) -> u32 {
        let code = Codebook::embedded().code(batch_threshold, &self.sketch);
        let mode_seed = match self.mode {
            SemanticMode::Intent => 0,
            SemanticMode::Topic => TOPIC_SEED,
            SemanticMode::Hybrid => HYBRID_SEED,
        };
        if self.anchor == 0 && (mode_seed == 0 || code == sketch::codebook::NO_INTENT) {
            return code;
        }
        // An anchor hash is odd and the mode seeds are even: the seed is never 0, and an
        // intent-mode text's seed is its anchor hash alone, as before modes were mixed in.
        let seed = self.anchor ^ mode_seed;
        let mixed = xxhash_rust::xxh3::xxh3_64_with_seed(&code.to_le_bytes(), seed) as u32;
        let anchored = mixed | 1 << 31;
        if anchored == sketch::codebook::NO_INTENT {
            anchored - 1
        } else {
            anchored
        }
    }
}

/// Everything Cohort knows about one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Fingerprint {
    pub api: Api,
    pub model: String,
    /// Hash of model + system + tools.
    pub stable_prefix: u64,
    /// True when the request has a system prompt or tools.
    pub has_stable_context: bool,
    /// Chained hashes of [`prefix::BLOCK_BYTES`] blocks of the canonical prompt (empty
    /// when [`Request::block_hashes`] is off).
    pub prefix_blocks: Vec<u64>,
    /// Length of the canonical prompt in bytes (0 when [`Request::block_hashes`] is off).
    pub prompt_bytes: usize,
    pub intent: IntentSketch,
    pub semantic_mode: SemanticMode,
    pub anchor: Anchor,
    pub routing_key: RoutingKey,
    /// The cohort id (`x-cohort-cluster`): the cohort code ([`IntentSketch::cohort`])
    /// salted per tenant ([`TenantSalt::cohort`]).
    pub cohort: u32,
}

impl Fingerprint {
    /// Takes a cohort code chosen after fingerprinting ([`learned`] cohorts): the cohort id
    /// becomes the tenant's id of `code`, and a request without a system prompt or tools is
    /// anchored on it, as on its codebook code before. `salt` and `app_routing_key` must be
    /// the request's ([`Request`]).
    pub fn regroup(&mut self, code: u32, salt: TenantSalt, app_routing_key: Option<&str>) {
        self.cohort = salt.cohort(code);
        if let Anchor::Cohort(_) = self.anchor {
            self.anchor = Anchor::Cohort(code);
            self.routing_key = RoutingKey::new(salt, self.anchor, app_routing_key);
        }
    }
}

/// Fingerprints one request.
pub fn fingerprint(request: &Request<'_>) -> Result<Fingerprint, FingerprintError> {
    fingerprint_with(request, IntentSketch::of_text)
}

/// [`fingerprint`] with the intent step supplied by the caller, who must hand back
/// `IntentSketch::of_text(text, mode)`: the filter wraps it in a clock to time the sketch
/// step (normalise, mask, sketch) apart from the rest.
pub fn fingerprint_with(
    request: &Request<'_>,
    intent_sketch: impl FnOnce(&str, SemanticMode) -> IntentSketch,
) -> Result<Fingerprint, FingerprintError> {
    if request.body.len() > request.max_body_bytes {
        return Err(FingerprintError::BodyTooLarge {
            size: request.body.len(),
            limit: request.max_body_bytes,
        });
    }
    let extent = if request.block_hashes {
        Extent::Whole
    } else {
        Extent::StablePrefix
    };
    let prompt = api::parse_request_to(request.body, request.path, extent)?;
    let salt = request.salt.0;
    let stable_prefix = prefix::stable_prefix_hash(prompt.stable_prefix(), salt);
    let (prefix_blocks, prompt_bytes) = match extent {
        Extent::Whole => (
            prefix::block_hashes(prompt.bytes(), salt),
            prompt.bytes().len(),
        ),
        Extent::StablePrefix => (Vec::new(), 0),
    };
    let intent_text = request
        .original_query
        .or(prompt.last_user_text())
        .unwrap_or("");
    let intent = intent_sketch(intent_text, request.semantic_mode);
    let cohort = intent.cohort(request.batch_threshold);
    let anchor = if prompt.has_stable_context() {
        Anchor::StablePrefix(stable_prefix)
    } else {
        Anchor::Cohort(cohort)
    };
    Ok(Fingerprint {
        api: prompt.api,
        stable_prefix,
        has_stable_context: prompt.has_stable_context(),
        prefix_blocks,
        prompt_bytes,
        routing_key: RoutingKey::new(request.salt, anchor, request.app_routing_key),
        cohort: request.salt.cohort(cohort),
        anchor,
        intent,
        semantic_mode: request.semantic_mode,
        model: prompt.model,
    })
}
