//! The `cohort.v1` gRPC contract between the filter and the batcher, generated from
//! `proto/cohort.proto` (read it for what each field means).
//!
//! The filter (wasm32) uses the prost messages and frames them itself through proxy-wasm's
//! gRPC calls; the batcher enables the `grpc` feature for tonic's server and client.

#[allow(clippy::all, missing_docs)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/cohort.v1.rs"));
}

pub use generated::*;
pub use prost::Message;

/// The gRPC service name, as proxy-wasm's `dispatch_grpc_call` wants it.
pub const SERVICE: &str = "cohort.v1.Batcher";
/// Method names of [`SERVICE`].
pub const METHOD_ASSIGN: &str = "Assign";
pub const METHOD_OBSERVE: &str = "Observe";
pub const METHOD_STATUS: &str = "Status";

/// Largest request body the filter sends as a warm-up exemplar (`Observation.exemplar`);
/// the batcher ignores larger ones. A batch of 256 observations with exemplars then stays
/// within the batcher's message limit (32 MiB).
pub const EXEMPLAR_MAX_BYTES: usize = 64 * 1024;

/// Whether `value` is a plain name, safe in a header and a route match: 1–64 of
/// `[A-Za-z0-9._-]`. Replica names (`x-cohort-shard`) and cohort ids must be plain; the
/// batcher refuses other replica names at start-up and the filter refuses replies with them.
pub fn is_plain_name(value: &str) -> bool {
    (1..=64).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}
