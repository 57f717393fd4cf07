//! `cohort`: the Cohort batcher service and its command-line tools.
//!
//! - `cohort serve`: the batcher (gRPC Assign/Observe/Status, /metrics, /healthz, /readyz,
//!   and batch mode's HTTP front when replicas have URLs);
//! - `cohort fingerprint`: the fingerprint core over JSONL request logs;
//! - `cohort score`: batch-friendliness (0–1) of prompt corpora;
//! - `cohort lint`: cache-hostile prompt templates, scored 0–1;
//! - `cohort engine-sim`: an OpenAI-compatible engine simulator (`serve`, `bound`);
//! - `cohort audit`: one request's cost record from a running batcher;
//! - `cohort bench-decisions`: the decision path's benchmark (Assign in to reply out);
//! - `cohort report`: Cohort against its hold-out, from Prometheus, with confidence intervals.

mod audit;
mod clock;
mod commands;
mod config;
mod discovery;
mod fleet;
mod front;
mod kv_events;
mod metrics;
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
    Serve(Box<config::ServeArgs>),
    /// Fingerprint request bodies from JSONL (a file or stdin) and write JSONL records.
    Fingerprint(commands::fingerprint::Args),
    /// Score how batch-friendly prompt corpora are (0-1); exit 1 below --min-score.
    Score(commands::score::Args),
    /// Lint prompt templates for prefix-cache hostility; exit 1 below --min-score.
    Lint(commands::lint::Args),
    /// OpenAI-compatible LLM engine simulator for benchmarks at scale (serve, bound).
    EngineSim(commands::engine_sim::Args),
    /// Print what the layer did with one request and what it cost (from a running batcher).
    Audit(commands::audit::Args),
    /// Benchmark the decision path (Assign in to reply out) over stores of 10 k to 5 M fingerprints.
    BenchDecisions(commands::bench_decisions::Args),
    /// Compare Cohort against its hold-out from Prometheus: TTFT, cached tokens, 5xx, with 95% intervals.
    Report(commands::report::Args),
}

fn main() -> anyhow::Result<std::process::ExitCode> {
    let ok = |r: anyhow::Result<()>| r.map(|()| std::process::ExitCode::SUCCESS);
    match Cli::parse().command {
        Command::Serve(args) => ok(commands::serve::run(*args)),
        Command::Fingerprint(args) => ok(commands::fingerprint::run(args)),
        Command::Score(args) => commands::score::run(args),
        Command::Lint(args) => commands::lint::run(args),
        Command::EngineSim(args) => ok(commands::engine_sim::run(args)),
        Command::Audit(args) => commands::audit::run(args),
        Command::BenchDecisions(args) => ok(commands::bench_decisions::run(args)),
        Command::Report(args) => ok(commands::report::run(args)),
    }
}
