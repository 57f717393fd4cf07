//! Batch-friendliness: how much of a prompt workload a prefix cache and co-batching can
//! exploit, measured before deploying anything (`cohort score`, `cohort lint`).
//!
//! - [`corpus`]: a set of real prompts (request logs). Prefix reuse is measured with the
//!   same block hashes the filter sends (an infinite cache: the share of prompt blocks an
//!   earlier prompt already computed) and cohort concentration with the same sketches
//!   (the share of prompts that join an existing same-intent cohort).
//! - [`template`]: a prompt template before it is used. What an engine can reuse is the
//!   static text before the first variable, in whole cache blocks; the template's
//!   *prefix entropy* is the information that shared prefix carries (a template whose
//!   shared part is `"Q: "` carries almost none).
//!
//! - [`cost`]: the effective-cost model (cost per prompt token after the cache's saving
//!   and the misses' penalty), shared with `cohort serve`'s per-tenant metric.
//!
//! Both scores are in 0–1; the commands fail below a threshold (default 0.3) so a CI job
//! can keep cache-hostile templates out.

pub mod corpus;
pub mod cost;
pub mod template;

/// The default score below which `cohort score` and `cohort lint` exit non-zero.
pub const DEFAULT_MIN_SCORE: f64 = 0.3;
