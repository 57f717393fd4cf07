//! `cohort fingerprint`: the fingerprint core over JSONL, for users' own logs.
//!
//! Reads lines (request bodies, `{"text": …}` lines or `{"body": …, "headers": …}`
//! envelopes; see `cohort_fingerprint::record`) from a file or stdin and writes one JSON
//! record per line to stdout. `--format table` prints instead a summary a person can read:
//! the routing keys the lines fell into, with their sizes and an example each. Blank lines
//! are skipped; a line that cannot be fingerprinted yields a record with its bypass reason.

use anyhow::{Context, Result};
use clap::ValueEnum;
use cohort_fingerprint::record::{fingerprint_line, LineDefaults, Record};
use cohort_fingerprint::SemanticMode;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// JSONL input; `-` or absent reads stdin.
    input: Option<PathBuf>,
    /// Semantic mode for lines that do not set one.
    #[arg(long, value_enum, default_value_t = Mode::Intent)]
    semantic_mode: Mode,
    /// Tenant for lines that do not set one (salts every hash).
    #[arg(long)]
    tenant: Option<String>,
    /// Deployment secret mixed into tenant salts (as in the filter's config).
    #[arg(
        long,
        env = "COHORT_SALT_SECRET",
        default_value = "",
        hide_env_values = true
    )]
    salt_secret: String,
    /// Largest body fingerprinted, in bytes.
    #[arg(long, default_value_t = cohort_fingerprint::DEFAULT_MAX_BODY_BYTES)]
    max_body_bytes: usize,
    /// Output: one JSON record per line, or a summary table.
    #[arg(long, value_enum, default_value_t = Format::Jsonl)]
    format: Format,
}

#[derive(Clone, Copy, ValueEnum)]
enum Mode {
    Intent,
    Topic,
    Hybrid,
}

impl From<Mode> for SemanticMode {
    fn from(mode: Mode) -> Self {
        match mode {
            Mode::Intent => SemanticMode::Intent,
            Mode::Topic => SemanticMode::Topic,
            Mode::Hybrid => SemanticMode::Hybrid,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Jsonl,
    Table,
}

pub fn run(args: Args) -> Result<()> {
    let reader: Box<dyn BufRead> = match &args.input {
        Some(path) if path.as_os_str() != "-" => Box::new(BufReader::new(
            File::open(path).with_context(|| format!("opening {}", path.display()))?,
        )),
        _ => Box::new(io::stdin().lock()),
    };
    let defaults = LineDefaults {
        salt_secret: args.salt_secret.into_bytes(),
        tenant: args.tenant,
        semantic_mode: args.semantic_mode.into(),
        max_body_bytes: Some(args.max_body_bytes),
    };
    let mut out = BufWriter::new(io::stdout().lock());
    let mut summary = Summary::default();
    for (index, line) in reader.split(b'\n').enumerate() {
        let line = line.context("reading input")?;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let record = fingerprint_line(&line, index + 1, &defaults);
        match args.format {
            Format::Jsonl => {
                serde_json::to_writer(&mut out, &record)?;
                out.write_all(b"\n")?;
            }
            Format::Table => summary.add(&record),
        }
    }
    if args.format == Format::Table {
        summary.print(&mut out)?;
    }
    out.flush().context("writing output")
}

/// Routing keys and their lines, for `--format table`.
#[derive(Default)]
struct Summary {
    keys: BTreeMap<String, KeyGroup>,
    bypass: BTreeMap<&'static str, usize>,
    lines: usize,
}

struct KeyGroup {
    first_line: usize,
    count: usize,
    cohorts: std::collections::BTreeSet<String>,
    anchor: &'static str,
    example: String,
}

impl Summary {
    fn add(&mut self, record: &Record) {
        self.lines += 1;
        if let Some(reason) = record.bypass {
            *self.bypass.entry(reason).or_default() += 1;
            return;
        }
        let key = record.routing_key.clone().unwrap_or_default();
        let group = self.keys.entry(key).or_insert_with(|| KeyGroup {
            first_line: record.line,
            count: 0,
            cohorts: Default::default(),
            anchor: record.anchor.unwrap_or(""),
            example: record.intent_text.clone().unwrap_or_default(),
        });
        group.count += 1;
        group.cohorts.extend(record.cohort.clone());
    }

    fn print(&self, out: &mut impl Write) -> Result<()> {
        let mut groups: Vec<_> = self.keys.iter().collect();
        groups.sort_by_key(|(_, g)| (std::cmp::Reverse(g.count), g.first_line));
        writeln!(
            out,
            "{} lines, {} routing keys",
            self.lines,
            self.keys.len()
        )?;
        writeln!(
            out,
            "{:<16}  {:>5}  {:>7}  {:<13}  example intent (masked)",
            "routing key", "lines", "cohorts", "anchor"
        )?;
        for (key, group) in groups {
            let example: String = group.example.chars().take(60).collect();
            writeln!(
                out,
                "{key:<16}  {:>5}  {:>7}  {:<13}  {example}",
                group.count,
                group.cohorts.len(),
                group.anchor
            )?;
        }
        for (reason, count) in &self.bypass {
            writeln!(out, "{:<16}  {count:>5}  {:>7}  bypass: {reason}", "-", "-")?;
        }
        Ok(())
    }
}
