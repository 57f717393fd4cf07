//! `cohort`: the Cohort batcher service and its command-line tools.
//!
//! - `cohort serve`: the batcher (gRPC Assign/Observe/Status, /metrics, /healthz, /readyz,
//!   and batch mode's HTTP front when replicas have URLs);
//! - `cohort fingerprint`: the fingerprint core over JSONL request logs.

mod commands;
mod front;
mod serve;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cohort",
    version,
    about = "Cohort: semantic request shaping for LLM traffic"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the batcher service.
    Serve(serve::config::ServeArgs),
    /// Fingerprint request bodies from JSONL (a file or stdin) and write JSONL records.
    Fingerprint(commands::fingerprint::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Serve(args) => commands::serve::run(args),
        Command::Fingerprint(args) => commands::fingerprint::run(args),
    }
}
