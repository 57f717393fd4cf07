//! What `cohort score` and `cohort lint` share: expanding file arguments and globs, the
//! output format, the exit rule, and a progress bar for long runs.

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use cohort_score::corpus::DEFAULT_BLOCK_BYTES;
use cohort_score::DEFAULT_MIN_SCORE;
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
}

/// The options `score` and `lint` share.
#[derive(clap::Args)]
pub struct ScoreOptions {
    /// Engine cache block, bytes (64 ≈ 16 tokens).
    #[arg(long, default_value_t = DEFAULT_BLOCK_BYTES)]
    pub block_bytes: usize,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Exit 1 when anything scores below this.
    #[arg(long, default_value_t = DEFAULT_MIN_SCORE)]
    pub min_score: f64,
}

/// The files named by `args`: plain paths as given, glob patterns (`*`, `?`, `[`)
/// expanded in sorted order. A pattern matching nothing is an error.
pub fn expand(args: &[String]) -> Result<Vec<(String, PathBuf)>> {
    let mut files = Vec::new();
    for arg in args {
        if arg.contains(['*', '?', '[']) {
            let mut matched: Vec<PathBuf> = glob::glob(arg)
                .with_context(|| format!("bad glob {arg:?}"))?
                .filter_map(Result::ok)
                .filter(|p| p.is_file())
                .collect();
            matched.sort();
            if matched.is_empty() {
                bail!("{arg:?} matches no file");
            }
            files.extend(matched.into_iter().map(|p| (arg.clone(), p)));
        } else {
            files.push((arg.clone(), PathBuf::from(arg)));
        }
    }
    if files.is_empty() {
        bail!("no input files");
    }
    Ok(files)
}

/// A progress bar on stderr, drawn only when stderr is a terminal and the run is long.
pub struct Progress {
    total: usize,
    done: usize,
    drawn: bool,
}

impl Progress {
    const LONG_RUN: usize = 500;

    pub fn new(total: usize) -> Progress {
        Progress {
            total,
            done: 0,
            drawn: total >= Self::LONG_RUN && std::io::stderr().is_terminal(),
        }
    }

    pub fn tick(&mut self) {
        self.done += 1;
        if self.drawn && (self.done % 64 == 0 || self.done == self.total) {
            let width = 30;
            let filled = width * self.done / self.total.max(1);
            eprint!(
                "\r[{}{}] {}/{}",
                "#".repeat(filled),
                " ".repeat(width - filled),
                self.done,
                self.total
            );
            if self.done == self.total {
                eprintln!();
            }
        }
    }
}

/// Exit status for a run: failure when any score is below `min`.
pub fn verdict(scores: impl IntoIterator<Item = f64>, min: f64) -> std::process::ExitCode {
    if scores.into_iter().any(|s| s < min) {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    }
}
