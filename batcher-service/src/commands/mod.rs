//! One module per `cohort` subcommand.

pub mod fingerprint;
pub mod serve;
