//! One module per `cohort` subcommand.

pub mod fingerprint;
