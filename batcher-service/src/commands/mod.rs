//! One module per `cohort` subcommand (and `inputs`, what `score` and `lint` share).

pub mod audit;
pub mod bench_decisions;
pub mod engine_sim;
pub mod fingerprint;
mod inputs;
pub mod lint;
pub mod report;
pub mod score;
pub mod serve;
