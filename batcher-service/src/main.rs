//! `cohort`: the Cohort batcher service and its command-line tools.
//!
//! Today it has one subcommand, `cohort fingerprint`, which runs the fingerprint core over
//! JSONL request logs. The batcher (`cohort serve`) joins it in the batcher issue.

mod commands;

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
    /// Fingerprint request bodies from JSONL (a file or stdin) and write JSONL records.
    Fingerprint(commands::fingerprint::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Fingerprint(args) => commands::fingerprint::run(args),
    }
}
